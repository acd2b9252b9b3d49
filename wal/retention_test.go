package wal

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/tidseg"
)

func filesSize(t *testing.T, dir string) int64 {
	t.Helper()
	segs, _, err := listSegments(dir)
	if err != nil {
		t.Fatal(err)
	}
	n, err := tidseg.DataSize(segs) // not the zeros preallocated after the tail's records
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func appendN(t *testing.T, l *Log, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		off, err := l.Append(context.Background(), rec(i))
		if err != nil || off != uint64(i) {
			t.Fatalf("Append %d = %d, %v", i, off, err)
		}
	}
}

func TestRetentionBytes(t *testing.T) {
	for _, seg := range []int{1024, 1 << 20} { // several segments; everything in the tail segment
		dir := t.TempDir()
		opts := Options{SegmentSize: seg, RetentionBytes: 3000, RetentionCheck: time.Hour}
		l, _ := testLog(t, dir, opts)
		appendN(t, l, 0, 200)
		before := filesSize(t, dir)
		dropped, err := l.EnforceRetention(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		first := l.FirstOffset()
		if dropped == 0 || first != dropped || l.NextOffset() != 200 {
			t.Fatalf("segment %d: dropped %d, first %d, next %d", seg, dropped, first, l.NextOffset())
		}
		after := filesSize(t, dir)
		if after > 3000 || after < 3000-200 {
			t.Fatalf("segment %d: files hold %d bytes (were %d), want just under 3000", seg, after, before)
		}
		_, err = l.Read(0, 1, 0)
		var oe *OutOfRangeError
		if !errors.As(err, &oe) || !errors.Is(err, ErrOutOfRange) || oe.First != first {
			t.Fatalf("Read(0) after retention = %v; want OutOfRange with First %d", err, first)
		}
		for i, r := range readAll(t, l, first) {
			if err := sameRecord(r, rec(int(first)+i)); err != nil {
				t.Fatalf("offset %d: %v", int(first)+i, err)
			}
		}
		if d, err := l.EnforceRetention(time.Now()); err != nil || d != 0 {
			t.Fatalf("second pass dropped %d, %v", d, err)
		}
		appendN(t, l, 200, 5)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		// The 5 records took the files past the limit again: Open's pass
		// drops as many from the front.
		l2, _ := testLog(t, dir, opts)
		first2 := l2.FirstOffset()
		if first2 <= first || first2 > first+5 || l2.NextOffset() != 205 || filesSize(t, dir) > 3000 {
			t.Fatalf("after reopen first %d next %d, %d bytes; want first in (%d, %d], next 205, at most 3000 bytes",
				first2, l2.NextOffset(), filesSize(t, dir), first, first+5)
		}
		if got := len(readAll(t, l2, first2)); got != int(205-first2) {
			t.Fatalf("read %d records after reopen", got)
		}
	}
}

func TestRetentionAge(t *testing.T) {
	for _, seg := range []int{1024, 1 << 20} {
		dir := t.TempDir()
		const age = time.Hour
		opts := Options{SegmentSize: seg, RetentionAge: age, RetentionCheck: time.Hour}
		l, _ := testLog(t, dir, opts)
		appendN(t, l, 0, 70)
		old, err := l.Read(69, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
		appendN(t, l, 70, 30)

		// Nothing is an hour old yet.
		if d, err := l.EnforceRetention(time.Now()); err != nil || d != 0 {
			t.Fatalf("dropped %d, %v; want nothing", d, err)
		}
		// An hour after the last old record, the first 70 are expired.
		d, err := l.EnforceRetention(time.Unix(0, old[0].Timestamp).Add(age + 1))
		if err != nil || d != 70 || l.FirstOffset() != 70 {
			t.Fatalf("dropped %d, %v, first %d; want 70", d, err, l.FirstOffset())
		}
		if _, err := l.Read(69, 1, 0); !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("Read(69) = %v", err)
		}
		// Everything expired: the log is empty but keeps counting.
		d, err = l.EnforceRetention(time.Now().Add(2 * age))
		if err != nil || d != 30 || l.FirstOffset() != 100 || l.NextOffset() != 100 {
			t.Fatalf("dropped %d, %v, first %d next %d", d, err, l.FirstOffset(), l.NextOffset())
		}
		if recs, err := l.Read(100, 1, 0); err != nil || len(recs) != 0 {
			t.Fatalf("Read on emptied log = %v, %v", recs, err)
		}
		appendN(t, l, 100, 3) // also proves the tail file we sync is the rewritten one
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l2, _ := testLog(t, dir, opts)
		if l2.FirstOffset() != 100 || l2.NextOffset() != 103 {
			t.Fatalf("after reopen first %d next %d", l2.FirstOffset(), l2.NextOffset())
		}
		for i, r := range readAll(t, l2, 100) {
			if err := sameRecord(r, rec(100+i)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestRetentionInBackground(t *testing.T) {
	l, _ := testLog(t, t.TempDir(), Options{RetentionAge: time.Nanosecond, RetentionCheck: 10 * time.Millisecond})
	appendN(t, l, 0, 10)
	deadline := time.Now().Add(10 * time.Second)
	for l.FirstOffset() != 10 {
		if time.Now().After(deadline) {
			t.Fatalf("background retention did not run: first %d", l.FirstOffset())
		}
		time.Sleep(5 * time.Millisecond)
	}
	appendN(t, l, 10, 2)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.EnforceRetention(time.Now()); !errors.Is(err, ErrClosed) {
		t.Fatalf("EnforceRetention after Close = %v", err)
	}
}

// TestRetentionWhileAppending runs retention passes concurrently with
// appenders and readers (for the race detector and the tail tracking).
func TestRetentionWhileAppending(t *testing.T) {
	l, _ := testLog(t, t.TempDir(), Options{SegmentSize: 2048, RetentionBytes: 4096, RetentionCheck: time.Hour, TailRecords: 8})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := l.EnforceRetention(time.Now()); err != nil {
				t.Error(err)
				return
			}
			from := l.FirstOffset()
			if _, err := l.Read(from, 50, 0); err != nil && !errors.Is(err, ErrOutOfRange) {
				t.Error(err)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	appendN(t, l, 0, 400)
	close(stop)
	<-done
	if l.FirstOffset() == 0 {
		t.Fatal("retention never dropped anything")
	}
}

// TestRetentionAgeNeverTrustsADamagedHeader: a segment whose first
// record's header is damaged (its timestamp zeroed: 1970) is not dated by
// it. Retention by age once took that segment for an old one and dropped
// every segment before it, records seconds old; a record that verifies
// later in the segment dates it.
func TestRetentionAgeNeverTrustsADamagedHeader(t *testing.T) {
	opts := Options{SegmentSize: 1024, Name: "age/0"}
	dir := t.TempDir()
	writeLog(t, dir, opts, 80)
	segs, _, err := listSegments(dir)
	if err != nil || len(segs) < 4 {
		t.Fatalf("want >= 4 segments, have %d (%v)", len(segs), err)
	}
	mid := segs[len(segs)/2]
	data, err := os.ReadFile(mid.Path)
	if err != nil {
		t.Fatal(err)
	}
	_, h := uvarintPrefix(data)
	clear(data[h+timestampAt : h+timestampAt+8])
	if err := os.WriteFile(mid.Path, data, 0o640); err != nil {
		t.Fatal(err)
	}
	opts.RetentionAge, opts.RetentionCheck = time.Hour, time.Hour
	l, _ := testLog(t, dir, opts)
	if dropped, err := l.EnforceRetention(time.Now()); dropped != 0 || err != nil {
		t.Fatalf("retention of records seconds old, one header damaged: dropped %d, %v; want none", dropped, err)
	}
	// Two hours on, every record is old, the damaged one too (the
	// records after it date it): all go.
	if dropped, err := l.EnforceRetention(time.Now().Add(2 * time.Hour)); err != nil || dropped != 80 {
		t.Fatalf("retention two hours on: dropped %d, %v; want all 80", dropped, err)
	}
}

// TestRetentionAtOpen: a log reopened with limits its records passed
// while it was closed drops them before Open returns (its own passes
// stopped with Close), so nothing expired is served; one without limits,
// or within them, keeps every record.
func TestRetentionAtOpen(t *testing.T) {
	for _, tc := range []struct {
		name      string
		opts      Options
		wantFirst uint64
	}{
		{"no limits", Options{}, 0},
		{"within limits", Options{RetentionAge: time.Hour, RetentionBytes: 1 << 20}, 0},
		{"age", Options{RetentionAge: time.Nanosecond}, 50},
		{"bytes", Options{RetentionBytes: 1}, 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{SegmentSize: 1024, RetentionCheck: time.Hour}
			writeLog(t, dir, opts, 50)
			opts.RetentionAge, opts.RetentionBytes = tc.opts.RetentionAge, tc.opts.RetentionBytes
			l, _ := testLog(t, dir, opts)
			if l.FirstOffset() != tc.wantFirst || l.NextOffset() != 50 {
				t.Fatalf("after Open: first %d, next %d; want %d, 50", l.FirstOffset(), l.NextOffset(), tc.wantFirst)
			}
			if tc.wantFirst == 50 && filesSize(t, dir) != 0 {
				t.Fatalf("after Open the files hold %d bytes of expired records", filesSize(t, dir))
			}
		})
	}
}

// TestExpiry: Expiry dates the oldest segment by its newest record, and a pass past that time
// drops that segment whole; a pass before the oldest record's
// expiry drops nothing; a log without an age limit, or empty, has none.
func TestExpiry(t *testing.T) {
	const age = time.Hour
	for _, seg := range []int{1024, 1 << 20} { // several segments; one
		dir := t.TempDir()
		l, _ := testLog(t, dir, Options{SegmentSize: seg, RetentionAge: age, RetentionCheck: time.Hour})
		if _, ok, err := l.Expiry(); ok || err != nil {
			t.Fatalf("segment %d: Expiry of an empty log = %v, %v; want none", seg, ok, err)
		}
		appendN(t, l, 0, 100)
		at, ok, err := l.Expiry()
		if !ok || err != nil {
			t.Fatalf("segment %d: Expiry = %v, %v", seg, ok, err)
		}
		segs, _, err := listSegments(dir)
		if err != nil {
			t.Fatal(err)
		}
		end := uint64(100) // one past the oldest segment
		if len(segs) > 1 {
			end = segs[1].Index - 1
		}
		recs, err := l.Read(end-1, 1, 0) // its newest record
		if err != nil {
			t.Fatal(err)
		}
		if want := time.Unix(0, recs[0].Timestamp).Add(age); !at.Equal(want) {
			t.Fatalf("segment %d: Expiry %v, want %v (offset %d's timestamp plus the age)", seg, at, want, end-1)
		}
		oldest, err := l.Read(0, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		if d, err := l.EnforceRetention(time.Unix(0, oldest[0].Timestamp).Add(age)); err != nil || d != 0 {
			t.Fatalf("segment %d: a pass before anything expired dropped %d, %v", seg, d, err)
		}
		if _, err := l.EnforceRetention(at.Add(1)); err != nil || l.FirstOffset() < end {
			t.Fatalf("segment %d: a pass past the expiry left first %d, %v; want at least %d", seg, l.FirstOffset(), err, end)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if _, _, err := l.Expiry(); !errors.Is(err, ErrClosed) {
			t.Fatalf("Expiry after Close = %v", err)
		}
	}
	l, _ := testLog(t, t.TempDir(), Options{RetentionBytes: 1 << 20})
	appendN(t, l, 0, 3)
	if _, ok, err := l.Expiry(); ok || err != nil {
		t.Fatalf("Expiry without an age limit = %v, %v; want none", ok, err)
	}
}

// TestRetentionThatLosesTheTailFailsTheLog: a retention pass that cuts
// inside the tail segment, which tidwall rewrites into a new file, and
// then cannot open that file (here an injected open error, as EMFILE
// would be) fails the log: the next append is refused, not acked. The
// log went on fdatasyncing the unlinked old tail and acking records
// that a power cut then lost (shown on lazyfs in a review). Reopened, it
// holds every record acked before, from the cut on.
func TestRetentionThatLosesTheTailFailsTheLog(t *testing.T) {
	dir := t.TempDir()
	var armed atomic.Bool
	fs := &FaultFS{Inject: func(op Op, path string) bool {
		return armed.Load() && op == OpOpen && len(filepath.Base(path)) == len(segmentName(0))
	}}
	sink := &logSink{} // the failure is logged: not testLog's, which fails on it
	l, err := Open(dir, Options{Name: "test/0", FS: fs, RetentionBytes: 3000, RetentionCheck: time.Hour, Logger: slog.New(sink)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const n = 200
	for i := range n {
		if _, err := l.Append(ctx, rec(i)); err != nil {
			t.Fatal(err)
		}
	}
	armed.Store(true)
	_, err = l.EnforceRetention(time.Now())
	armed.Store(false)
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("a retention pass that could not open the rewritten tail: %v, want ErrFailed", err)
	}
	if off, err := l.Append(ctx, rec(n)); !errors.Is(err, ErrFailed) {
		t.Fatalf("an append after it: offset %d, %v; want ErrFailed, nothing acked", off, err)
	}
	first := l.FirstOffset()
	if err := l.Close(); err != nil && !errors.Is(err, ErrFailed) {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(sink.msgs, func(m string) bool { return strings.Contains(m, "could not follow") }) {
		t.Errorf("the failure was not logged: %q", sink.msgs)
	}
	l, _ = testLog(t, dir, Options{})
	if l.FirstOffset() > first || l.NextOffset() != n {
		t.Fatalf("reopened: offsets %d to %d, want from %d or before to %d", l.FirstOffset(), l.NextOffset(), first, n)
	}
	if first == 0 {
		t.Fatal("the pass dropped nothing: it did not reach the tail segment's rewrite")
	}
}
