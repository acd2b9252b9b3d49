package wal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/felix-broker/felix/internal/procio"
)

// These tests measure what a record read from disk costs a reader that is
// far behind: bytes read from segment files and allocations per record
// delivered, with several readers catching up from different old segments
// at once, each reading one record at a time (a subscriber granting
// credit 1), round-robin.

// catchUpValue is record i's value in a catch-up log: 128 bytes naming i.
func catchUpValue(i uint64) []byte {
	v := make([]byte, 128)
	binary.LittleEndian.PutUint64(v, i)
	copy(v[8:], bytes.Repeat([]byte{byte('a' + i%26)}, 120))
	return v
}

// catchUpLog opens a log of segs segments of small records in dir; its
// tail ring holds none of the old ones.
func catchUpLog(tb testing.TB, dir string, segs int) (*Log, []uint64) {
	tb.Helper()
	l, err := Open(dir, Options{Name: "catchup/0", TailRecords: 64})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = l.Close() })
	return l, fillCatchUp(tb, l, segs)
}

// fillCatchUp appends records whose values name their offsets
// (catchUpValue) until the log has segs segment files, and returns the
// first offset of each segment.
func fillCatchUp(tb testing.TB, l *Log, segs int) []uint64 {
	tb.Helper()
	return fillValues(tb, l, segs, catchUpValue)
}

// fillValues is fillCatchUp with the value of each offset from value.
func fillValues(tb testing.TB, l *Log, segs int, value func(uint64) []byte) []uint64 {
	tb.Helper()
	for {
		files, _, err := listSegments(l.dir)
		if err != nil {
			tb.Fatal(err)
		}
		if len(files) >= segs {
			starts := make([]uint64, len(files))
			for i, f := range files {
				starts[i] = f.Index - 1
			}
			return starts
		}
		recs := make([]*Record, 4096)
		for j := range recs {
			recs[j] = &Record{Key: []byte("k")}
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var failed error
		// Offsets are assigned in call order: one appender.
		next := l.NextOffset()
		for j, r := range recs {
			r.Value = value(next + uint64(j))
			wg.Add(1)
			l.AppendAsync(r, func(off uint64, _ int64, err error) {
				defer wg.Done()
				mu.Lock()
				defer mu.Unlock()
				if failed == nil && err != nil {
					failed = err
				}
				if failed == nil && off != next+uint64(j) {
					failed = fmt.Errorf("record %d got offset %d", next+uint64(j), off)
				}
			})
		}
		wg.Wait()
		if failed != nil {
			tb.Fatal(failed)
		}
	}
}

// readFunc is a reader's Read: Log.Read, or a Reader's.
type readFunc func(from uint64, maxRecords, maxBytes int) ([]Record, error)

// interleave has the readers in reads deliver n records in all, one record
// per Read, round-robin, reader k from offset at[k] on (back to at[k]
// after span records), and checks every record.
func interleave(tb testing.TB, reads []readFunc, at []uint64, span uint64, n int) {
	tb.Helper()
	next := append([]uint64(nil), at...)
	for i := range n {
		k := i % len(reads)
		recs, err := reads[k](next[k], 1, 1<<20)
		if err != nil {
			tb.Fatalf("reader %d: Read(%d): %v", k, next[k], err)
		}
		if len(recs) != 1 {
			tb.Fatalf("reader %d: Read(%d, 1) returned %d records", k, next[k], len(recs))
		}
		if r := recs[0]; r.Offset != next[k] || !bytes.Equal(r.Value, catchUpValue(next[k])) {
			tb.Fatalf("reader %d: Read(%d) returned offset %d value %x", k, next[k], r.Offset, r.Value[:8])
		}
		if next[k]++; next[k] == at[k]+span {
			next[k] = at[k]
		}
	}
}

// catchUpStarts returns where k readers start: in segments 1, 3, 5...
// of starts (never the tail), a little into each.
func catchUpStarts(tb testing.TB, starts []uint64, k int) []uint64 {
	tb.Helper()
	if 2*k >= len(starts) {
		tb.Fatalf("%d segments are too few for %d readers", len(starts), k)
	}
	at := make([]uint64, k)
	for i := range at {
		at[i] = starts[1+2*i] + 17
	}
	return at
}

// TestCatchUpReadersInterleaved: four readers catching up from different
// old segments, one record per read, round-robin, read each record for
// far less than a segment (1 MiB): under 64 KiB of segment bytes per
// record, where each read loading a whole segment costs about 6,000 times
// the record.
func TestCatchUpReadersInterleaved(t *testing.T) {
	if _, ok := procio.Read(); !ok {
		t.Skip("no /proc/self/io here to count the bytes read")
	}
	l, starts := catchUpLog(t, t.TempDir(), 12)
	at := catchUpStarts(t, starts, 4)
	reads := make([]readFunc, len(at))
	for k := range reads {
		reads[k] = newCatchUpReader(l)
	}
	span := starts[2] - starts[1]              // a reader stays in its own segments
	interleave(t, reads, at, span, len(reads)) // each reader finds its place
	for k := range at {
		at[k]++
	}
	r0, _ := procio.Read()
	const n = 800
	interleave(t, reads, at, span, n)
	r1, _ := procio.Read()
	perRecord := (r1 - r0) / n
	t.Logf("%d records, %d bytes read per record", n, perRecord)
	if perRecord > 64<<10 {
		t.Fatalf("%d readers interleaved read %d bytes of segment files per record delivered (about %d records' worth), want under 64 KiB", len(at), perRecord, perRecord/163)
	}
}

// BenchmarkCatchUpRead: records read one at a time from old segments by
// 1, 4 and 8 readers round-robin (the first sequential), through Log.Read
// (tidwall: a segment loaded whole on a cache miss) and through a Reader
// each (by position); batch=512 is one reader reading 512 records a time
// (a subscriber with plenty of credit). b.N counts records delivered;
// read-B/rec is the bytes read from files per record (rchar of
// /proc/self/io).
func BenchmarkCatchUpRead(b *testing.B) {
	l, starts := catchUpLog(b, benchDir(b), 20)
	paths := []struct {
		name string
		read func() readFunc
	}{
		{"Log.Read", func() readFunc { return l.Read }},
		{"Reader", func() readFunc { return l.NewReader().Read }},
	}
	for _, path := range paths {
		for _, k := range []int{1, 4, 8} {
			b.Run(fmt.Sprintf("%s/readers=%d", path.name, k), func(b *testing.B) {
				at := catchUpStarts(b, starts, k)
				reads := make([]readFunc, k)
				for i := range reads {
					reads[i] = path.read()
				}
				span := starts[2] - starts[1]
				interleave(b, reads, at, span, k)
				for i := range at {
					at[i]++
				}
				runtime.GC()
				b.ReportAllocs()
				r0, ok := procio.Read()
				b.ResetTimer()
				interleave(b, reads, at, span, b.N)
				b.StopTimer()
				if r1, _ := procio.Read(); ok {
					b.ReportMetric(float64(r1-r0)/float64(b.N), "read-B/rec")
				}
			})
		}
		b.Run(path.name+"/batch=512", func(b *testing.B) {
			read := path.read()
			from, end := starts[1], starts[len(starts)-1]
			runtime.GC()
			b.ReportAllocs()
			r0, ok := procio.Read()
			b.ResetTimer()
			for n := 0; n < b.N; {
				if from == end {
					from = starts[1]
				}
				recs, err := read(from, min(512, b.N-n, int(end-from)), 1<<20)
				if err != nil || len(recs) == 0 {
					b.Fatalf("Read(%d): %d records, %v", from, len(recs), err)
				}
				for _, r := range recs {
					if r.Offset != from || !bytes.Equal(r.Value, catchUpValue(from)) {
						b.Fatalf("Read returned offset %d, want %d", r.Offset, from)
					}
					from++
				}
				n += len(recs)
			}
			b.StopTimer()
			if r1, _ := procio.Read(); ok {
				b.ReportMetric(float64(r1-r0)/float64(b.N), "read-B/rec")
			}
		})
	}
}

// newCatchUpReader returns what a subscriber reads a log with.
func newCatchUpReader(l *Log) readFunc { return l.NewReader().Read }
