package wal

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"sync"
	"sync/atomic"

	"github.com/felix-broker/felix/internal/tidseg"
)

// This file reads a segment that tidwall cannot parse, or whose entries do
// not verify as the records tidwall says they are. tidwall parses a segment
// file whole and fails it as a unit: one flipped bit in a length prefix
// would make every record of the segment unreadable, those before the
// damage included. Here the segment file is parsed entry by entry, and past
// damage the parser resynchronises on the next record that verifies.
//
// Offsets. A record found after damage gets the offset stored in its own
// header, which its CRC covers; it is accepted only if that offset lies in
// the segment's range (from its file name to the next file's, or
// NextOffset for the last segment) and after the last record found. The
// offsets of the segment's range that no record holds are the damaged
// range(s). So a damaged length prefix, header or payload costs exactly its
// own record; a cut inside the segment costs the records from the cut to
// the segment's end; bytes that belong to no record (garbage appended)
// cost nothing.

// damage is an inclusive range of offsets no intact record holds, and why.
type damage struct {
	from, to uint64
	reason   string
}

// scannedSegment is a segment file parsed by scanSegment.
type scannedSegment struct {
	name    string
	base    uint64   // offset of the segment's first record
	end     uint64   // one past the last offset the segment may hold
	data    []byte   // the file's bytes; records alias them
	at      [][]byte // at[o-base] is the stored record at offset o, nil if damaged
	damaged []damage
	garbage int // bytes that belong to no record
}

// scanSegment parses data, a segment file whose offsets are [base, end).
func scanSegment(name string, data []byte, base, end uint64) *scannedSegment {
	s := &scannedSegment{name: name, base: base, end: end, data: data}
	if end > base {
		s.at = make([][]byte, end-base)
	}
	pos, expect := 0, base
	for pos < len(data) && expect < end {
		entry, n, ok := nextEntry(data[pos:])
		if ok && verifyRecord(entry, expect, expect+1) {
			s.at[expect-base] = entry
			pos += n
			expect++
			continue
		}
		reason := describeBad(name, data[pos:], expect)
		p, off, found := resync(data, pos+1, expect, end)
		if !found {
			s.garbage += len(data) - pos
			s.damaged = append(s.damaged, damage{expect, end - 1, reason})
			return s
		}
		s.garbage += p - pos
		if off > expect {
			s.damaged = append(s.damaged, damage{expect, off - 1, reason})
		}
		pos, expect = p, off
	}
	if expect < end {
		s.damaged = append(s.damaged, damage{expect, end - 1, "the segment ends before its last record"})
	}
	if !tidseg.ZeroTail(data[pos:]) { // zeros after the last record were preallocated (prealloc.go)
		s.garbage += len(data) - pos
	}
	return s
}

// resync returns the first position p at or after from where an entry
// holding a record that verifies, with an offset in [lo, hi), starts.
// Cheap checks (a plausible length, the version byte, the offset) come
// before the checksum, so a scan costs little more than reading the bytes.
func resync(data []byte, from int, lo, hi uint64) (p int, off uint64, ok bool) {
	for p = from; p < len(data); p++ {
		size, h := binary.Uvarint(data[p:])
		if h <= 0 || size < recordFixed || size > uint64(len(data)-p-h) {
			continue
		}
		rec := data[p+h : p+h+int(size)]
		if rec[versionAt] != recordVersion {
			continue
		}
		off = binary.LittleEndian.Uint64(rec[offsetAt:])
		if off < lo || off >= hi {
			continue
		}
		if crc32.Checksum(rec[versionAt:], castagnoli) == binary.LittleEndian.Uint32(rec[crcAt:]) {
			return p, off, true
		}
	}
	return 0, 0, false
}

// verifyRecord reports whether rec is a stored record whose checksum holds
// and whose offset is in [lo, hi).
func verifyRecord(rec []byte, lo, hi uint64) bool {
	if len(rec) < recordFixed || rec[versionAt] != recordVersion {
		return false
	}
	if off := binary.LittleEndian.Uint64(rec[offsetAt:]); off < lo || off >= hi {
		return false
	}
	return crc32.Checksum(rec[versionAt:], castagnoli) == binary.LittleEndian.Uint32(rec[crcAt:])
}

// describeBad says why the entry at the start of b, which should hold
// offset want, does not verify.
func describeBad(shard string, b []byte, want uint64) string {
	entry, _, ok := nextEntry(b)
	if !ok {
		return "entry length prefix is malformed or runs past the end of the segment"
	}
	if _, err := decodeRecord(shard, entry, want); err != nil {
		if ce, ok := err.(*CorruptError); ok {
			return ce.Reason
		}
		return err.Error()
	}
	return "record does not verify"
}

// damagedAt returns the damaged range holding off, if any.
func (s *scannedSegment) damagedAt(off uint64) (damage, bool) {
	for _, d := range s.damaged {
		if off >= d.from && off <= d.to {
			return d, true
		}
	}
	return damage{}, false
}

// scanCache keeps the last few segments parsed by scanSegment, so readers
// going through a damaged segment parse it once, not once per record.
type scanCache struct {
	any atomic.Bool // a segment was ever scanned: check the cache first

	mu struct {
		sync.Mutex
		segs   []*scannedSegment // most recently used first
		logged map[uint64]bool   // segments whose damage was logged, by base offset
	}
}

const scanCacheSize = 2

// cached returns a scanned segment that covers off, if any.
func (c *scanCache) cached(off uint64) *scannedSegment {
	if !c.any.Load() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, s := range c.mu.segs {
		if off >= s.base && off < s.end {
			copy(c.mu.segs[1:i+1], c.mu.segs[:i])
			c.mu.segs[0] = s
			return s
		}
	}
	return nil
}

// store adds s to the cache and reports whether its damage is new (to be
// logged).
func (c *scanCache) store(s *scannedSegment) (first bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.any.Store(true)
	for i, o := range c.mu.segs {
		if o.base == s.base {
			c.mu.segs = append(c.mu.segs[:i], c.mu.segs[i+1:]...)
			break
		}
	}
	c.mu.segs = append([]*scannedSegment{s}, c.mu.segs...)
	if len(c.mu.segs) > scanCacheSize {
		c.mu.segs[scanCacheSize] = nil
		c.mu.segs = c.mu.segs[:scanCacheSize]
	}
	if len(s.damaged) == 0 && s.garbage == 0 {
		return false
	}
	if c.mu.logged == nil {
		c.mu.logged = make(map[uint64]bool)
	}
	first = !c.mu.logged[s.base]
	c.mu.logged[s.base] = true
	return first
}

// drop forgets every scanned segment (after retention rewrote the files).
func (c *scanCache) drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.mu.segs)
	c.mu.segs = c.mu.segs[:0]
}

// scan parses, itself, the segment file that holds off, and caches it.
func (l *Log) scan(off uint64) (*scannedSegment, error) {
	next := l.next.Load()
	segs, _, err := listSegments(l.dir)
	if err != nil {
		return nil, err
	}
	i := len(segs) - 1
	for i >= 0 && segs[i].Index > off+1 {
		i--
	}
	if i < 0 {
		return nil, fmt.Errorf("wal: shard %q: no segment file holds offset %d", l.name, off)
	}
	seg := segs[i]
	end := next
	if i+1 < len(segs) {
		end = min(segs[i+1].Index-1, next)
	}
	data, err := os.ReadFile(seg.Path)
	if err != nil {
		return nil, fmt.Errorf("wal: shard %q: read segment %q: %w", l.name, seg.Path, err)
	}
	s := scanSegment(segmentName(seg.Index), data, seg.Index-1, end)
	if l.scans.store(s) {
		ranges := make([]string, len(s.damaged))
		for i, d := range s.damaged {
			ranges[i] = fmt.Sprintf("%d-%d (%s)", d.from, d.to, d.reason)
		}
		l.logger.Warn("wal: damaged segment; serving the intact records around the damage",
			"shard", l.name, "file", seg.Path, "damaged_offsets", ranges, "unreadable_bytes", s.garbage)
	}
	return s, nil
}

// readScanned reads the record at off from the parsed segment s. cause is
// what made the reader parse the segment, if anything.
func (l *Log) readScanned(s *scannedSegment, off uint64, cause error) (Record, error) {
	if stored := s.at[off-s.base]; stored != nil {
		return decodeRecord(l.name, stored, off)
	}
	d, ok := s.damagedAt(off)
	if !ok { // cannot happen: every offset of the range is a record or damaged
		d = damage{off, off, "record missing"}
	}
	return Record{}, &CorruptError{
		Shard:  l.name,
		Offset: off,
		From:   max(d.from, l.first.Load()),
		To:     d.to,
		Reason: fmt.Sprintf("segment %s: %s", s.name, d.reason),
		Err:    cause,
	}
}
