package replica

import (
	"runtime"
	"testing"

	"github.com/felix-broker/felix/internal/catchuptest"
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
var catchUpValue = catchuptest.Value

// recordFields gives catchuptest a record's offset and value.
func recordFields(r wal.Record) (uint64, []byte) { return r.Offset, r.Value }

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
type readFunc = catchuptest.Read[wal.Record]

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
	at := catchuptest.Starts(t, starts, 4)
	reads := make([]readFunc, len(at))
	for k := range reads {
		reads[k] = newCatchUpReader(t, g)
	}
	span := starts[2] - starts[1]
	catchuptest.Interleave(t, recordFields, reads, at, span, len(reads))
	for k := range at {
		at[k]++
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	r0, _ := procio.Read()
	const n = 800
	catchuptest.Interleave(t, recordFields, reads, at, span, n)
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
	catchuptest.Bench(b, recordFields, []catchuptest.Path[wal.Record]{
		{Name: "Group.Read", Read: func() readFunc { return g.Read }},
		{Name: "Reader", Read: func() readFunc { return newCatchUpReader(b, g) }},
	}, starts)
}

// newCatchUpReader returns what a subscriber reads a group with, closed
// when tb ends.
func newCatchUpReader(tb testing.TB, g *Group) readFunc {
	r := g.NewReader()
	tb.Cleanup(r.Close)
	return r.Read
}
