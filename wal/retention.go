package wal

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"time"
)

// runRetention is the retention goroutine, owned by the Log and stopped by
// Close.
func (l *Log) runRetention() {
	defer l.wg.Done()
	t := time.NewTicker(l.opts.RetentionCheck)
	defer t.Stop()
	for {
		select {
		case <-l.quit:
			return
		case now := <-t.C:
			l.enforceRetention(now)
		}
	}
}

// enforceRetention is EnforceRetention for the Log's own passes: a
// failure is logged, and the next pass tries again.
func (l *Log) enforceRetention(now time.Time) {
	if _, err := l.EnforceRetention(now); err != nil && !errors.Is(err, ErrClosed) {
		l.logger.Warn("wal: retention pass failed", "shard", l.name, "err", err)
	}
}

// EnforceRetention drops the oldest records that RetentionBytes or
// RetentionAge (relative to now) no longer allow, and returns how many it
// dropped. Size is measured as the size of the segment files. It never drops
// an uncommitted record and never moves NextOffset. The Log also runs it
// every RetentionCheck.
//
// If part of the decision could not be made (e.g. a damaged record where the
// age cut would fall), it drops what it safely can and returns the error.
func (l *Log) EnforceRetention(now time.Time) (dropped uint64, err error) {
	if l.opts.RetentionBytes <= 0 && l.opts.RetentionAge <= 0 {
		return 0, nil
	}
	l.retention.Lock()
	defer l.retention.Unlock()
	if l.retention.closed {
		return 0, ErrClosed
	}
	first, next := l.first.Load(), l.next.Load()
	if first >= next {
		return 0, nil
	}
	l.tail.Lock()
	segs, err := l.dataSegments()
	l.tail.Unlock()
	if err != nil {
		return 0, err
	}
	cut := first
	var errs []error
	if l.opts.RetentionBytes > 0 {
		c, err := l.sizeCut(segs, first, next)
		cut = max(cut, c)
		errs = append(errs, err)
	}
	if l.opts.RetentionAge > 0 {
		c, err := l.ageCut(segs, first, next, now.Add(-l.opts.RetentionAge).UnixNano())
		cut = max(cut, c)
		errs = append(errs, err)
	}
	cut = min(cut, next)
	if cut > first {
		if err := l.truncateFront(cut); err != nil {
			return 0, err
		}
	}
	return cut - first, errors.Join(errs...)
}

// Expiry returns when retention by age will drop the log's oldest
// segment whole: when the first record of the next segment that
// verifies (no older than any record before it) is older than
// RetentionAge; for a log of one segment, when its newest record that
// verifies is, and every record has expired. ok is false when no pass
// will drop anything by age until records are appended: the log has no
// age limit, holds no records, or none that can be dated.
//
// It is for a caller that closes the log and must know when to open it
// again for retention (the log's own passes stop with Close): whole
// segments, so that a log holding a long history is opened about once a
// segment rather than once a pass. It reads the start of one segment
// file, or the newest records of the one segment, which tidwall holds in
// memory.
func (l *Log) Expiry() (at time.Time, ok bool, err error) {
	if l.opts.RetentionAge <= 0 {
		return time.Time{}, false, nil
	}
	l.retention.Lock()
	defer l.retention.Unlock()
	if l.retention.closed {
		return time.Time{}, false, ErrClosed
	}
	first, next := l.first.Load(), l.next.Load()
	if first >= next {
		return time.Time{}, false, nil
	}
	l.tail.Lock()
	segs, err := l.dataSegments()
	l.tail.Unlock()
	if err != nil {
		return time.Time{}, false, err
	}
	var ts int64
	if len(segs) > 1 {
		ts, ok, err = l.firstTimestamp(segs[1])
		if err != nil {
			return time.Time{}, false, fmt.Errorf("wal: shard %q: %w", l.name, err)
		}
	}
	if !ok {
		// One segment, or none after the first dates it: the newest
		// record of the first (tidwall indexes first+1 up to the next
		// segment's first; retention passes wait for us, and commits
		// only add to the last segment).
		last := next
		if len(segs) > 1 && segs[1].Index-1 > first && segs[1].Index-1 < last {
			last = segs[1].Index - 1
		}
		if ts, ok = l.newestTimestamp(first+1, last); !ok {
			return time.Time{}, false, nil
		}
	}
	return time.Unix(0, ts).Add(l.opts.RetentionAge), true, nil
}

// newestTimestamp returns the timestamp of the newest record that
// verifies among the 64 newest of tidwall indexes from..to; ok is false
// if none does (or to < from).
func (l *Log) newestTimestamp(from, to uint64) (ts int64, ok bool) {
	for i := to; i >= from && i > 0 && i+64 > to; i-- {
		data, err := l.twRead(i)
		if err != nil {
			return 0, false
		}
		if rec, err := decodeRecord(l.name, data, i-1); err == nil {
			return rec.Timestamp, true
		}
	}
	return 0, false
}

// sizeCut returns the first offset to keep so the files hold at most
// RetentionBytes.
func (l *Log) sizeCut(segs []segmentFile, first, next uint64) (uint64, error) {
	var total int64
	for _, s := range segs {
		total += s.Size
	}
	excess := total - l.opts.RetentionBytes
	cut := first
	for i, s := range segs {
		if excess <= 0 {
			break
		}
		if s.Size <= excess && i+1 < len(segs) {
			excess -= s.Size // drop the whole segment
			cut = segs[i+1].Index - 1
			continue
		}
		// Drop records from the front of this segment.
		data, err := os.ReadFile(s.Path)
		if err != nil {
			return cut, fmt.Errorf("wal: shard %q: read segment %q: %w", l.name, s.Path, err)
		}
		off := s.Index - 1
		for pos := 0; excess > 0 && off < next; off++ {
			_, n, ok := nextEntry(data[pos:])
			if !ok {
				break
			}
			pos += n
			excess -= int64(n)
		}
		cut = off
		break
	}
	return min(cut, next), nil
}

// ageCut returns the first offset to keep: the first record whose
// timestamp is at least minTS, or a damaged record that cannot be dated.
// Commit timestamps never decrease with the offset, so a record that
// verifies dates every record before it (damaged ones included) as no
// newer, and segments are ordered by their first verified record. A
// damaged header's timestamp is never trusted: one zeroed once dated a
// segment of fresh records as old, and they were dropped.
func (l *Log) ageCut(segs []segmentFile, first, next uint64, minTS int64) (uint64, error) {
	var ferr error
	j := sort.Search(len(segs), func(i int) bool {
		ts, ok, err := l.firstTimestamp(segs[i])
		if err != nil {
			ferr = err
			return true
		}
		return !ok || ts >= minTS // a segment with no record that verifies holds nothing known to be old
	})
	if ferr != nil {
		return first, fmt.Errorf("wal: shard %q: retention by age: %w", l.name, ferr)
	}
	if j == 0 {
		return first, nil
	}
	// Every record before segment j-1's first verified one is older than
	// minTS; find the cut in j-1.
	s := segs[j-1]
	data, err := os.ReadFile(s.Path)
	if err != nil {
		return first, fmt.Errorf("wal: shard %q: read segment %q: %w", l.name, s.Path, err)
	}
	cut := s.Index - 1
	off := s.Index - 1
	for pos := 0; off < next; off++ {
		entry, n, ok := nextEntry(data[pos:])
		if !ok {
			break
		}
		pos += n
		rec, err := decodeRecord(l.name, entry, off)
		if err != nil {
			continue // dated by the next record that verifies, if it is old
		}
		if rec.Timestamp >= minTS {
			break
		}
		cut = off + 1
	}
	return min(max(cut, first), next), nil
}

// firstTimestamp returns the timestamp of the first record of segment s
// whose checksum verifies; ok is false if none does.
func (l *Log) firstTimestamp(s segmentFile) (ts int64, ok bool, err error) {
	f, err := os.Open(s.Path)
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	r := bufio.NewReader(f)
	var buf []byte
	for off, left := s.Index-1, s.Size; ; off++ {
		size, err := binary.ReadUvarint(r)
		if size > uint64(left) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, false, nil // the end, or a length no record has
		}
		if err != nil {
			return 0, false, fmt.Errorf("read segment %q: %w", s.Path, err)
		}
		buf = slices.Grow(buf[:0], int(size))[:size]
		if _, err := io.ReadFull(r, buf); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return 0, false, nil
			}
			return 0, false, fmt.Errorf("read segment %q: %w", s.Path, err)
		}
		if rec, err := decodeRecord(l.name, buf, off); err == nil {
			return rec.Timestamp, true, nil
		}
		left -= int64(size)
	}
}

// truncateFront drops the records before offset cut.
func (l *Log) truncateFront(cut uint64) error {
	l.tail.Lock()
	defer l.tail.Unlock()
	if err := l.tw.TruncateFront(cut + 1); err != nil {
		return fmt.Errorf("wal: shard %q: truncate front to offset %d: %w", l.name, cut, err)
	}
	if cut+1 >= l.tail.index {
		// tidwall rewrote the tail segment into a new file named after cut.
		if err := l.openTail(cut + 1); err != nil {
			return err
		}
	}
	l.first.Store(cut)
	l.scans.drop() // the segment files were rewritten
	if err := l.measure(); err != nil {
		return err
	}
	return syncDir(l.dir)
}
