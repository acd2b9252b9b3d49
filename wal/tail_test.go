package wal

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// TestTailBoundedByBytes: records with many headers, or large ones, never
// take the in-memory tail over TailBytes, and every record still reads
// back right (from the tail or from disk).
func TestTailBoundedByBytes(t *testing.T) {
	const bound = 64 << 10
	l, _ := testLog(t, t.TempDir(), Options{TailBytes: bound, SegmentSize: 256 << 10})
	var want []*Record
	add := func(r *Record) {
		t.Helper()
		if _, err := l.Append(context.Background(), r); err != nil {
			t.Fatal(err)
		}
		want = append(want, r)
		if n, b := l.ring.stats(); b > bound {
			t.Fatalf("after %d appends the tail holds %d records, %d bytes; bound %d", len(want), n, b, bound)
		}
	}
	// Many headers: each counts with its map entry.
	for i := range 20 {
		h := make(map[string]string, 2000)
		for j := range 2000 {
			h[fmt.Sprint("h", j)] = "v"
		}
		add(&Record{Key: fmt.Appendf(nil, "k%d", i), Headers: h})
	}
	// Records over the bound on their own are not kept at all.
	add(&Record{Value: make([]byte, bound+1)})
	if n, _ := l.ring.stats(); n != 0 {
		t.Fatalf("a record over the bound left %d records in the tail", n)
	}
	// Small records fill it up to the bound, not to TailRecords.
	for i := range 3000 {
		add(rec(i))
	}
	if n, b := l.ring.stats(); n == 0 || n >= 3000 || b > bound {
		t.Fatalf("tail holds %d records, %d bytes", n, b)
	}
	got := readAll(t, l, 0)
	for i, r := range got {
		if err := sameRecord(r, want[i]); err != nil {
			t.Fatalf("offset %d: %v", i, err)
		}
	}
}

// TestTailBigBatch: a batch far over the bound keeps only its newest
// records in the tail, copied out of the batch's buffer, and they read
// back right.
func TestTailBigBatch(t *testing.T) {
	const bound = 32 << 10
	var r ring
	r.reset(4096, bound, 0)
	arena := make([]byte, 0, 1<<20)
	var recs []Record
	for i := range 256 {
		v := arena[len(arena) : len(arena)+4096]
		for j := range v {
			v[j] = byte(i)
		}
		arena = arena[:len(arena)+4096]
		recs = append(recs, Record{Offset: uint64(i), Value: v, ProducerID: "p"})
	}
	r.push(recs, len(arena))
	n, b := r.stats()
	if b > bound || n == 0 {
		t.Fatalf("tail holds %d records, %d bytes; bound %d", n, b, bound)
	}
	if r.start != uint64(256-n) {
		t.Fatalf("tail starts at %d with %d records, want the newest", r.start, n)
	}
	out, ok := r.read(r.start, 256, 1000, 0)
	if !ok || len(out) != n {
		t.Fatalf("read %d records, %v", len(out), ok)
	}
	for _, rec := range out {
		if rec.Value[0] != byte(rec.Offset) || cap(rec.Value) != 4096 {
			t.Fatalf("offset %d: value starts %d, cap %d", rec.Offset, rec.Value[0], cap(rec.Value))
		}
		if &rec.Value[0] == &arena[int(rec.Offset)*4096] {
			t.Fatalf("offset %d still points into the batch's buffer", rec.Offset)
		}
	}
	if _, ok := r.read(r.start-1, 256, 1, 0); ok {
		t.Fatal("read below the tail succeeded")
	}
}

// TestTailRingGrowsAndShrinks drives the ring with random batches and
// checks it against a model: it holds the newest records that fit both
// bounds, and its slice follows what it holds.
func TestTailRingGrowsAndShrinks(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const maxRecords, maxBytes = 64, 8 << 10
	var r ring
	r.reset(maxRecords, maxBytes, 0)
	next := uint64(0)
	var model []Record
	for range 2000 {
		batch := make([]Record, 1+rng.IntN(20))
		size := 0
		for i := range batch {
			batch[i] = Record{Offset: next, Value: make([]byte, rng.IntN(600))}
			size += len(batch[i].Value)
			next++
		}
		r.push(batch, size)
		model = append(model, batch...)
		// The model: the newest records that fit.
		keep, bytes := 0, int64(0)
		for i := len(model) - 1; i >= 0 && keep < maxRecords; i-- {
			m := recordMem(&model[i])
			if bytes+m > maxBytes {
				break
			}
			bytes += m
			keep++
		}
		n, b := r.stats()
		if n > keep || b > maxBytes || n > maxRecords {
			t.Fatalf("ring holds %d records (%d bytes); at most %d fit", n, b, keep)
		}
		if n > 0 && r.start+uint64(n) != next {
			t.Fatalf("ring holds [%d, %d), want up to %d", r.start, r.start+uint64(n), next)
		}
		if len(r.buf) > maxRecords || (len(r.buf) > 16 && n <= len(r.buf)/4) {
			t.Fatalf("slice of %d for %d records", len(r.buf), n)
		}
		for off := r.start; off < next; off++ {
			if got := r.at(off); got.Offset != off {
				t.Fatalf("slot of %d holds %d", off, got.Offset)
			}
		}
		if len(model) > 1000 {
			model = model[len(model)-100:]
		}
	}
}

// TestTailConcurrentReaders reads the tail while it is pushed (for -race).
func TestTailConcurrentReaders(t *testing.T) {
	l, _ := testLog(t, t.TempDir(), Options{TailBytes: 16 << 10, TailRecords: 64})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				next := l.NextOffset()
				if next == 0 {
					continue
				}
				recs, err := l.Read(next-1, 10, 0)
				if err != nil || len(recs) == 0 || recs[0].Offset != next-1 {
					t.Errorf("Read(%d) = %d records, %v", next-1, len(recs), err)
					return
				}
			}
		})
	}
	for i := range 500 {
		if _, err := l.Append(context.Background(), rec(i)); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}
