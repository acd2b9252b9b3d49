package replica

import (
	"sync"
	"unsafe"

	"github.com/felix-broker/felix/wal"
)

// entryTail keeps the most recently applied entries in memory, bounded by
// bytes, so that reads of recent committed records (live subscribers) come
// from memory instead of tidwall: no disk read, no tidwall lock, no
// checksum pass, and each entry is decoded once (by its first reader) for
// every reader after it. Entries are kept as raft handed them to apply
// (committed, never truncated in this stage, never modified afterwards),
// so a read from the tail returns what a read from disk would.
//
// The run goroutine adds entries; readers get them, and store an entry's
// decoded records, under the lock.
type entryTail struct {
	mu    sync.RWMutex
	max   int         // bytes kept at most; 0 keeps none
	first uint64      // raft index of slots[head]
	slots []tailEntry // consecutive applied entries from first
	head  int         // slots[:head] were evicted
	bytes int
}

// tailEntry is one applied entry: its data (nil if it holds no records or
// is not kept) and, once a reader decoded them, its records, which alias
// data.
type tailEntry struct {
	data []byte
	recs []wal.Record
}

// recordCost is what a decoded record costs the tail beyond the entry's
// data, which its key and value alias.
const recordCost = int(unsafe.Sizeof(wal.Record{}))

func (e tailEntry) size() int { return len(e.data) + len(e.recs)*recordCost }

func newEntryTail(maxBytes int) *entryTail { return &entryTail{max: max(maxBytes, 0)} }

// add keeps the data of entry index, applied right after the last one
// added. data is nil for an entry without records.
func (t *entryTail) add(index uint64, data []byte) {
	if t.max == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if n := len(t.slots) - t.head; n == 0 || index != t.first+uint64(n) {
		clear(t.slots)
		t.slots, t.head, t.bytes, t.first = t.slots[:0], 0, 0, index
	}
	if len(data) > t.max/2 {
		data = nil // would evict most of the rest for one entry: read from disk
	}
	t.slots = append(t.slots, tailEntry{data: data})
	t.bytes += len(data)
	t.evict()
}

// evict drops the oldest entries until the tail is within its bound, and
// compacts the slice now and then. Callers hold t.mu.
func (t *entryTail) evict() {
	for t.bytes > t.max && t.head < len(t.slots) {
		t.bytes -= t.slots[t.head].size()
		t.slots[t.head] = tailEntry{}
		t.head++
		t.first++
	}
	if t.head > 64 && t.head > len(t.slots)/2 {
		n := copy(t.slots, t.slots[t.head:])
		clear(t.slots[n:])
		t.slots, t.head = t.slots[:n], 0
	}
}

// get returns entry index if the tail holds it.
func (t *entryTail) get(index uint64) (tailEntry, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if index < t.first || index-t.first >= uint64(len(t.slots)-t.head) {
		return tailEntry{}, false
	}
	e := t.slots[t.head+int(index-t.first)]
	return e, e.data != nil
}

// decoded stores the records a reader decoded from entry index's data, if
// the tail still holds the entry, for the readers after it.
func (t *entryTail) decoded(index uint64, recs []wal.Record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if index < t.first || index-t.first >= uint64(len(t.slots)-t.head) {
		return
	}
	e := &t.slots[t.head+int(index-t.first)]
	if e.data == nil || e.recs != nil {
		return
	}
	e.recs = recs
	t.bytes += len(recs) * recordCost
	t.evict()
}
