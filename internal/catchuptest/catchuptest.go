// Package catchuptest owns what package wal's and package replica's
// catch-up tests share: the records of a catch-up log (values that name
// their offsets), where far-behind readers start, reading one record at a
// time round-robin with every record checked, and the benchmark of
// reading from old segments. It imports neither package (package wal's
// own tests use it), so it takes a record's offset and value through a
// function.
package catchuptest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"

	"github.com/felix-broker/felix/internal/procio"
)

// Value is the value of the record at offset off in a catch-up log: 128
// bytes, the first 8 off (little endian), the rest a letter off picks.
func Value(off uint64) []byte {
	v := bytes.Repeat([]byte{byte('a' + off%26)}, 128)
	binary.LittleEndian.PutUint64(v, off)
	return v
}

// Read is a reader's Read (a log's or a group's, or a Reader's), of
// records of type R.
type Read[R any] func(from uint64, maxRecords, maxBytes int) ([]R, error)

// Fields returns a record's offset and value.
type Fields[R any] func(R) (offset uint64, value []byte)

// Interleave has the readers in reads deliver n records in all, one record
// per Read, round-robin, reader k from offset at[k] on (back to at[k]
// after span records), and checks every record against Value.
func Interleave[R any](tb testing.TB, fields Fields[R], reads []Read[R], at []uint64, span uint64, n int) {
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
		if off, v := fields(recs[0]); off != next[k] || !bytes.Equal(v, Value(next[k])) {
			tb.Fatalf("reader %d: Read(%d) returned offset %d value %x", k, next[k], off, v[:min(8, len(v))])
		}
		if next[k]++; next[k] == at[k]+span {
			next[k] = at[k]
		}
	}
}

// Starts returns where k readers start in a log whose segments begin at
// the offsets in starts: in segments 1, 3, 5... (never the tail), a
// little into each.
func Starts(tb testing.TB, starts []uint64, k int) []uint64 {
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

// Path is one way to read a log in Bench: its name, and a new reader.
type Path[R any] struct {
	Name string
	Read func() Read[R]
}

// Bench measures records read one at a time from old segments by 1, 4
// and 8 readers round-robin (the first sequential) along each path, and
// one reader reading 512 records a time (a subscriber with plenty of
// credit), in a log whose segments begin at starts. b.N counts records
// delivered; read-B/rec is the bytes read from files per record (rchar
// of /proc/self/io).
func Bench[R any](b *testing.B, fields Fields[R], paths []Path[R], starts []uint64) {
	for _, path := range paths {
		for _, k := range []int{1, 4, 8} {
			b.Run(fmt.Sprintf("%s/readers=%d", path.Name, k), func(b *testing.B) {
				at := Starts(b, starts, k)
				reads := make([]Read[R], k)
				for i := range reads {
					reads[i] = path.Read()
				}
				span := starts[2] - starts[1]
				Interleave(b, fields, reads, at, span, k)
				for i := range at {
					at[i]++
				}
				measure(b, func() { Interleave(b, fields, reads, at, span, b.N) })
			})
		}
		b.Run(path.Name+"/batch=512", func(b *testing.B) {
			read := path.Read()
			from, end := starts[1], starts[len(starts)-1]
			measure(b, func() {
				for n := 0; n < b.N; {
					if from == end {
						from = starts[1]
					}
					recs, err := read(from, min(512, b.N-n, int(end-from)), 1<<20)
					if err != nil || len(recs) == 0 {
						b.Fatalf("Read(%d): %d records, %v", from, len(recs), err)
					}
					for _, r := range recs {
						if off, v := fields(r); off != from || !bytes.Equal(v, Value(from)) {
							b.Fatalf("Read returned offset %d, want %d", off, from)
						}
						from++
					}
					n += len(recs)
				}
			})
		})
	}
}

// measure times run as the benchmark's b.N records, with its allocations
// and the bytes it read from files per record.
func measure(b *testing.B, run func()) {
	runtime.GC()
	b.ReportAllocs()
	r0, ok := procio.Read()
	b.ResetTimer()
	run()
	b.StopTimer()
	if r1, _ := procio.Read(); ok {
		b.ReportMetric(float64(r1-r0)/float64(b.N), "read-B/rec")
	}
}
