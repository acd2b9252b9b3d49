package replica

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/tidseg"
	"github.com/felix-broker/felix/wal"
)

// sameRecords fails unless got and want are the same records.
func sameRecords(t *testing.T, got, want []wal.Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d records, want %d", len(got), len(want))
	}
	for i := range got {
		g, w := &got[i], &want[i]
		if g.Offset != w.Offset || g.Timestamp != w.Timestamp || !bytes.Equal(g.Key, w.Key) || !bytes.Equal(g.Value, w.Value) ||
			g.ProducerID != w.ProducerID || g.ProducerSeq != w.ProducerSeq || len(g.Headers) != len(w.Headers) {
			t.Fatalf("record %d: offset %d, want %d (or its content differs)", i, g.Offset, w.Offset)
		}
	}
}

// TestReadersInterleavedMatchRead: Readers reading on from offsets all
// over a replica's log (old segments and the in-memory tail), each
// asking for a random number of records and bytes, concurrently, while
// records are committed and entries leave the tail for the disk, get
// every record once, in order, with its content, and what Group.Read
// returns for the same read.
func TestReadersInterleavedMatchRead(t *testing.T) {
	g, starts := catchUpGroup(t, 6)
	end := g.NextOffset()
	const readers = 6
	var wg sync.WaitGroup
	for k := range readers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(k), 3))
			r := g.NewReader()
			defer r.Close()
			next := rng.Uint64N(end)
			if k < len(starts) {
				next = starts[k] + uint64(k)
			}
			for range 300 { // each compared with Group.Read, which loads a segment a call
				n := 1 + rng.IntN(100)
				if rng.IntN(2) == 0 {
					n = 1
				}
				maxBytes := []int{1 << 20, 1000, 200}[rng.IntN(3)]
				recs, err := r.Read(next, n, maxBytes)
				if err != nil {
					t.Errorf("reader %d: Read(%d): %v", k, next, err)
					return
				}
				want, err := g.Read(next, n, maxBytes)
				if err != nil {
					t.Errorf("reader %d: Group.Read(%d): %v", k, next, err)
					return
				}
				if len(recs) != len(want) && len(recs) > 0 && len(want) > 0 {
					t.Errorf("reader %d: Read(%d, %d, %d): %d records, Group.Read %d", k, next, n, maxBytes, len(recs), len(want))
					return
				}
				for i, rec := range recs {
					if rec.Offset != next || !bytes.Equal(rec.Value, catchUpValue(next)) || rec.Timestamp != want[i].Timestamp {
						t.Errorf("reader %d: record at %d has offset %d, value naming %d", k, next, rec.Offset, rec.Value[:8])
						return
					}
					next++
				}
			}
		})
	}
	// Meanwhile more entries are committed: older ones leave the tail.
	for i := 0; i < 50 && !t.Failed(); i++ {
		commitValues(t, g, catchUpEntry)
	}
	wg.Wait()
	if held := g.readersHeld.Load(); held != 0 {
		t.Fatalf("closed Readers still count %d bytes held", held)
	}
}

// TestReaderKeepsBounded: Readers at one record a read in entries larger
// than readerHold keep at most readerHold each, in buffers of their own,
// and a group's Readers at most readersHold together; they read each
// record once, in order, for far less than an entry per record, and
// Close lets go of what they keep.
func TestReaderKeepsBounded(t *testing.T) {
	c := newCluster(t, 1, 12, func(cfg *Config) { cfg.SegmentSize, cfg.TailBytes = 1<<20, 64<<10 })
	g := c.waitLeader()
	const perEntry = 512 // about 70 KiB of records an entry
	for range 12 {
		commitValues(t, g, perEntry)
	}
	readers := make([]*Reader, 80)
	next := make([]uint64, len(readers))
	for k := range readers {
		readers[k], next[k] = g.NewReader(), uint64(k*37)
	}
	for range 300 {
		for k, r := range readers {
			recs, err := r.Read(next[k], 1, 1<<20)
			if err != nil || len(recs) != 1 || recs[0].Offset != next[k] || !bytes.Equal(recs[0].Value, catchUpValue(next[k])) {
				t.Fatalf("reader %d: Read(%d): %d records, %v", k, next[k], len(recs), err)
			}
			next[k]++
			if r.kept > readerHold {
				t.Fatalf("reader %d keeps %d bytes, more than %d", k, r.kept, readerHold)
			}
			for _, rec := range r.keep {
				if cap(rec.Value) > len(rec.Value) || cap(rec.Key) > len(rec.Key) {
					t.Fatalf("reader %d keeps a record that aliases its entry's buffer", k)
				}
			}
		}
		if held := g.readersHeld.Load(); held > readersHold || held <= 0 {
			t.Fatalf("the group's Readers keep %d bytes, want some and at most %d", held, readersHold)
		}
	}
	for _, r := range readers {
		r.Close()
	}
	if held := g.readersHeld.Load(); held != 0 {
		t.Fatalf("closed Readers still count %d bytes held", held)
	}
}

// catchUpRetentionEntry is how many records the entries of
// TestReaderAcrossRetention hold.
const catchUpRetentionEntry = 8

// TestReaderAcrossRetention: retention drops segments under Readers
// placed in them and rewrites the segment it cuts in. A Reader whose next
// record was dropped gets ErrOutOfRange, as Group.Read does; one past the
// cut reads every record on, right, to the end; no removed segment file
// stays open.
func TestReaderAcrossRetention(t *testing.T) {
	c := newCluster(t, 1, 13, func(cfg *Config) {
		cfg.SegmentSize, cfg.TailBytes, cfg.RetentionBytes = 16<<10, 4<<10, 100<<10
	})
	g := c.waitLeader()
	for range 1200 / catchUpRetentionEntry {
		commitValues(t, g, catchUpRetentionEntry)
	}
	end := g.NextOffset()
	readers := make([]*Reader, 12)
	next := make([]uint64, len(readers))
	for k := range readers {
		readers[k], next[k] = g.NewReader(), uint64(k)*100+3
		if _, err := readers[k].Read(next[k], 1, 0); err != nil {
			t.Fatal(err)
		}
		next[k]++
		defer readers[k].Close()
	}
	// The first segment's file is kept open for Readers now (the next
	// entry of it is read: the first's records are kept); retention
	// removes it, and the group closes it.
	next[0] += catchUpRetentionEntry
	if _, err := readers[0].Read(next[0], 1, 0); err != nil {
		t.Fatal(err)
	}
	next[0]++
	if retain(t, g, time.Now()) == 0 {
		t.Fatal("retention dropped nothing")
	}
	if held := deletedHeldUnder(t, g.cfg.Dir); len(held) > 0 {
		t.Fatalf("after retention the process holds removed segment files open: %v", held)
	}
	first := g.FirstOffset()
	var out, on int
	for k, r := range readers {
		if next[k] < first {
			_, err := r.Read(next[k], 1, 0)
			_, gerr := g.Read(next[k], 1, 0)
			if !errors.Is(err, ErrOutOfRange) || err.Error() != gerr.Error() {
				t.Fatalf("reader %d at %d, below the first offset %d: %v, want %v", k, next[k], first, err, gerr)
			}
			out++
			continue
		}
		for next[k] < end {
			recs, err := r.Read(next[k], 1+k%3, 0)
			if err != nil || len(recs) == 0 {
				t.Fatalf("reader %d: Read(%d): %d records, %v", k, next[k], len(recs), err)
			}
			for _, rec := range recs {
				if rec.Offset != next[k] || !bytes.Equal(rec.Value, catchUpValue(next[k])) {
					t.Fatalf("reader %d: record at %d has offset %d", k, next[k], rec.Offset)
				}
				next[k]++
			}
		}
		on++
	}
	if out == 0 || on == 0 {
		t.Fatalf("cut at %d: %d readers out of range, %d read on: want some of each", first, out, on)
	}
}

// TestReaderDamageAsRead: an old entry that does not verify (a bit
// flipped in its segment file) is reported by a Reader as Group.Read
// reports it; the records before it are read, and the Reader reads on
// past it.
func TestReaderDamageAsRead(t *testing.T) {
	g, starts := catchUpGroup(t, 4)
	// Flip a bit in the tenth entry of the second segment.
	segs, _, err := tidseg.List(g.cfg.Dir)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(segs[1].Path)
	if err != nil {
		t.Fatal(err)
	}
	pos := 0
	for range 9 {
		_, n, ok := tidseg.NextEntry(data[pos:])
		if !ok {
			t.Fatal("segment too short")
		}
		pos += n
	}
	_, n, _ := tidseg.NextEntry(data[pos:])
	f, err := os.OpenFile(segs[1].Path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{data[pos+n-5] ^ 0x10}, int64(pos+n-5)); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	// tidwall reads the segment from disk again once two others took its
	// place in its cache.
	for _, seg := range []tidseg.Segment{segs[0], segs[2]} {
		if _, _, _, err := g.st.readEntry(seg.Index); err != nil {
			t.Fatal(err)
		}
	}
	damaged, _, _ := g.offs.locate(starts[1])
	damaged += 9
	_, base, _ := g.offs.locate(g.offs.nextAfter(damaged - 1))
	r := g.NewReader()
	defer r.Close()
	next := starts[1] + 1
	for next < base {
		recs, err := r.Read(next, int(min(1+next%7, base-next)), 1<<20)
		if err != nil || len(recs) == 0 {
			t.Fatalf("Read(%d) before the damaged entry at %d: %d records, %v", next, base, len(recs), err)
		}
		for _, rec := range recs {
			if rec.Offset != next || !bytes.Equal(rec.Value, catchUpValue(next)) {
				t.Fatalf("record at %d has offset %d", next, rec.Offset)
			}
			next++
		}
	}
	_, err = r.Read(next, 5, 1<<20)
	_, gerr := g.Read(next, 5, 1<<20)
	if !errors.Is(err, ErrCorrupt) || gerr == nil || err.Error() != gerr.Error() {
		t.Fatalf("Read at the damaged entry: %v; Group.Read: %v", err, gerr)
	}
	// A read that reaches the damaged entry returns the records before it;
	// the next read, from the damaged entry, the error.
	r2 := g.NewReader()
	defer r2.Close()
	for _, read := range []func(uint64, int, int) ([]wal.Record, error){r2.Read, g.Read} {
		recs, err := read(base-2, 5, 1<<20)
		if err != nil || len(recs) != 2 || recs[0].Offset != base-2 || recs[1].Offset != base-1 {
			t.Fatalf("Read(%d, 5) up to the damaged entry at %d: %d records, %v", base-2, base, len(recs), err)
		}
		if recs, err := read(base, 5, 1<<20); !errors.Is(err, ErrCorrupt) || len(recs) != 0 {
			t.Fatalf("Read at the damaged entry after a partial read: %d records, %v", len(recs), err)
		}
	}
	after := g.offs.nextAfter(damaged)
	recs, err := r.Read(after, 3, 1<<20)
	if err != nil || len(recs) != 3 || recs[0].Offset != after || !bytes.Equal(recs[2].Value, catchUpValue(after+2)) {
		t.Fatalf("Read past the damaged entry at %d: %d records, %v", after, len(recs), err)
	}
}

// deletedHeldUnder returns the files of dir that this process holds open
// and that were removed.
func deletedHeldUnder(t *testing.T, dir string) []string {
	t.Helper()
	var held []string
	for _, f := range heldUnder(t, dir) {
		if strings.HasSuffix(f, " (deleted)") {
			held = append(held, f)
		}
	}
	return held
}

// TestReaderFilesClosedOnClose: the segment files a group keeps open for
// Readers are closed when the group closes, and its Readers read no more.
func TestReaderFilesClosedOnClose(t *testing.T) {
	c := newCluster(t, 1, 14, func(cfg *Config) { cfg.SegmentSize, cfg.TailBytes = 4<<10, -1 })
	g := c.waitLeader()
	c.commitRange(0, 100)
	own := len(heldUnder(t, g.cfg.Dir))
	r := g.NewReader()
	defer r.Close()
	for _, from := range []uint64{0, 50} {
		if recs, err := r.Read(from, 1, 0); err != nil || len(recs) != 1 {
			t.Fatalf("Read(%d): %d records, %v", from, len(recs), err)
		}
	}
	if held := heldUnder(t, g.cfg.Dir); len(held) != own+2 {
		t.Fatalf("the group holds %v open with Readers, want two segment files more than its own %d", held, own)
	}
	dir := g.cfg.Dir
	c.kill(g.ID())
	if held := heldUnder(t, dir); len(held) > 0 {
		t.Fatalf("after Close the process holds files of the group open: %v", held)
	}
	// A Reader of a closed group reads no more, as Group.Read.
	_, err := r.Read(20, 1, 0)
	_, gerr := g.Read(20, 1, 0)
	if !errors.Is(err, ErrClosed) || gerr == nil || err.Error() != gerr.Error() {
		t.Fatalf("Read of a closed group: %v; Group.Read: %v", err, gerr)
	}
}

// heldUnder returns the files of dir this process holds open.
func heldUnder(t *testing.T, dir string) []string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd here")
	}
	var held []string
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && strings.HasPrefix(target, dir+string(os.PathSeparator)) {
			held = append(held, target)
		}
	}
	return held
}
