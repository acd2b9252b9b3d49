package wal

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"testing"
	"time"
)

func TestAppendReadRoundTrip(t *testing.T) {
	for _, tail := range []int{0, 3} { // default ring, and a ring too small to serve most reads
		t.Run(fmt.Sprintf("tail=%d", tail), func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{TailRecords: tail, SegmentSize: 1024}
			l, _ := testLog(t, dir, opts)
			const n = 60
			want := make([]*Record, n)
			for i := range n {
				want[i] = rec(i)
				if i == 5 {
					want[i] = &Record{} // empty key and value, no headers
				}
				if i == 6 {
					want[i].Value = make([]byte, 3000) // larger than a segment
				}
				off, err := l.Append(context.Background(), want[i])
				if err != nil {
					t.Fatalf("Append %d: %v", i, err)
				}
				if off != uint64(i) {
					t.Fatalf("Append %d got offset %d", i, off)
				}
			}
			check := func(l *Log) {
				t.Helper()
				got := readAll(t, l, 0)
				if len(got) != n {
					t.Fatalf("read %d records, want %d", len(got), n)
				}
				var last int64
				for i, r := range got {
					if err := sameRecord(r, want[i]); err != nil {
						t.Fatalf("offset %d: %v", i, err)
					}
					if r.Timestamp == 0 || r.Timestamp < last {
						t.Fatalf("offset %d: timestamp %d after %d", i, r.Timestamp, last)
					}
					last = r.Timestamp
				}
			}
			check(l)
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			l2, _ := testLog(t, dir, opts)
			if l2.FirstOffset() != 0 || l2.NextOffset() != n {
				t.Fatalf("after reopen first %d next %d, want 0 %d", l2.FirstOffset(), l2.NextOffset(), n)
			}
			check(l2)
			off, err := l2.Append(context.Background(), rec(1))
			if err != nil || off != n {
				t.Fatalf("Append after reopen = %d, %v; want %d", off, err, n)
			}
		})
	}
}

func TestReadLimitsAndBounds(t *testing.T) {
	for _, tail := range []int{0, 1} {
		t.Run(fmt.Sprintf("tail=%d", tail), func(t *testing.T) {
			l, _ := testLog(t, t.TempDir(), Options{TailRecords: tail})
			recs, err := l.Read(0, 10, 0)
			if err != nil || len(recs) != 0 {
				t.Fatalf("Read on empty log = %v, %v", recs, err)
			}
			for i := range 10 {
				if _, err := l.Append(context.Background(), &Record{Value: make([]byte, 100)}); err != nil {
					t.Fatal(err)
				}
				_ = i
			}
			if recs, err := l.Read(2, 5, 0); err != nil || len(recs) != 5 || recs[0].Offset != 2 {
				t.Fatalf("Read(2, 5, 0) = %d records, %v", len(recs), err)
			}
			if recs, err := l.Read(2, 5, 250); err != nil || len(recs) != 2 {
				t.Fatalf("Read(2, 5, 250) = %d records, %v; want 2", len(recs), err)
			}
			if recs, err := l.Read(2, 5, 10); err != nil || len(recs) != 1 {
				t.Fatalf("Read(2, 5, 10) = %d records, %v; want 1 even though it is larger", len(recs), err)
			}
			if recs, err := l.Read(10, 5, 0); err != nil || len(recs) != 0 {
				t.Fatalf("Read(next) = %d records, %v; want none", len(recs), err)
			}
			_, err = l.Read(11, 5, 0)
			var oe *OutOfRangeError
			if !errors.As(err, &oe) || !errors.Is(err, ErrOutOfRange) || oe.Next != 10 || oe.Offset != 11 {
				t.Fatalf("Read(next+1) = %v", err)
			}
		})
	}
}

func TestGroupCommit(t *testing.T) {
	eachSync(t, func(t *testing.T, parked bool) {
		const appenders, each = 64, 40
		l, _ := testLog(t, t.TempDir(), Options{SegmentSize: 16 << 10, TailRecords: 100, ParkedSync: parked})
		type sent struct {
			off uint64
			r   *Record
		}
		results := make([][]sent, appenders)
		var wg sync.WaitGroup
		for g := range appenders {
			wg.Go(func() {
				for i := range each {
					r := &Record{Key: fmt.Appendf(nil, "g%d", g), Value: fmt.Appendf(nil, "g%d-i%d", g, i), ProducerID: fmt.Sprint(g), ProducerSeq: uint64(i)}
					off, err := l.Append(context.Background(), r)
					if err != nil {
						t.Errorf("Append: %v", err)
						return
					}
					results[g] = append(results[g], sent{off, r})
				}
			})
		}
		wg.Wait()
		byOffset := map[uint64]*Record{}
		for g := range appenders {
			var last uint64
			for i, s := range results[g] {
				if _, dup := byOffset[s.off]; dup {
					t.Fatalf("offset %d given twice", s.off)
				}
				if i > 0 && s.off <= last {
					t.Fatalf("appender %d: offset %d after %d", g, s.off, last)
				}
				last = s.off
				byOffset[s.off] = s.r
			}
		}
		const total = appenders * each
		offs := make([]uint64, 0, total)
		for o := range byOffset {
			offs = append(offs, o)
		}
		sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
		if len(offs) != total || offs[0] != 0 || offs[total-1] != total-1 {
			t.Fatalf("offsets not dense: %d of them, %d..%d", len(offs), offs[0], offs[len(offs)-1])
		}
		st := l.Stats()
		t.Logf("stats: %+v", st)
		if st.Records != total || st.Fsyncs >= st.Records || st.MaxBatch < 2 {
			t.Fatalf("stats %+v: want %d records in fewer fsyncs", st, total)
		}
		for i, r := range readAll(t, l, 0) {
			if err := sameRecord(r, byOffset[uint64(i)]); err != nil {
				t.Fatalf("offset %d: %v", i, err)
			}
		}
	})
}

func TestAppendAsyncOrderAndClose(t *testing.T) {
	eachSync(t, func(t *testing.T, parked bool) {
		dir := t.TempDir()
		l, _ := testLog(t, dir, Options{MaxBatch: 64, ParkedSync: parked})
		const n = 2000
		var mu sync.Mutex
		var offs []uint64
		var errs []error
		for i := range n {
			l.AppendAsync(rec(i), func(off uint64, ts int64, err error) {
				mu.Lock()
				defer mu.Unlock()
				offs = append(offs, off)
				errs = append(errs, err)
			})
		}
		if err := l.Close(); err != nil { // commits everything queued
			t.Fatal(err)
		}
		mu.Lock()
		if len(offs) != n {
			t.Fatalf("%d callbacks, want %d", len(offs), n)
		}
		for i := range offs {
			if errs[i] != nil || offs[i] != uint64(i) {
				t.Fatalf("callback %d: offset %d err %v", i, offs[i], errs[i])
			}
		}
		mu.Unlock()
		if st := l.Stats(); st.MaxBatch > 64 {
			t.Fatalf("batch of %d exceeds MaxBatch 64", st.MaxBatch)
		}

		if _, err := l.Append(context.Background(), rec(0)); !errors.Is(err, ErrClosed) {
			t.Fatalf("Append after Close: %v", err)
		}
		called := 0
		l.AppendAsync(rec(0), func(_ uint64, _ int64, err error) {
			called++
			if !errors.Is(err, ErrClosed) {
				t.Errorf("AppendAsync after Close: %v", err)
			}
		})
		if called != 1 {
			t.Fatalf("done called %d times", called)
		}
		if _, err := l.Read(0, 1, 0); !errors.Is(err, ErrClosed) {
			t.Fatalf("Read after Close: %v", err)
		}
		if err := l.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}

		l2, _ := testLog(t, dir, Options{})
		if got := len(readAll(t, l2, 0)); got != n {
			t.Fatalf("reopened log holds %d records, want %d", got, n)
		}
	})
}

func TestAppendCanceledContext(t *testing.T) {
	l, _ := testLog(t, t.TempDir(), Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Append(ctx, rec(0)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Append with canceled ctx: %v", err)
	}
	if l.NextOffset() != 0 {
		t.Fatalf("canceled append was committed")
	}
}

func TestWatch(t *testing.T) {
	l, _ := testLog(t, t.TempDir(), Options{})
	next, changed := l.Watch()
	if next != 0 {
		t.Fatalf("Watch next = %d", next)
	}
	select {
	case <-changed:
		t.Fatal("changed closed before any commit")
	default:
	}
	errc := make(chan error, 1)
	go func() {
		_, err := l.Append(context.Background(), rec(1))
		errc <- err
	}()
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("watcher not woken by commit")
	}
	recs, err := l.Read(next, 10, 0)
	if err != nil || len(recs) != 1 || sameRecord(recs[0], rec(1)) != nil {
		t.Fatalf("Read after wake-up = %v, %v", recs, err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	next, changed = l.Watch()
	if next != 1 {
		t.Fatalf("Watch next = %d, want 1", next)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("watcher not woken by Close")
	}
	if _, ch := l.Watch(); ch == nil {
		t.Fatal("Watch after Close returned nil channel")
	} else {
		<-ch // closed
	}
}

func TestCommitFailureFailsLog(t *testing.T) {
	l, sink := testLog(t, t.TempDir(), Options{})
	if _, err := l.Append(context.Background(), rec(0)); err != nil {
		t.Fatal(err)
	}
	// Make the next write fail underneath the committer.
	if err := l.tw.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := l.Append(context.Background(), rec(1))
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("Append with failing write: %v", err)
	}
	if _, err := l.Append(context.Background(), rec(2)); !errors.Is(err, ErrFailed) {
		t.Fatalf("Append after failure: %v", err)
	}
	if l.NextOffset() != 1 {
		t.Fatalf("NextOffset moved to %d on failure", l.NextOffset())
	}
	if sink.count(slogLevelError) != 1 {
		t.Fatalf("want one error logged, got %d", sink.count(slogLevelError))
	}
	_ = l.Close()
	sink.mu.Lock()
	sink.counts = nil // the failure was expected
	sink.mu.Unlock()
}

func TestChecksumInEarlierSegment(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentSize: 512, Name: "orders/2"}
	l, _ := testLog(t, dir, opts)
	for i := range 100 {
		if _, err := l.Append(context.Background(), rec(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	segs, _, err := listSegments(dir)
	if err != nil || len(segs) < 4 {
		t.Fatalf("want several segments, got %d (%v)", len(segs), err)
	}
	seg := segs[1]
	data, err := os.ReadFile(seg.Path)
	if err != nil {
		t.Fatal(err)
	}
	// Flip the last byte (inside the value) of the segment's third record.
	pos := 0
	for range 3 {
		_, n, ok := nextEntry(data[pos:])
		if !ok {
			t.Fatal("segment too short")
		}
		pos += n
	}
	data[pos-1] ^= 0x40
	if err := os.WriteFile(seg.Path, data, 0o640); err != nil {
		t.Fatal(err)
	}
	bad := seg.Index - 1 + 2

	l2, _ := testLog(t, dir, opts)
	if l2.NextOffset() != 100 {
		t.Fatalf("NextOffset %d after reopen; a non-tail segment must not be cut", l2.NextOffset())
	}
	_, err = l2.Read(bad, 10, 0)
	var ce *CorruptError
	if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || ce.Offset != bad || ce.Shard != "orders/2" {
		t.Fatalf("Read(%d) = %v; want CorruptError for shard orders/2 offset %d", bad, err, bad)
	}
	recs, err := l2.Read(bad-2, 10, 0)
	if err != nil || len(recs) != 2 {
		t.Fatalf("Read up to the bad record = %d records, %v; want the 2 before it", len(recs), err)
	}
	recs, err = l2.Read(bad+1, 1, 0)
	if err != nil || len(recs) != 1 || sameRecord(recs[0], rec(int(bad+1))) != nil {
		t.Fatalf("Read after the bad record = %v, %v", recs, err)
	}
}

// TestSegmentRollTracking appends batches of many sizes across many segment
// rolls; the tail tracking must never disagree with tidwall (that would log
// an error) and every record must survive a reopen.
func TestSegmentRollTracking(t *testing.T) {
	eachSync(t, func(t *testing.T, parked bool) {
		dir := t.TempDir()
		l, _ := testLog(t, dir, Options{SegmentSize: 700, MaxBatch: 13, ParkedSync: parked})
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range 60 {
					r := &Record{Value: make([]byte, (g*60+i)%300)}
					if _, err := l.Append(context.Background(), r); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l2, sink := testLog(t, dir, Options{SegmentSize: 700})
		if got := len(readAll(t, l2, 0)); got != 480 {
			t.Fatalf("read %d records after reopen, want 480", got)
		}
		if sink.count(slogLevelWarn) != 0 {
			t.Fatalf("reopen cut a tail of a cleanly closed log: %q", sink.msgs)
		}
	})
}

// TestCloseWhileAppending closes the log under concurrent Append and
// AppendAsync: each append either commits (and survives a reopen) or gets
// ErrClosed, and Close waits for inline commits in progress.
func TestCloseWhileAppending(t *testing.T) {
	dir := t.TempDir()
	l, _ := testLog(t, dir, Options{})
	var mu sync.Mutex
	acked := map[uint64]bool{}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				if g%2 == 0 {
					off, err := l.Append(context.Background(), rec(i))
					if errors.Is(err, ErrClosed) {
						return
					}
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					acked[off] = true
					mu.Unlock()
					continue
				}
				errc := make(chan error, 1)
				l.AppendAsync(rec(i), func(off uint64, _ int64, err error) {
					if err == nil {
						mu.Lock()
						acked[off] = true
						mu.Unlock()
					}
					errc <- err
				})
				if err := <-errc; err != nil {
					if !errors.Is(err, ErrClosed) {
						t.Error(err)
					}
					return
				}
			}
		})
	}
	time.Sleep(30 * time.Millisecond)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	l2, _ := testLog(t, dir, Options{})
	if int(l2.NextOffset()) != len(acked) {
		t.Fatalf("reopened log holds %d records, %d were acknowledged", l2.NextOffset(), len(acked))
	}
	for off := range acked {
		if off >= l2.NextOffset() {
			t.Fatalf("acknowledged offset %d lost", off)
		}
	}
}

// TestAppendNowOrdersWithAsync: AppendNow commits inline when idle and
// queues otherwise; with AppendAsync mixed in, every callback runs once and
// offsets come back dense and in call order per goroutine.
func TestAppendNowOrdersWithAsync(t *testing.T) {
	l, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[uint64]bool{}
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := int64(-1)
			for i := range 200 {
				done := make(chan struct{})
				cb := func(off uint64, _ int64, err error) {
					if err != nil {
						t.Error(err)
					}
					mu.Lock()
					if seen[off] {
						t.Errorf("offset %d given twice", off)
					}
					seen[off] = true
					mu.Unlock()
					if int64(off) <= last {
						t.Errorf("goroutine %d: offset %d after %d", g, off, last)
					}
					last = int64(off)
					close(done)
				}
				rec := &Record{Value: []byte("x")}
				if i%2 == 0 {
					l.AppendNow(rec, cb)
				} else {
					l.AppendAsync(rec, cb)
				}
				<-done
			}
		}()
	}
	wg.Wait()
	if len(seen) != 1600 || l.NextOffset() != 1600 {
		t.Fatalf("%d offsets seen, next %d; want 1600", len(seen), l.NextOffset())
	}
}

// eachSync runs f with the committer's fdatasyncs blocking and parked
// (Options.ParkedSync): the same commits, the same outcome.
func eachSync(t *testing.T, f func(t *testing.T, parked bool)) {
	for _, parked := range []bool{false, true} {
		t.Run(fmt.Sprintf("parked=%v", parked), func(t *testing.T) { f(t, parked) })
	}
}
