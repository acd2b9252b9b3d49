package wal

import (
	"errors"
	"fmt"
	"sync"

	tidwall "github.com/tidwall/wal"
)

// ring holds the most recent committed records, so live readers never touch
// the disk or tidwall's lock. Its lock is its own: readers do not contend
// with the committer's write or fsync, only with its brief push.
type ring struct {
	mu    sync.RWMutex
	buf   []Record // record at offset o is buf[o%len(buf)]
	start uint64   // offset of the oldest record held
	n     int      // records held: offsets [start, start+n)
}

func (r *ring) reset(capacity int, next uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf = make([]Record, capacity)
	r.start, r.n = next, 0
}

// push appends records with consecutive offsets following the ones held.
func (r *ring) push(recs []Record) {
	if len(recs) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c := len(r.buf)
	if len(recs) >= c {
		recs = recs[len(recs)-c:]
		r.start, r.n = recs[0].Offset, 0
	}
	for i := range recs {
		r.buf[recs[i].Offset%uint64(c)] = recs[i]
		if r.n < c {
			r.n++
		} else {
			r.start++
		}
	}
}

// read copies records from offset from on; ok is false if from is older
// than the ring.
func (r *ring) read(from uint64, maxRecords, maxBytes int) (out []Record, ok bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	end := r.start + uint64(r.n)
	if from < r.start || from >= end {
		return nil, false
	}
	n := min(uint64(maxRecords), end-from)
	out = make([]Record, 0, n)
	bytes := 0
	c := uint64(len(r.buf))
	for off := from; off < from+n; off++ {
		rec := &r.buf[off%c]
		sz := readSize(rec)
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
// A record that fails its checksum is never returned: Read stops before it,
// and a read starting at it returns a *CorruptError.
//
// Recent records come from memory; older ones from disk. Returned records
// may share memory with the Log: do not modify them.
func (l *Log) Read(from uint64, maxRecords int, maxBytes int) ([]Record, error) {
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
	if recs, ok := l.ring.read(from, maxRecords, maxBytes); ok {
		return recs, nil
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
		sz := readSize(&rec)
		if len(out) > 0 && maxBytes > 0 && bytes+sz > maxBytes {
			break
		}
		out = append(out, rec)
		bytes += sz
	}
	return out, nil
}

// readOne reads and verifies the committed record at off from tidwall.
func (l *Log) readOne(off uint64) (Record, error) {
	data, err := l.twRead(off + 1)
	switch {
	case err == nil:
		return decodeRecord(l.name, data, off)
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
		return Record{}, &CorruptError{Shard: l.name, Offset: off, Reason: "segment holding it is unreadable", Err: err}
	default:
		return Record{}, fmt.Errorf("wal: shard %q: read offset %d: %w", l.name, off, err)
	}
}

// twRead reads tidwall index i. It serialises tidwall reads (tidwall
// mutates its segment cache under its read lock, so concurrent reads race)
// and turns a tidwall panic on a damaged segment into ErrCorrupt.
func (l *Log) twRead(i uint64) (data []byte, err error) {
	l.readMu.Lock()
	defer l.readMu.Unlock()
	defer func() {
		if p := recover(); p != nil {
			data, err = nil, fmt.Errorf("%w: reading index %d panicked: %v", tidwall.ErrCorrupt, i, p)
		}
	}()
	return l.tw.Read(i)
}
