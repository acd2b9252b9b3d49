package wal

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestTailReadersUnderLoad: many appenders at full speed and many readers
// following the tail. Every reader sees every offset once, in order, never
// an error, and never a record at or past the NextOffset it could observe
// (a reader handed such a record would next read past the end: the
// out_of_range that cut live subscribers off, issue 12). Half the readers
// read through a Reader, by file position when the tail left them behind,
// across segment rolls and the tail segment's preallocated zeros.
func TestTailReadersUnderLoad(t *testing.T) {
	const (
		appenders = 8
		readers   = 8
		runFor    = 2 * time.Second
	)
	// A small tail and small segments make readers fall back to disk now
	// and then, and segments roll under them.
	l, _ := testLog(t, t.TempDir(), Options{TailRecords: 256, SegmentSize: 64 << 10})
	ctx, cancel := context.WithTimeout(context.Background(), runFor)
	defer cancel()

	var wg, appending sync.WaitGroup
	var appended atomic.Uint64
	errs := make(chan error, appenders+readers)
	for a := range appenders {
		appending.Add(1)
		go func() {
			defer appending.Done()
			for i := 0; ctx.Err() == nil; i++ {
				if a%2 == 0 {
					// Pipelined: many records queue during each fsync.
					var inner sync.WaitGroup
					for j := range 32 {
						inner.Add(1)
						l.AppendAsync(&Record{Key: fmt.Appendf(nil, "%d-%d-%d", a, i, j)}, func(_ uint64, _ int64, err error) {
							if err != nil {
								errs <- fmt.Errorf("append: %w", err)
							}
							inner.Done()
						})
					}
					inner.Wait()
					appended.Add(32)
					continue
				}
				if _, err := l.Append(context.Background(), &Record{Key: fmt.Appendf(nil, "%d-%d", a, i)}); err != nil {
					errs <- fmt.Errorf("append: %w", err)
					return
				}
				appended.Add(1)
			}
		}()
	}

	stopped := make(chan struct{}) // closed once every append has returned
	seen := make([]uint64, readers)
	for r := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var next uint64
			read := l.Read
			if r%2 == 1 { // by file position when behind the tail
				read = l.NewReader().Read
			}
			for {
				_, changed := l.Watch()
				recs, err := read(next, 1+r*37, 0)
				end := l.NextOffset() // observed after the read: never below what it returned
				if err != nil {
					errs <- fmt.Errorf("reader %d: Read(%d): %w", r, next, err)
					return
				}
				for _, rec := range recs {
					if rec.Offset != next {
						errs <- fmt.Errorf("reader %d: got offset %d, want %d", r, rec.Offset, next)
						return
					}
					if rec.Offset >= end {
						errs <- fmt.Errorf("reader %d: got offset %d at or past NextOffset %d", r, rec.Offset, end)
						return
					}
					next++
				}
				seen[r] = next
				if len(recs) > 0 {
					continue
				}
				select {
				case <-changed:
				case <-stopped:
					// Drain what was committed, then stop.
					if next == l.NextOffset() {
						return
					}
				}
			}
		}()
	}
	appending.Wait()
	close(stopped)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	next := l.NextOffset()
	if next != appended.Load() {
		t.Errorf("NextOffset %d after %d appends", next, appended.Load())
	}
	for r, n := range seen {
		if n != next {
			t.Errorf("reader %d stopped at %d, NextOffset %d", r, n, next)
		}
	}
	t.Logf("%d records, %d fsyncs, max batch %d", next, l.Stats().Fsyncs, l.Stats().MaxBatch)
}
