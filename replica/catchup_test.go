package replica

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"

	"github.com/felix-broker/felix/internal/procio"
	"github.com/felix-broker/felix/internal/tidseg"
	"github.com/felix-broker/felix/wal"
)

// These tests measure what a record read from disk costs a reader of a
// replica that is far behind: bytes read from segment files and
// allocations per record delivered, with several readers catching up from
// different old segments at once, each reading one record at a time (a
// subscriber granting credit 1), round-robin, as package wal's
// catchup_test.go does for a shard log.

// catchUpValue is the value of the record at offset off: 128 bytes naming
// off.
func catchUpValue(off uint64) []byte {
	v := bytes.Repeat([]byte{byte('a' + off%26)}, 128)
	binary.LittleEndian.PutUint64(v, off)
	return v
}

// catchUpEntry is how many records a catch-up log's entries hold: a
// group-commit batch of a busy shard (about 9 KB of records).
const catchUpEntry = 64

// catchUpGroup opens a group of one replica with 1 MiB segments and a
// small in-memory tail, and commits records whose values name their
// offsets (catchUpValue), catchUpEntry per entry, until its log has segs
// segment files. It returns the group and the first offset of each
// segment's first entry holding records.
func catchUpGroup(tb testing.TB, segs int) (*Group, []uint64) {
	tb.Helper()
	c := newCluster(tb, 1, 9, func(cfg *Config) { cfg.SegmentSize, cfg.TailBytes = 1<<20, 64<<10 })
	g := c.waitLeader()
	for {
		files, _, err := tidseg.List(g.cfg.Dir)
		if err != nil {
			tb.Fatal(err)
		}
		if len(files) >= segs {
			starts := make([]uint64, len(files))
			for i, f := range files {
				index := max(f.Index, g.offs.firstIndex)
				starts[i] = g.offs.nextAfter(index - 1)
			}
			return g, starts
		}
		commitValues(tb, g, catchUpEntry)
	}
}

// commitValues appends n records to g at once, whose values name their
// offsets (catchUpValue), and waits for them: an entry of n records,
// unless the group splits them.
func commitValues(tb testing.TB, g *Group, n int) {
	tb.Helper()
	next := g.NextOffset()
	chans := make([]<-chan result, n)
	for j := range chans {
		chans[j] = appendTo(g, catchUpValue(next+uint64(j)))
	}
	for j, ch := range chans {
		r := <-ch
		if r.err != nil {
			tb.Fatal(r.err)
		}
		if r.offset != next+uint64(j) {
			tb.Fatalf("record %d committed at offset %d", next+uint64(j), r.offset)
		}
	}
}

// readFunc is a reader's Read.
type readFunc func(from uint64, max, maxBytes int) ([]wal.Record, error)

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

// TestCatchUpReadersInterleaved: four readers of a replica catching up
// from different old segments, one record per read, round-robin, read
// each record for far less than a segment (1 MiB): under 64 KiB of
// segment bytes per record, where reading through tidwall (Group.Read)
// loaded a segment per record.
func TestCatchUpReadersInterleaved(t *testing.T) {
	if _, ok := procio.Read(); !ok {
		t.Skip("no /proc/self/io here to count the bytes read")
	}
	g, starts := catchUpGroup(t, 12)
	at := catchUpStarts(t, starts, 4)
	reads := make([]readFunc, len(at))
	for k := range reads {
		reads[k] = newCatchUpReader(t, g)
	}
	span := starts[2] - starts[1]
	interleave(t, reads, at, span, len(reads))
	for k := range at {
		at[k]++
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	r0, _ := procio.Read()
	const n = 800
	interleave(t, reads, at, span, n)
	r1, _ := procio.Read()
	runtime.ReadMemStats(&m1)
	perRecord := (r1 - r0) / n
	t.Logf("%d records, %d bytes read and %d bytes allocated per record", n, perRecord, (m1.TotalAlloc-m0.TotalAlloc)/n)
	if perRecord > 64<<10 {
		t.Fatalf("%d readers interleaved read %d bytes of segment files per record delivered, want under 64 KiB", len(at), perRecord)
	}
}

// BenchmarkCatchUpRead: records read one at a time from old segments by
// 1, 4 and 8 readers round-robin (the first sequential), through
// Group.Read (tidwall: a segment loaded whole on a cache miss) and
// through a Reader each (by position); batch=512 is one reader reading
// 512 records a time (a subscriber with plenty of credit). Entries hold
// catchUpEntry records. b.N counts records delivered; read-B/rec is the
// bytes read from files per record (rchar of /proc/self/io).
func BenchmarkCatchUpRead(b *testing.B) {
	g, starts := catchUpGroup(b, 20)
	paths := []struct {
		name string
		read func() readFunc
	}{
		{"Group.Read", func() readFunc { return g.Read }},
		{"Reader", func() readFunc { return newCatchUpReader(b, g) }},
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

// newCatchUpReader returns what a subscriber reads a group with, closed
// when tb ends.
func newCatchUpReader(tb testing.TB, g *Group) readFunc {
	r := g.NewReader()
	tb.Cleanup(r.Close)
	return r.Read
}
