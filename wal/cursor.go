package wal

import (
	"errors"
	"io"
	"os"
	"slices"
	"sync"

	"github.com/felix-broker/felix/internal/tidseg"
)

// This file reads old records for a reader that reads on from where it
// left off (a subscriber catching up), by file position: the cursor knows
// the segment file and the byte where the entry of its next offset
// starts, and reads from there what the read returns, with bounded
// preads. Log.Read reads through tidwall instead, which loads a whole
// segment (1 MiB) into a cache of two segments on a miss: three readers
// catching up in different segments evicted each other's, and each
// record they were given cost loading a segment (BenchmarkCatchUpRead).
//
// The cursor holds no file and no data between reads: its position only,
// a few dozen bytes, so a broker holding many subscriptions holds little
// for them. Each read reads about what it returns from the segment file,
// opened through Options.FS and kept open in the Log's small cache of
// files (segFiles): an open and a close cost more than the pread.
//
// Every record is verified as readOne verifies it (decodeRecord: its
// checksum, and its own offset); on anything unusual (a file gone, an
// entry that does not verify, a framing it does not expect, a segment the
// wal found damaged) the read goes through Log.Read's path, which reports
// damage and retention as it always does, and the cursor places itself
// afresh at the next read. The entry framing and file names are
// tidwall's (internal/tidseg).

// Reader reads a Log for one consumer that goes on reading from where its
// last read ended, such as a subscription: like Log.Read, and records
// older than the tail held in memory cost about their own bytes read from
// the segment files, however few records each read asks for and however
// many readers read other parts of the log meanwhile.
//
// A Reader holds its position only (56 bytes), no file and no
// data, between reads. It is not safe for concurrent use; many Readers
// may read one Log at once.
type Reader struct {
	l *Log
	c cursor
}

// NewReader returns a Reader of l.
func (l *Log) NewReader() *Reader { return &Reader{l: l} }

// Read is Log.Read, read by position when the records are on disk.
func (r *Reader) Read(from uint64, maxRecords int, maxBytes int) ([]Record, error) {
	return r.l.read(&r.c, from, maxRecords, maxBytes)
}

// cursor is a Reader's position: the entry of offset off starts at byte
// pos of the segment file whose first entry is tidwall index seg (seg 0:
// not placed).
type cursor struct {
	seg uint64
	pos int64
	off uint64
	// entry is the mean size of the entries the last read read, what the
	// next read expects.
	entry int
	// [avoidFrom, avoidTo) are the offsets of a segment the cursor
	// could not read: Log.Read's path serves them.
	avoidFrom, avoidTo uint64
}

const (
	// cursorChunk bounds one pread, and so what a read allocates beyond
	// the records it returns: at most one partial entry per chunk.
	cursorChunk = 64 << 10
	// cursorMinRead is the least a read reads: a length prefix and a
	// small record.
	cursorMinRead = 64
	// cursorEntry is the entry size a cursor expects before it has read.
	cursorEntry = 256
	// cursorSkipMax is the largest entry length place steps over: no
	// segment file is that large.
	cursorSkipMax = 1 << 40
)

// errCursor: the cursor met something it does not read itself.
var errCursor = errors.New("wal: cursor cannot read on")

// readCursor reads records from from, below next, by c's position. ok is
// false if it read none: the caller reads them through readLog.
func (l *Log) readCursor(c *cursor, from, next uint64, maxRecords, maxBytes int) (out []Record, ok bool) {
	if from >= c.avoidFrom && from < c.avoidTo {
		return nil, false
	}
	if l.scans.cached(from) != nil { // a damaged segment, parsed by the wal
		return nil, false
	}
	if c.seg == 0 || c.off != from {
		if err := l.place(c, from); err != nil {
			l.avoid(c, from, next)
			return nil, false
		}
	}
	out, _ = l.readOn(c, next, maxRecords, maxBytes)
	if len(out) == 0 {
		l.avoid(c, from, next)
		return nil, false
	}
	return out, true
}

// avoid makes reads of the segment holding from, which c could not read,
// go through readLog, and unplaces c.
func (l *Log) avoid(c *cursor, from, next uint64) {
	c.seg = 0
	first, after, err := tidseg.Holding(l.dir, from+1)
	if err != nil || first == 0 {
		c.avoidFrom, c.avoidTo = from, from+1
		return
	}
	c.avoidFrom, c.avoidTo = first-1, next
	if after != 0 {
		c.avoidTo = min(after-1, next)
	}
}

// place positions c at offset from: in the segment file that
// holds it, from c's position if that is before from in the same file,
// else from the file's start, stepping over the entries before it (their
// lengths are read, not their records).
func (l *Log) place(c *cursor, from uint64) error {
	first, _, err := tidseg.Holding(l.dir, from+1)
	if err != nil {
		return err
	}
	if first == 0 {
		return errCursor
	}
	if c.seg != first || c.off > from {
		c.seg, c.pos, c.off = first, 0, first-1
	}
	if c.off == from {
		return nil
	}
	sf, err := l.files.get(l, c.seg)
	if err != nil {
		c.seg = 0
		return err
	}
	defer l.files.put(sf)
	f := sf.f
	buf := make([]byte, cursorChunk)
	pos, off := c.pos, c.off
	for off < from {
		n, err := f.ReadAt(buf, pos)
		if err != nil && !errors.Is(err, io.EOF) {
			c.seg = 0
			return err
		}
		p := 0
		for off < from {
			size, h := uvarintPrefix(buf[p:n])
			if h <= 0 || size == 0 || size > uint64(n-p-h) {
				break // the next chunk starts at this entry
			}
			p += h + int(size)
			off++
		}
		if p == 0 {
			// An entry larger than a chunk is stepped over by its
			// length; anything else is not a segment the cursor reads.
			size, h := uvarintPrefix(buf[:n])
			if h <= 0 || size == 0 || size > cursorSkipMax {
				c.seg = 0
				return errCursor
			}
			if end, err := f.Size(); err != nil || pos+int64(h)+int64(size) > end {
				c.seg = 0
				return errCursor
			}
			p = h + int(size)
			off++
		}
		pos += int64(p)
	}
	c.pos, c.off = pos, off
	return nil
}

// readOn reads records from c's position, below next, and moves c past
// them. It stops early, with what it has read and errCursor, at what it
// does not read itself; with another error, at a failed file operation.
func (l *Log) readOn(c *cursor, next uint64, maxRecords, maxBytes int) ([]Record, error) {
	sf, err := l.files.get(l, c.seg)
	if err != nil {
		return nil, err
	}
	defer func() { l.files.put(sf) }()
	f := sf.f
	if c.entry == 0 {
		c.entry = cursorEntry
	}
	var (
		out    []Record
		bytes  int
		buf    []byte // the file's bytes from c.pos on, as read
		read   int64  // the bytes of the entries of out
		rolled bool   // a file ended since the last record
		short  bool   // the last read ended at the file's end
	)
	defer func() {
		if len(out) > 0 {
			c.entry = max(1, int(read)/len(out))
		}
	}()
	for len(out) < maxRecords && c.off < next {
		size, h := uvarintPrefix(buf)
		if h <= 0 || size > uint64(len(buf)-h) {
			if len(out) > 0 && maxBytes > 0 && bytes >= maxBytes {
				break
			}
			// Read on: about what the records still wanted take, and
			// the whole entry whose length is known.
			want := min(maxRecords-len(out), cursorChunk)*c.entry + c.entry/4
			want = min(max(want, cursorMinRead), cursorChunk)
			if whole := int64(h) + int64(size); h > 0 && whole > int64(want) {
				if end, err := f.Size(); err != nil || c.pos+whole > end {
					return out, errCursor // a length no entry of this file has
				}
				want = int(whole)
			}
			buf = make([]byte, want)
			n, err := f.ReadAt(buf, c.pos)
			if err != nil && !errors.Is(err, io.EOF) {
				return out, err
			}
			buf, short = buf[:n], n < want
			size, h = uvarintPrefix(buf)
		}
		if len(buf) == 0 || buf[0] == 0 {
			// The file's entries end here (zeros after them were
			// preallocated): the next entry starts the next file, named
			// after its index.
			if rolled {
				return out, errCursor
			}
			nf, err := l.files.get(l, c.off+1)
			if err != nil {
				return out, errCursor
			}
			l.files.put(sf)
			sf, f, rolled, buf = nf, nf.f, true, nil
			c.seg, c.pos = c.off+1, 0
			continue
		}
		if h <= 0 || size > uint64(len(buf)-h) {
			if h > 0 && !short {
				// An entry larger than the read expected (records
				// of mixed sizes): its length is known now, and the
				// next read takes it whole.
				continue
			}
			return out, errCursor // the file ends inside the entry
		}
		n := h + int(size)
		rec, err := decodeRecord(l.name, buf[h:n], c.off)
		if err != nil {
			return out, errCursor // readLog reports it
		}
		sz := ReadSize(&rec)
		if len(out) > 0 && maxBytes > 0 && bytes+sz > maxBytes {
			break
		}
		out = append(out, rec)
		bytes += sz
		read += int64(n)
		buf = buf[n:]
		c.pos += int64(n)
		c.off++
		rolled = false
	}
	return out, nil
}

// segmentPath is the path of the segment file whose first entry is
// tidwall index index.
func (l *Log) segmentPath(index uint64) string {
	return l.dir + string(os.PathSeparator) + segmentName(index)
}

// segFilesOpen is how many segment files a Log keeps open for Readers:
// broker.fdsPerShard counts them.
const segFilesOpen = 2

// segFiles keeps open the segment files Readers read most recently, at
// most segFilesOpen, shared by the Log's Readers. A file leaves when
// others are read, when retention rewrites the files (drop) and on Close
// (drop for good): it is closed then, or by the last read using it.
type segFiles struct {
	mu struct {
		sync.Mutex
		open   []*segFile // most recently used first
		closed bool       // the Log closed: keep no file open
	}
}

// segFile is an open segment file; refs and gone are guarded by
// segFiles.mu.
type segFile struct {
	seg  uint64 // tidwall index of its first entry
	f    File
	refs int  // reads using it
	gone bool // out of the cache: its last read closes it
}

// get returns the segment file whose first entry is tidwall index seg,
// open, for one read, which puts it back.
func (s *segFiles) get(l *Log, seg uint64) (*segFile, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, sf := range s.mu.open {
		if sf.seg == seg {
			copy(s.mu.open[1:i+1], s.mu.open[:i])
			s.mu.open[0] = sf
			sf.refs++
			return sf, nil
		}
	}
	f, err := l.fs.OpenFile(l.segmentPath(seg), os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	sf := &segFile{seg: seg, f: f, refs: 1}
	if s.mu.closed {
		sf.gone = true
		return sf, nil
	}
	if len(s.mu.open) == segFilesOpen {
		s.leave(s.mu.open[segFilesOpen-1])
		s.mu.open = s.mu.open[:segFilesOpen-1]
	}
	s.mu.open = slices.Insert(s.mu.open, 0, sf)
	return sf, nil
}

// put ends a read's use of sf.
func (s *segFiles) put(sf *segFile) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sf.refs--; sf.refs == 0 && sf.gone {
		_ = sf.f.Close()
	}
}

// leave takes sf out of the cache; s.mu is held.
func (s *segFiles) leave(sf *segFile) {
	sf.gone = true
	if sf.refs == 0 {
		_ = sf.f.Close()
	}
}

// drop closes every file (retention rewrote the segments, or the Log
// closes: final, and no file is kept open after it).
func (s *segFiles) drop(final bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sf := range s.mu.open {
		s.leave(sf)
	}
	clear(s.mu.open)
	s.mu.open = s.mu.open[:0]
	s.mu.closed = s.mu.closed || final
}
