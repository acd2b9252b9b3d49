package wal

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/felix-broker/felix/internal/tidseg"
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
		var err error
		if cut, err = l.truncateFront(cut); err != nil {
			return 0, err
		}
	}
	return cut - first, errors.Join(errs...)
}

// Expiry returns when retention by age will drop the log's oldest
// segment whole: its date (see ageCut: the newest timestamp of its
// records that verify, capped by the file's last modification) plus
// RetentionAge; for a log of one segment, when every record in it has
// expired. ok is false when no pass will drop anything by age until
// records are appended: the log has no age limit, or holds no records.
//
// It is for a caller that closes the log and must know when to open it
// again for retention (the log's own passes stop with Close): whole
// segments, so that a log holding a long history is opened about once a
// segment rather than once a pass. It reads the oldest segment file
// once, through a buffer.
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
	if len(segs) == 0 {
		return time.Time{}, false, nil
	}
	// Retention passes wait for us, and commits only add to the last
	// segment: below next, what is read is what a pass would date.
	s := segs[0]
	date, dated := s.ModTime.Add(clockStep).UnixNano(), false // a segment no record of which verifies
	err = l.scanRecords(s, next, func(_ uint64, rec *Record) bool {
		if rec != nil {
			ts := s.Dated(rec.Timestamp, clockStep)
			if !dated || ts > date {
				date, dated = ts, true
			}
		}
		return true
	})
	if err != nil {
		return time.Time{}, false, fmt.Errorf("wal: shard %q: %w", l.name, err)
	}
	return time.Unix(0, date).Add(l.opts.RetentionAge), true, nil
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

// ageCut returns the first offset to keep: minTS is the oldest commit
// timestamp kept. Whole segments go from the front while they are old: a
// segment is dated by the newest timestamp of its records that verify,
// each capped by the file's last modification, which the same wall clock
// stamped (tidseg.Segment.Dated, allowing clockStep for the file times'
// coarse clock). So a record stamped while the clock was far ahead for a
// moment holds its segment only until the file is old, and the pass goes
// on past it; a segment no record of which verifies is dated by its file
// alone. In the first segment kept (the one being written included), the
// records before its first one that verifies and is dated at least minTS
// go, a damaged one among them with the record after it that verifies (a
// damaged header's timestamp is never trusted: one zeroed once dated a
// segment of fresh records as old, and they were dropped).
//
// Commit timestamps follow the wall clock back across a step (commit.go),
// so they may go down with the offset: nothing here assumes they don't.
// A segment is read only when its file is not old, and only up to its
// first record that is not.
func (l *Log) ageCut(segs []segmentFile, first, next uint64, minTS int64) (uint64, error) {
	cut := first
	for i, s := range segs {
		end := next // the first offset after the segment, below next
		if i+1 < len(segs) {
			end = min(segs[i+1].Index-1, next)
		}
		if s.ModTime.Add(clockStep).UnixNano() < minTS {
			cut = max(cut, end) // written before minTS: every record in it is older
			continue
		}
		young, kept := false, s.Index-1 // kept: after the last old record that verifies
		err := l.scanRecords(s, next, func(off uint64, rec *Record) bool {
			switch {
			case rec == nil:
			case s.Dated(rec.Timestamp, clockStep) >= minTS:
				young = true
				return false
			default:
				kept = off + 1
			}
			return true
		})
		if err != nil {
			return cut, fmt.Errorf("wal: shard %q: retention by age: %w", l.name, err)
		}
		if !young && kept > s.Index-1 && i+1 < len(segs) {
			cut = max(cut, end) // its newest record that verifies is old
			continue
		}
		return min(max(cut, kept), next), nil
	}
	return min(cut, next), nil
}

// scanRecords calls fn with each record of segment s below offset next,
// oldest first, until fn returns false; rec is nil for a record that does
// not verify. It reads the file through a buffer (the records fn gets
// alias it), and stops at the end of s.Size or at a length no record has.
func (l *Log) scanRecords(s segmentFile, next uint64, fn func(off uint64, rec *Record) bool) error {
	f, err := os.Open(s.Path)
	if err != nil {
		return err
	}
	defer f.Close()
	r := bufio.NewReader(f)
	var buf []byte
	for off, left := s.Index-1, s.Size; off < next; off++ {
		size, err := binary.ReadUvarint(r)
		if size > uint64(left) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil // the end, or a length no record has
		}
		if err != nil {
			return fmt.Errorf("read segment %q: %w", s.Path, err)
		}
		buf = slices.Grow(buf[:0], int(size))[:size]
		if _, err := io.ReadFull(r, buf); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return nil
			}
			return fmt.Errorf("read segment %q: %w", s.Path, err)
		}
		left -= int64(uvarintLen(int(size))) + int64(size)
		var p *Record
		if rec, err := decodeRecord(l.name, buf, off); err == nil {
			p = &rec
		}
		if !fn(off, p) {
			return nil
		}
	}
	return nil
}

// truncateFront drops the records before offset cut. Once tidwall has
// rewritten the segment files, a failure to follow it (to open the new
// tail, or to fsync the directory holding its new name) fails the log:
// commits would fdatasync the unlinked old tail, or a file whose name a
// crash may take, and ack records that are not durable.
//
// A cut that falls past the entries its segment file holds (a segment
// emptied, or cut short at an entry boundary: tidwall's TruncateFront
// panics on it before it changes any file) goes on to the next
// segment: the offsets between are damaged, none is served. It returns
// the cut made.
func (l *Log) truncateFront(cut uint64) (uint64, error) {
	l.tail.Lock()
	defer l.tail.Unlock()
	// The new first offset is durable before any record goes: a log
	// whose segments start above it lost them (hwm.go).
	if err := l.hwm.setFirst(cut); err != nil {
		return 0, fmt.Errorf("wal: shard %q: record the first offset %d: %w", l.name, cut, err)
	}
	err := tidseg.TruncateFront(l.tw, cut+1)
	if errors.Is(err, tidseg.ErrShortSegment) {
		if segs, _, lerr := listSegments(l.dir); lerr == nil {
			for _, s := range segs {
				if s.Index > cut+1 && s.Index-1 <= l.next.Load() {
					l.logger.Warn("wal: retention's cut falls in a damaged segment; it drops the segment's damaged rest", "shard", l.name, "cut", cut, "to", s.Index-1)
					cut = s.Index - 1
					if err = l.hwm.setFirst(cut); err == nil {
						err = tidseg.TruncateFront(l.tw, cut+1)
					}
					break
				}
			}
		}
	}
	if err != nil {
		return 0, fmt.Errorf("wal: shard %q: truncate front to offset %d: %w", l.name, cut, err)
	}
	err = l.followTruncate(cut)
	if err != nil {
		err = fmt.Errorf("wal: shard %q: after truncating the front to offset %d: %w: %w", l.name, cut, ErrFailed, err)
		l.tail.lost = err
		l.logger.Error("wal: retention rewrote the segments and the log could not follow; it commits no more records until reopened", "shard", l.name, "err", err)
		return 0, err
	}
	return cut, nil
}

// followTruncate brings the log's view of its files in line with
// tidwall's after TruncateFront(cut+1). l.tail's lock is held.
func (l *Log) followTruncate(cut uint64) error {
	l.first.Store(cut)
	l.scans.drop() // the segment files were rewritten
	l.files.Drop(false)
	if cut+1 >= l.tail.index {
		// tidwall rewrote the tail segment into a new file named after cut.
		if err := l.openTail(cut + 1); err != nil {
			return err
		}
	}
	if err := l.measure(); err != nil {
		return err
	}
	return syncDir(l.dir)
}
