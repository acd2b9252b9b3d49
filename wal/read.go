package wal

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	tidwall "github.com/tidwall/wal"

	"github.com/felix-broker/felix/internal/tidseg"
)

// ring holds the most recent committed records, so live readers never touch
// the disk or tidwall's lock. Its lock is its own: readers do not contend
// with the committer's write or fsync, only with its brief push.
//
// It is bounded by records (Options.TailRecords) and by bytes
// (Options.TailBytes, counted by recordMem): the oldest records leave to
// make room. Its slice grows as records arrive and shrinks as they leave,
// so an idle or little-used shard holds little. Records share their
// batch's buffer (see commit): a record of a partly evicted batch keeps the
// rest of that buffer alive, so the memory held is at most about twice
// the bound (a batch mostly over the bound is copied; see push).
type ring struct {
	mu         sync.RWMutex
	maxRecords int
	maxBytes   int64
	buf        []Record // circular: the record at offset start is buf[head]
	head       int
	start      uint64 // offset of the oldest record held
	n          int    // records held: offsets [start, start+n)
	bytes      int64  // recordMem of the records held
}

// recordSlot is what a record costs in the ring beyond its data: its slot,
// and per header the map entry.
const (
	recordSlot  = int64(unsafe.Sizeof(Record{}))
	headerEntry = 64
)

// recordMem is what the ring counts for holding r.
func recordMem(r *Record) int64 {
	n := recordSlot + int64(len(r.Key)+len(r.Value)+len(r.ProducerID))
	for k, v := range r.Headers {
		n += int64(len(k)+len(v)) + headerEntry
	}
	return n
}

func (r *ring) reset(maxRecords int, maxBytes int64, next uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.maxRecords, r.maxBytes = maxRecords, maxBytes
	r.buf, r.head = nil, 0
	r.start, r.n, r.bytes = next, 0, 0
}

// at returns the slot of the record at offset off, which is held.
func (r *ring) at(off uint64) *Record {
	return &r.buf[(r.head+int(off-r.start))%len(r.buf)]
}

// push appends records with consecutive offsets following the ones held;
// arena is the size of the buffer their keys and values share.
func (r *ring) push(recs []Record, arena int) {
	if len(recs) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// Keep the newest of recs that fit the bounds on their own.
	keep, kept := 0, int64(0)
	for i := len(recs) - 1; i >= 0 && keep < r.maxRecords; i-- {
		m := recordMem(&recs[i])
		if kept+m > r.maxBytes {
			break
		}
		kept += m
		keep++
	}
	if keep < len(recs) {
		r.drop(r.n) // everything held is older than what is dropped
		r.start, r.head = recs[len(recs)-keep-1].Offset+1, 0
		recs = recs[len(recs)-keep:]
		if keep == 0 {
			r.shrink()
			return
		}
		if int64(arena) > 2*kept {
			Compact(recs) // do not let a few records keep a big batch's buffer
		}
	}
	// Make room: the oldest records leave.
	for r.n > 0 && (r.n+len(recs) > r.maxRecords || r.bytes+kept > r.maxBytes) {
		r.drop(1)
	}
	if r.n == 0 {
		r.start, r.head = recs[0].Offset, 0
	}
	r.grow(r.n + len(recs))
	for i := range recs {
		*r.at(r.start + uint64(r.n)) = recs[i]
		r.n++
	}
	r.bytes += kept
	r.shrink()
}

// drop lets the k oldest records go.
func (r *ring) drop(k int) {
	for range k {
		rec := &r.buf[r.head]
		r.bytes -= recordMem(rec)
		*rec = Record{}
		r.head = (r.head + 1) % len(r.buf)
		r.start++
		r.n--
	}
}

// grow makes room for need records (need <= maxRecords).
func (r *ring) grow(need int) {
	if need <= len(r.buf) {
		return
	}
	r.resize(min(r.maxRecords, max(need, 2*len(r.buf), 16)))
}

// shrink gives back most of the slice once few records are held.
func (r *ring) shrink() {
	switch {
	case r.n == 0:
		r.buf, r.head = nil, 0
	case len(r.buf) > 16 && r.n <= len(r.buf)/4:
		r.resize(max(16, 2*r.n))
	}
}

func (r *ring) resize(capacity int) {
	buf := make([]Record, capacity)
	for i := range r.n {
		buf[i] = r.buf[(r.head+i)%len(r.buf)]
	}
	r.buf, r.head = buf, 0
}

// Compact copies the keys, values and producer ids of recs into one
// buffer of their own, so that records kept long do not keep the larger
// buffer they were read into (package replica's Readers use it too).
func Compact(recs []Record) {
	n := 0
	for i := range recs {
		n += len(recs[i].Key) + len(recs[i].Value) + len(recs[i].ProducerID)
	}
	buf := make([]byte, 0, n) // never reallocated: the slices below stay valid
	for i := range recs {
		rec := &recs[i]
		if k := len(rec.Key); k > 0 {
			buf = append(buf, rec.Key...)
			rec.Key = buf[len(buf)-k : len(buf) : len(buf)]
		}
		if k := len(rec.Value); k > 0 {
			buf = append(buf, rec.Value...)
			rec.Value = buf[len(buf)-k : len(buf) : len(buf)]
		}
		if k := len(rec.ProducerID); k > 0 {
			buf = append(buf, rec.ProducerID...)
			rec.ProducerID = unsafe.String(&buf[len(buf)-k], k)
		}
	}
}

// stats returns the records and bytes (recordMem) held.
func (r *ring) stats() (records int, bytes int64) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.n, r.bytes
}

// read copies records with offsets from from up to, not including, limit;
// ok is false if from is not held.
//
// limit is the NextOffset the reader observed: a commit pushes its records
// here before it publishes the new NextOffset (so that a reader that sees
// the new end finds them), so the ring may briefly hold records past the
// end a reader knows of. Returning them would let a subscriber run ahead of
// NextOffset, and its next read would be out of range.
func (r *ring) read(from, limit uint64, maxRecords, maxBytes int) (out []Record, ok bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	end := min(r.start+uint64(r.n), limit)
	if from < r.start || from >= end {
		return nil, false
	}
	n := min(uint64(maxRecords), end-from)
	out = make([]Record, 0, n)
	bytes := 0
	for off := from; off < from+n; off++ {
		rec := r.at(off)
		sz := ReadSize(rec)
		if len(out) > 0 && maxBytes > 0 && bytes+sz > maxBytes {
			break
		}
		out = append(out, *rec)
		bytes += sz
	}
	return out, true
}

// Read returns committed records with offsets from from on, in offset order:
// at most maxRecords (<= 0 means 1), and no more than maxBytes of keys,
// values, producer ids and headers (<= 0 means no limit), except that the
// first record is returned whatever its size.
//
// A read at NextOffset returns no records and no error; wait with Watch.
// A read below FirstOffset or above NextOffset returns an *OutOfRangeError.
// Read never returns a record at or past the NextOffset it observed, so a
// reader that goes on after the last record it got never reads past the
// end.
//
// A record that fails its checksum is never returned: Read stops before it,
// and a read starting at it returns a *CorruptError with the whole damaged
// range; the records after it are read from To+1 (see Damage in the
// package doc).
//
// Recent records come from memory; older ones from disk. Returned records
// may share memory with the Log: do not modify them.
//
// Read loads the segment file holding an old record whole (through
// tidwall, which caches two): a reader that goes on from where it left off
// reads at far less cost through a Reader.
func (l *Log) Read(from uint64, maxRecords int, maxBytes int) ([]Record, error) {
	return l.read(nil, from, maxRecords, maxBytes)
}

// read is Read; old records are read by c's position if c is not nil.
func (l *Log) read(c *tidseg.Cursor, from uint64, maxRecords int, maxBytes int) ([]Record, error) {
	if l.closed.Load() {
		return nil, ErrClosed
	}
	if maxRecords <= 0 {
		maxRecords = 1
	}
	next := l.next.Load()
	first := l.first.Load()
	if from < first || from > next {
		return nil, &OutOfRangeError{Shard: l.name, Offset: from, First: first, Next: next}
	}
	if from == next {
		return nil, nil
	}
	if recs, ok := l.ring.read(from, next, maxRecords, maxBytes); ok {
		return recs, nil
	}
	if c != nil {
		if recs, ok := l.readCursor(c, from, next, maxRecords, maxBytes); ok {
			if first := l.first.Load(); from < first {
				// Retention dropped them while they were read.
				return nil, &OutOfRangeError{Shard: l.name, Offset: from, First: first, Next: l.next.Load()}
			}
			return recs, nil
		}
	}
	return l.readLog(from, next, maxRecords, maxBytes)
}

// readLog reads committed records below next from tidwall.
func (l *Log) readLog(from, next uint64, maxRecords, maxBytes int) ([]Record, error) {
	n := min(uint64(maxRecords), next-from, 256)
	out := make([]Record, 0, n)
	bytes := 0
	for off := from; off < next && len(out) < maxRecords; off++ {
		rec, err := l.readOne(off)
		if err != nil {
			if len(out) > 0 {
				return out, nil // the caller meets the error on its next read
			}
			return nil, err
		}
		sz := ReadSize(&rec)
		if len(out) > 0 && maxBytes > 0 && bytes+sz > maxBytes {
			break
		}
		out = append(out, rec)
		bytes += sz
	}
	return out, nil
}

// readOne reads and verifies the committed record at off from disk:
// through tidwall, or, for a segment tidwall cannot parse or whose entry
// at off does not verify, by parsing the segment file itself (damage.go).
func (l *Log) readOne(off uint64) (Record, error) {
	if s := l.scans.cached(off); s != nil {
		return l.readScanned(s, off, nil)
	}
	data, err := l.twRead(off + 1)
	switch {
	case err == nil:
		rec, derr := decodeRecord(l.name, data, off)
		if derr == nil {
			return rec, nil
		}
		err = derr
	case errors.Is(err, tidwall.ErrNotFound):
		// Retention dropped it since we checked.
		first := l.first.Load()
		if fi, ferr := l.tw.FirstIndex(); ferr == nil && fi-1 > first {
			first = fi - 1
		}
		return Record{}, &OutOfRangeError{Shard: l.name, Offset: off, First: first, Next: l.next.Load()}
	case errors.Is(err, tidwall.ErrClosed):
		return Record{}, ErrClosed
	case errors.Is(err, tidwall.ErrCorrupt):
	default:
		return Record{}, fmt.Errorf("wal: shard %q: read offset %d: %w", l.name, off, err)
	}
	// The segment is damaged: tidwall failed on it, or it parsed the
	// segment into entries that are not the records they should be.
	s, serr := l.scan(off)
	if serr != nil {
		return Record{}, &CorruptError{Shard: l.name, Offset: off, From: off, To: off,
			Reason: fmt.Sprintf("segment holding it is unreadable (%v)", serr), Err: err}
	}
	return l.readScanned(s, off, err)
}

// twRead reads tidwall index i. It serialises tidwall reads (tidwall
// mutates its segment cache under its read lock, so concurrent reads race)
// and turns a tidwall panic on a damaged segment into ErrCorrupt.
func (l *Log) twRead(i uint64) (data []byte, err error) {
	l.readMu.Lock()
	defer l.readMu.Unlock()
	return tidseg.Read(l.tw, i)
}
