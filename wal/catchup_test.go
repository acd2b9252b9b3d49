package wal

import (
	"fmt"
	"sync"
	"testing"

	"github.com/felix-broker/felix/internal/catchuptest"
	"github.com/felix-broker/felix/internal/procio"
)

// These tests measure what a record read from disk costs a reader that is
// far behind: bytes read from segment files and allocations per record
// delivered, with several readers catching up from different old segments
// at once, each reading one record at a time (a subscriber granting
// credit 1), round-robin.

// catchUpValue is record i's value in a catch-up log: 128 bytes naming i.
var catchUpValue = catchuptest.Value

// recordFields gives catchuptest a record's offset and value.
func recordFields(r Record) (uint64, []byte) { return r.Offset, r.Value }

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
type readFunc = catchuptest.Read[Record]

// interleave is catchuptest.Interleave of a log's records.
func interleave(tb testing.TB, reads []readFunc, at []uint64, span uint64, n int) {
	tb.Helper()
	catchuptest.Interleave(tb, recordFields, reads, at, span, n)
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
	at := catchuptest.Starts(t, starts, 4)
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
	catchuptest.Bench(b, recordFields, []catchuptest.Path[Record]{
		{Name: "Log.Read", Read: func() readFunc { return l.Read }},
		{Name: "Reader", Read: func() readFunc { return l.NewReader().Read }},
	}, starts)
}

// newCatchUpReader returns what a subscriber reads a log with.
func newCatchUpReader(l *Log) readFunc { return l.NewReader().Read }
