package replica

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"

	"github.com/felix-broker/felix/wal"
)

func TestEntryTailKeepsRecentEntriesWithinBytes(t *testing.T) {
	tl := newEntryTail(100)
	data := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 30) }
	for i := 1; i <= 10; i++ {
		tl.add(uint64(i), data(i))
	}
	// 100 bytes hold the last three 30-byte entries.
	for i := 1; i <= 10; i++ {
		got, ok := tl.get(uint64(i))
		if want := i >= 8; ok != want || ok && !bytes.Equal(got.data, data(i)) {
			t.Fatalf("entry %d: held %v (%d bytes), want %v", i, ok, len(got.data), want)
		}
	}
	if tl.bytes > 100 {
		t.Fatalf("holds %d bytes, the bound is 100", tl.bytes)
	}
	tl.add(11, nil) // an entry without records: nothing to read
	if _, ok := tl.get(11); ok {
		t.Fatal("entry without records is held")
	}
	tl.add(12, make([]byte, 51)) // over half the bound alone: read from disk
	if _, ok := tl.get(12); ok {
		t.Fatal("entry over the bound is held")
	}
	if _, ok := tl.get(10); !ok {
		t.Fatal("an entry over the bound evicted the others")
	}
	tl.add(20, data(20)) // not the next index: start again from it
	if _, ok := tl.get(10); ok {
		t.Fatal("entry 10 held after a gap")
	}
	if got, ok := tl.get(20); !ok || !bytes.Equal(got.data, data(20)) {
		t.Fatal("entry 20 not held")
	}
	for i := 21; i < 2000; i++ { // many evictions: the slice is compacted
		tl.add(uint64(i), data(i))
	}
	if _, ok := tl.get(1999); !ok || len(tl.slots) > 200 {
		t.Fatalf("after many adds: last held %v, %d slots", ok, len(tl.slots))
	}
	// Decoded records count against the bound too.
	tl = newEntryTail(30*10 + recordCost)
	for i := 1; i <= 10; i++ {
		tl.add(uint64(i), data(i))
	}
	tl.decoded(10, make([]wal.Record, 2))
	if e, _ := tl.get(10); len(e.recs) != 2 || tl.bytes > tl.max {
		t.Fatalf("after decoding: %d records kept, %d bytes held of %d", len(e.recs), tl.bytes, tl.max)
	}
	if _, ok := tl.get(1); ok {
		t.Fatal("decoded records did not evict older entries")
	}
	if _, ok := tl.get(5); !ok {
		t.Fatal("decoded records evicted more than they needed")
	}
	off := newEntryTail(-1)
	off.add(1, data(1))
	if _, ok := off.get(1); ok {
		t.Fatal("a tail of no bytes holds an entry")
	}
}

// Reads served from the tail return what reads from disk return.
func TestReadFromTailMatchesDisk(t *testing.T) {
	// 30 entries of about 800 bytes, of which the tail holds about half.
	c := newCluster(t, 3, 24, func(cfg *Config) { cfg.TailBytes = 12 << 10 })
	for k := range 30 {
		var chans []<-chan result
		g := c.waitLeader()
		for i := range 10 {
			chans = append(chans, appendTo(g, fmt.Appendf(nil, "%04d%060d", 10*k+i, i)))
		}
		for i, ch := range chans {
			if r := <-ch; r.err != nil {
				t.Fatalf("append %d: %v", 10*k+i, r.err)
			}
		}
	}
	next := c.waitConverged(300)
	for _, g := range c.running() {
		last, _, _ := g.offs.locate(next - 1)
		first, _, _ := g.offs.locate(0)
		if _, ok := g.tail.get(last); !ok {
			t.Fatalf("replica %d: the last entry is not in the tail", g.ID())
		}
		if _, ok := g.tail.get(first); ok {
			t.Fatalf("replica %d: the first entry is still in the tail", g.ID())
		}
		// Twice: decoded by the first pass, from the decoded records then.
		for pass := 0; pass < 2; pass++ {
			for from := uint64(0); from < next; from += 7 {
				mem, err := g.Read(from, 50, 1<<20)
				if err != nil {
					t.Fatal(err)
				}
				disk, err := g.offs.read(newEntryTail(0), g.cfg.Name, diskEntries{g.st}, from, 50, 1<<20)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(mem, disk) {
					t.Fatalf("replica %d pass %d from %d: the tail and the disk disagree", g.ID(), pass, from)
				}
			}
		}
	}
}
