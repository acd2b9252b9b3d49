package replica

import (
	"fmt"
	"sort"
	"sync"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/felix-broker/felix/wal"
)

// offsetIndex maps offsets to the committed entries that hold them. Offsets
// are assigned as entries apply, in log order, so every replica assigns the
// same: the entry at firstIndex+k holds offsets [bases[k], bases[k+1]) (up
// to next for the last one); an entry without records holds none. It is
// rebuilt after a restart by applying the committed entries again (raft
// hands them over from Config.Applied on): nothing of it is persisted but
// the compaction point's offset in the state file.
//
// The run goroutine adds entries and publishes; readers take the read
// lock. It costs 8 bytes per entry, that is per group-commit batch.
type offsetIndex struct {
	mu         sync.RWMutex
	firstIndex uint64   // raft index of bases[0]
	bases      []uint64 // first offset of each applied entry from firstIndex on
	first      uint64   // first offset Read can return
	next       uint64   // the offset the next committed record gets
	published  uint64   // next, as readers see it
	changed    chan struct{}
}

func (o *offsetIndex) reset(firstIndex, next uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.firstIndex, o.bases = firstIndex, nil
	o.first, o.next, o.published = next, next, next
	// Wake whoever waits on the offsets replaced (a snapshot installed):
	// they read again and find where the log now starts.
	if o.changed != nil {
		close(o.changed)
	}
	o.changed = make(chan struct{})
}

// nextAfter returns the offset of the first record after entry index,
// which is applied and at or after the compaction point (firstIndex-1).
func (o *offsetIndex) nextAfter(index uint64) uint64 {
	o.mu.RLock()
	defer o.mu.RUnlock()
	if k := index + 1 - o.firstIndex; k < uint64(len(o.bases)) {
		return o.bases[k]
	}
	return o.next
}

// compact forgets the entries before index cut, whose first record (or
// the next one) has offset first: Read starts there now.
func (o *offsetIndex) compact(cut, first uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := min(cut-o.firstIndex, uint64(len(o.bases)))
	o.bases = append([]uint64(nil), o.bases[k:]...)
	o.firstIndex, o.first = cut, first
}

// add records that entry index, the next one in log order, holds n
// records, and returns its first offset. Only the run goroutine calls it.
func (o *offsetIndex) add(index uint64, n int) (uint64, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if want := o.firstIndex + uint64(len(o.bases)); index != want {
		// raft applies each index once, in order; anything else would give
		// one offset to two records, so the group stops.
		return 0, fmt.Errorf("replica: applying entry %d, expected %d", index, want)
	}
	base := o.next
	o.bases = append(o.bases, base)
	o.next += uint64(n)
	return base, nil
}

// publish makes the records added so far visible to readers and wakes
// watchers.
func (o *offsetIndex) publish() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.published == o.next {
		return
	}
	o.published = o.next
	close(o.changed)
	o.changed = make(chan struct{})
}

func (o *offsetIndex) nextOffset() uint64 {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.published
}

func (o *offsetIndex) firstOffset() uint64 {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.first
}

func (o *offsetIndex) watch() (uint64, <-chan struct{}) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.published, o.changed
}

// locate returns the index of the entry holding offset off and the entry's
// first offset, or ok false if off is not published.
func (o *offsetIndex) locate(off uint64) (index, base uint64, ok bool) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	if off < o.first || off >= o.published {
		return 0, 0, false
	}
	// The last entry whose base is at or below off holds it: entries
	// without records share the base of the entry after them.
	k := sort.Search(len(o.bases), func(k int) bool { return o.bases[k] > off }) - 1
	return o.firstIndex + uint64(k), o.bases[k], true
}

// read decodes the records from offset from on out of the entries that
// hold them: from what src kept, else from tail if it holds the entry,
// else from disk through src.
func (o *offsetIndex) read(tail *entryTail, name string, src entrySource, from uint64, max, maxBytes int) ([]wal.Record, error) {
	if first := o.firstOffset(); from < first {
		return nil, fmt.Errorf("replica: group %q: %w: offset %d is below the first retained offset %d", name, ErrOutOfRange, from, first)
	}
	var out []wal.Record
	if n := o.nextOffset(); n > from {
		out = make([]wal.Record, 0, min(uint64(max), n-from))
	}
	bytes := 0
	for len(out) < max {
		index, base, ok := o.locate(from)
		if !ok {
			break
		}
		recs := src.held(from)
		if recs == nil {
			all, err := readRecords(tail, name, src, index, base, from)
			if err == nil && from-base >= uint64(len(all)) {
				err = fmt.Errorf("replica: group %q: %w: entry %d holds %d records from offset %d, not offset %d", name, ErrCorrupt, index, len(all), base, from)
			}
			if err != nil {
				if len(out) > 0 {
					return out, nil // the caller meets the error on its next read, as wal's
				}
				return nil, err
			}
			recs = all[from-base:]
		}
		for _, r := range recs {
			// Headers and producer ids count too, as package wal counts
			// them: a frame of records with large headers must fit.
			size := wal.ReadSize(&r)
			if len(out) >= max || (len(out) > 0 && bytes+size > maxBytes) {
				return out, nil
			}
			out = append(out, r)
			bytes += size
			from++
		}
	}
	return out, nil
}

// entrySource gives offs.read the entries the tail does not hold: the
// storage (Group.Read), or a Reader, which reads by position and keeps a
// few records between reads.
type entrySource interface {
	// held returns the records from offset from on that the source
	// kept, nil if it kept none from there.
	held(from uint64) []wal.Record
	// readEntry reads entry index from disk, verified as
	// storage.readEntry verifies it, with its errors.
	readEntry(index uint64) (pb.EntryType, []byte, error)
	// decoded learns the records of entry index, read from disk.
	decoded(index uint64, recs []wal.Record)
}

// readRecords returns the records of entry index, whose first offset is
// base: from the tail, decoding them there once, or from disk.
func readRecords(tail *entryTail, name string, src entrySource, index, base, from uint64) ([]wal.Record, error) {
	e, inTail := tail.get(index)
	if inTail && e.recs != nil {
		return e.recs, nil
	}
	data := e.data
	if !inTail {
		typ, d, err := src.readEntry(index)
		if err != nil {
			return nil, err
		}
		if typ != pb.EntryNormal {
			return nil, fmt.Errorf("replica: group %q: %w: offset %d maps to entry %d of type %s", name, ErrCorrupt, from, index, typ)
		}
		data = d
	}
	_, recs, err := decodeBatch(data, base)
	if err != nil {
		return nil, fmt.Errorf("replica: group %q: entry %d: %w: %w", name, index, ErrCorrupt, err)
	}
	if inTail {
		tail.decoded(index, recs)
	} else {
		src.decoded(index, recs)
	}
	return recs, nil
}

// entries returns the index after the last entry added.
func (o *offsetIndex) entries() uint64 {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.firstIndex + uint64(len(o.bases))
}
