package wal

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// armedFS fails op on files named name (base name; "" = the tail segment,
// any file whose name is a segment's) once, when armed: a transient fault.
type armedFS struct {
	FaultFS
	armed atomic.Bool
	hits  atomic.Int64
	// block, if set, is waited on by the first failing operation.
	block chan struct{}
	once  sync.Once
}

func newArmedFS(op Op, name string) *armedFS {
	a := &armedFS{}
	a.Inject = func(o Op, path string) bool {
		base := filepath.Base(path)
		match := base == name || (name == "" && len(base) == 20)
		if o != op || !match || !a.armed.Load() {
			return false
		}
		if a.block != nil {
			a.once.Do(func() { <-a.block })
		}
		if !a.armed.CompareAndSwap(true, false) {
			return false
		}
		a.hits.Add(1)
		return true
	}
	return a
}

// faultyBatch runs the fail-stop checks common to a failed fsync and a
// failed write: a batch of several records fails as a whole with a typed
// error, nothing of it is acked, later appends fail at once with the same
// error, Close works, and the reopened log holds every acked record and
// nothing of the failed batch. acked records are committed first, in
// segments of segSize bytes (0: the default).
func faultyBatch(t *testing.T, op Op, name string, acked, segSize int) {
	dir := t.TempDir()
	fs := newArmedFS(op, name)
	fs.block = make(chan struct{})
	l, sink := testLog(t, dir, Options{Name: "fault/0", FS: fs, SegmentSize: segSize})
	for i := range acked {
		if off, err := l.Append(context.Background(), rec(i)); err != nil || off != uint64(i) {
			t.Fatalf("Append %d = %d, %v", i, off, err)
		}
	}
	fs.armed.Store(true)
	// The failing operation waits until every append is queued: the
	// failure meets one batch in progress and more queued behind it.
	type result struct {
		off uint64
		err error
	}
	const more = 20
	results := make(chan result, more)
	for i := range more {
		l.AppendAsync(rec(acked+i), func(off uint64, _ int64, err error) { results <- result{off, err} })
	}
	close(fs.block)
	var first error
	for range more {
		r := <-results
		if r.err == nil {
			t.Fatalf("a record of the failed batch was acked at offset %d", r.off)
		}
		if !errors.Is(r.err, ErrFailed) || !errors.Is(r.err, ErrInjected) || r.off != 0 {
			t.Fatalf("failed append = %d, %v; want offset 0 and an error matching ErrFailed and ErrInjected", r.off, r.err)
		}
		if first == nil {
			first = r.err
		}
	}
	if fs.hits.Load() != 1 {
		t.Fatalf("%d operations failed; the log must stop at the first", fs.hits.Load())
	}
	fs.armed.Store(false) // the disk is fine again: the log stays failed
	_, err := l.Append(context.Background(), rec(0))
	if err != first {
		t.Fatalf("Append after the failure = %v; want the same error %v", err, first)
	}
	if l.NextOffset() != uint64(acked) {
		t.Fatalf("NextOffset %d after the failure, want %d", l.NextOffset(), acked)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close after the failure: %v", err)
	}
	if sink.count(slogLevelError) != 1 {
		t.Fatalf("want one error logged, got %q", sink.msgs)
	}
	sink.mu.Lock()
	sink.counts = nil // the failure was expected
	sink.mu.Unlock()

	// Reopen: every acked record is there, and nothing of the failed
	// batch. Its bytes reached the file (the fault is injected after
	// tidwall wrote them, and the page cache keeps them, as after a real
	// failed fdatasync, where the disk may not hold them): the log cut
	// them when the commit failed (cutFailed).
	h, mark, state, err := openHWM(osFS{}, dir)
	if err != nil || (state != hwmValid && acked > 0) || mark.next != uint64(acked) {
		t.Fatalf("mark after the failure = %d (state %d, %v); want %d", mark.next, state, err, acked)
	}
	_ = h.f.Close()
	l2, sink2 := testLog(t, dir, Options{Name: "fault/0", SegmentSize: segSize})
	if l2.NextOffset() != uint64(acked) {
		t.Fatalf("NextOffset %d after reopen, want the %d acked", l2.NextOffset(), acked)
	}
	if n := sink2.count(slogLevelWarn) + sink2.count(slogLevelError); n != 0 {
		t.Fatalf("reopen logged %q; want nothing to repair", sink2.msgs)
	}
	for i := range 3 {
		if off, err := l2.Append(context.Background(), rec(100+i)); err != nil || off != uint64(acked+i) {
			t.Fatalf("Append after reopen = %d, %v; want offset %d", off, err, acked+i)
		}
	}
	got := readAll(t, l2, 0)
	if len(got) != acked+3 {
		t.Fatalf("reopened log holds %d records, want %d", len(got), acked+3)
	}
	for i, r := range got {
		want := rec(i)
		if i >= acked {
			want = rec(100 + i - acked)
		}
		if err := sameRecord(r, want); err != nil {
			t.Fatalf("offset %d: %v", i, err)
		}
	}
}

// TestFsyncFailureFailsBatch: the tail segment's fdatasync fails.
func TestFsyncFailureFailsBatch(t *testing.T) { faultyBatch(t, OpSync, "", 5, 0) }

// TestWriteFailureFailsBatch: the commit's write fails. tidwall writes the
// segment itself, beyond the seam; the commit's own write is the mark's.
func TestWriteFailureFailsBatch(t *testing.T) { faultyBatch(t, OpWrite, hwmName, 5, 0) }

// TestFsyncFailureOfFirstBatch: the log's first batch fails: the cut
// leaves it empty.
func TestFsyncFailureOfFirstBatch(t *testing.T) { faultyBatch(t, OpSync, "", 0, 0) }

// TestFsyncFailureAfterRoll: the failed batch filled its segment and
// tidwall rolled to a new one (its fdatasync is what fails): the cut
// rewrites the older segment and removes the new one.
func TestFsyncFailureAfterRoll(t *testing.T) {
	for acked := 10; acked < 16; acked++ { // one of them ends its segment with the failed batch
		t.Run(fmt.Sprint(acked), func(t *testing.T) { faultyBatch(t, OpSync, "", acked, 1500) })
	}
}

// TestOpenFaults: an open or read that fails during Open fails Open with
// an error that says what failed, and leaves nothing running.
func TestOpenFaults(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, Options{SegmentSize: 1500}, 30)
	for _, c := range []struct {
		op   Op
		name string
	}{
		{OpRead, ""},       // reading the tail segment for repair
		{OpOpen, ""},       // opening the tail segment
		{OpOpen, hwmName},  // opening the mark
		{OpRead, hwmName},  // reading the mark
		{OpSync, hwmName},  // syncing the mark
		{OpSync, "shard0"}, // the directory
	} {
		d := filepath.Join(t.TempDir(), "shard0")
		if err := os.CopyFS(d, os.DirFS(dir)); err != nil {
			t.Fatal(err)
		}
		fs := newArmedFS(c.op, c.name)
		fs.armed.Store(true)
		l, err := Open(d, Options{SegmentSize: 1500, FS: fs})
		if err == nil {
			_ = l.Close()
			t.Fatalf("%s of %q: Open succeeded", c.op, c.name)
		}
		if !errors.Is(err, ErrInjected) || fs.hits.Load() == 0 {
			t.Fatalf("%s of %q: Open = %v; want the injected error", c.op, c.name, err)
		}
		// The fault gone, the log opens with everything.
		l2, _ := testLog(t, d, Options{SegmentSize: 1500})
		if l2.NextOffset() != 30 {
			t.Fatalf("%s of %q: reopen NextOffset %d", c.op, c.name, l2.NextOffset())
		}
	}
}
