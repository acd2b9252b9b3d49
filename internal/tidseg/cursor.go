package tidseg

import (
	"encoding/binary"
	"errors"
	"io"
	"os"
	"slices"
	"sync"
)

// This file reads a log's entries by file position, for a reader that
// reads on from where it left off (a subscriber catching up): a Cursor
// knows the segment file and the byte where the entry of its next index
// starts, and reads from there about what its caller takes, with bounded
// preads. tidwall's Read loads a whole segment into a cache of two on a
// miss instead: readers in three segments evict each other's, and each
// entry they read costs a segment load.
//
// A Cursor holds no file and no data between reads: its position only.
// The files are kept open, a few per log, by the log's Files. What an
// entry holds, and how it is verified, is the caller's (a Taker).

// File is a segment file opened for reading by position.
type File interface {
	io.ReaderAt
	io.Closer
	Size() (int64, error)
}

// FilesOpen is how many segment files a Files keeps open between reads.
const FilesOpen = 2

// FilesMax bounds the segment files a Files has open at once: those it
// keeps, and those that left it while a read still used them. A read
// that needs another file waits, holding none, until one closes, so the
// files a log's readers hold do not grow with their number (64 readers
// in different segments of a slow disk held 64 files at once).
const FilesMax = FilesOpen + 1

// Files keeps open the segment files of one log directory that Cursors
// read most recently, at most FilesOpen, shared by the log's Cursors, and
// never more than FilesMax at once. A file leaves when others are read,
// on Drop (the log's files were rewritten, or the log closes): it is
// closed then, or by the last read using it. Init it before use.
type Files struct {
	dir  string
	open func(path string) (File, error)
	mu   struct {
		sync.Mutex
		open   []*openFile // most recently used first
		opened int         // files open: those in open, and those left but in use
		closed bool        // dropped for good: keep no file open
		freed  *sync.Cond  // a file closed, or closed became true
	}
}

// openFile is an open segment file; refs and gone are guarded by
// Files.mu.
type openFile struct {
	seg  uint64 // index of its first entry
	f    File
	refs int  // reads using it
	gone bool // out of the cache: its last read closes it
}

// Init sets the directory whose segment files s opens, and how it opens
// one (read-only).
func (s *Files) Init(dir string, open func(path string) (File, error)) {
	s.dir, s.open = dir, open
	s.mu.freed = sync.NewCond(&s.mu.Mutex)
}

// OSFile opens a segment file read-only on the real OS.
func OSFile(path string) (File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

type osFile struct{ *os.File }

func (f osFile) Size() (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// get returns the segment file whose first entry is seg, open, for one
// read, which puts it back. The caller holds no other file of s: get
// waits while FilesMax are open and in use.
func (s *Files) get(seg uint64) (*openFile, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		for i, of := range s.mu.open {
			if of.seg == seg {
				copy(s.mu.open[1:i+1], s.mu.open[:i])
				s.mu.open[0] = of
				of.refs++
				return of, nil
			}
		}
		if s.mu.closed || s.mu.opened < FilesMax {
			break
		}
		if n := len(s.mu.open); n > 0 && s.mu.open[n-1].refs == 0 {
			s.leave(s.mu.open[n-1]) // closes it: room for one
			s.mu.open = s.mu.open[:n-1]
			continue
		}
		s.mu.freed.Wait()
	}
	f, err := s.open(s.dir + string(os.PathSeparator) + Name(seg))
	if err != nil {
		return nil, err
	}
	s.mu.opened++
	of := &openFile{seg: seg, f: f, refs: 1}
	if s.mu.closed {
		of.gone = true
		return of, nil
	}
	if len(s.mu.open) == FilesOpen {
		s.leave(s.mu.open[FilesOpen-1])
		s.mu.open = s.mu.open[:FilesOpen-1]
	}
	s.mu.open = slices.Insert(s.mu.open, 0, of)
	return of, nil
}

// put ends a read's use of of.
func (s *Files) put(of *openFile) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if of.refs--; of.refs == 0 && of.gone {
		s.close(of)
	}
}

// close closes of, out of the cache and unused; s.mu is held.
func (s *Files) close(of *openFile) {
	_ = of.f.Close()
	s.mu.opened--
	s.wake()
}

// wake wakes the reads waiting for room; s.mu is held.
func (s *Files) wake() {
	if s.mu.freed != nil { // nil before Init: nothing opened, none waits
		s.mu.freed.Broadcast()
	}
}

// leave takes of out of the cache; s.mu is held.
func (s *Files) leave(of *openFile) {
	of.gone = true
	if of.refs == 0 {
		s.close(of)
	}
}

// Drop closes every file (the log's segments were rewritten, or, final,
// the log closes: no file is kept open after it).
func (s *Files) Drop(final bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, of := range s.mu.open {
		s.leave(of)
	}
	clear(s.mu.open)
	s.mu.open = s.mu.open[:0]
	s.mu.closed = s.mu.closed || final
	s.wake()
}

// Cursor is a position in a log's segment files: the entry of index
// Index starts at byte Pos of the segment file whose first entry is Seg
// (Seg 0: not placed). Its zero value is not placed.
type Cursor struct {
	seg   uint64
	pos   int64
	index uint64
	// entry is the mean size of the entries the last read took, what
	// the next read expects.
	entry int
	// [avoidFrom, avoidTo) are the indexes of a segment the cursor could
	// not read: its caller reads them another way.
	avoidFrom, avoidTo uint64
}

const (
	// cursorChunk bounds one pread, and so what a read allocates beyond
	// the entries its caller takes: at most one partial entry per chunk.
	cursorChunk = 64 << 10
	// cursorMinRead is the least a read reads: a length prefix and a
	// small entry.
	cursorMinRead = 64
	// cursorEntry is the entry size a cursor expects before it has read.
	cursorEntry = 256
	// cursorSkipMax is the largest entry length Place steps over: no
	// segment file is that large.
	cursorSkipMax = 1 << 40
)

// ErrCursor: the cursor met something it does not read itself.
var ErrCursor = errors.New("tidseg: cursor cannot read on")

// At reports whether c is placed at index.
func (c *Cursor) At(index uint64) bool { return c.seg != 0 && c.index == index }

// Avoided reports whether index lies in a segment c could not read.
func (c *Cursor) Avoided(index uint64) bool { return index >= c.avoidFrom && index < c.avoidTo }

// Avoid marks the segment holding index, which c could not read, as one
// to read another way, up to end at most, and unplaces c.
func (c *Cursor) Avoid(s *Files, index, end uint64) {
	c.seg = 0
	first, after, err := Holding(s.dir, index)
	if err != nil || first == 0 {
		c.avoidFrom, c.avoidTo = index, index+1
		return
	}
	c.avoidFrom, c.avoidTo = first, end
	if after != 0 {
		c.avoidTo = min(after, end)
	}
}

// Place positions c at index: in the segment file that holds it, from
// c's position if that is before index in the same file, else from the
// file's start, stepping over the entries before it (their lengths are
// read, not their data).
func (c *Cursor) Place(s *Files, index uint64) error {
	first, _, err := Holding(s.dir, index)
	if err != nil {
		return err
	}
	if first == 0 {
		return ErrCursor
	}
	if c.seg != first || c.index > index {
		c.seg, c.pos, c.index = first, 0, first
	}
	if c.index == index {
		return nil
	}
	of, err := s.get(c.seg)
	if err != nil {
		c.seg = 0
		return err
	}
	defer s.put(of)
	f := of.f
	buf := make([]byte, cursorChunk)
	pos, at := c.pos, c.index
	for at < index {
		n, err := f.ReadAt(buf, pos)
		if err != nil && !errors.Is(err, io.EOF) {
			c.seg = 0
			return err
		}
		p := 0
		for at < index {
			size, h := binary.Uvarint(buf[p:n])
			if h <= 0 || size == 0 || size > uint64(n-p-h) {
				break // the next chunk starts at this entry
			}
			p += h + int(size)
			at++
		}
		if p == 0 {
			// An entry larger than a chunk is stepped over by its
			// length; anything else is not a segment the cursor reads.
			size, h := binary.Uvarint(buf[:n])
			if h <= 0 || size == 0 || size > cursorSkipMax {
				c.seg = 0
				return ErrCursor
			}
			if end, err := f.Size(); err != nil || pos+int64(h)+int64(size) > end {
				c.seg = 0
				return ErrCursor
			}
			p = h + int(size)
			at++
		}
		pos += int64(p)
	}
	c.pos, c.index = pos, at
	return nil
}

// A Taker takes the entries a Cursor reads on.
type Taker interface {
	// More is how many more entries the caller wants: ReadOn stops at 0.
	// reading says the cursor would read from the file for them (More
	// sizes that read).
	More(reading bool) int
	// Take verifies entry, the one of index, and takes it (true: the
	// cursor moves past it), or stops before it (false). An error stops
	// the read: the cursor cannot read the entry.
	Take(entry []byte, index uint64) (bool, error)
}

// ReadOn reads entries from c's position on, below index end, and hands
// them to t in order, moving c past each one t takes, from segment file
// to segment file. It stops when t wants no more, before an entry t does
// not take, at end, with ErrCursor at what it does not read itself (an
// entry t refused, a file that ends inside an entry or where no next
// file starts), and with another error at a failed file operation. The
// entries t is handed alias the read's buffers, which c does not keep.
func (c *Cursor) ReadOn(s *Files, end uint64, t Taker) error {
	of, err := s.get(c.seg)
	if err != nil {
		return err
	}
	defer func() {
		if of != nil {
			s.put(of)
		}
	}()
	f := of.f
	if c.entry == 0 {
		c.entry = cursorEntry
	}
	var (
		buf    []byte // the file's bytes from c.pos on, as read
		taken  int    // entries taken
		read   int64  // their bytes
		rolled bool   // a file ended since the last entry taken
	)
	defer func() {
		if taken > 0 {
			c.entry = max(1, int(read)/taken)
		}
	}()
	for c.index < end && t.More(false) > 0 {
		size, h := binary.Uvarint(buf)
		if h <= 0 || size > uint64(len(buf)-h) {
			more := t.More(true)
			if more <= 0 {
				break
			}
			// Read on: about what the entries still wanted take, and
			// the whole entry whose length is known.
			want := min(more, cursorChunk)*c.entry + c.entry/4
			want = min(max(want, cursorMinRead), cursorChunk)
			if whole := int64(h) + int64(size); h > 0 && whole > int64(want) {
				if fend, err := f.Size(); err != nil || c.pos+whole > fend {
					return ErrCursor // a length no entry of this file has
				}
				want = int(whole)
			}
			sized := h > 0 // the entry's length is known: this read holds it
			buf = make([]byte, want)
			n, err := f.ReadAt(buf, c.pos)
			if err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			buf = buf[:n]
			size, h = binary.Uvarint(buf)
			if !sized && n == want && h > 0 && size > uint64(n-h) {
				continue // an entry larger than expected: read it whole
			}
		}
		if len(buf) == 0 || buf[0] == 0 {
			// The file's entries end here (zeros after them were
			// preallocated): the next entry starts the next file, named
			// after its index.
			if rolled {
				return ErrCursor
			}
			s.put(of) // before the next: get waits holding none
			of = nil
			nf, err := s.get(c.index)
			if err != nil {
				return ErrCursor
			}
			of, f, rolled, buf = nf, nf.f, true, nil
			c.seg, c.pos = c.index, 0
			continue
		}
		if h <= 0 || size > uint64(len(buf)-h) {
			return ErrCursor // the file ends inside the entry
		}
		n := h + int(size)
		took, err := t.Take(buf[h:n], c.index)
		if err != nil {
			return ErrCursor
		}
		if !took {
			break
		}
		taken++
		read += int64(n)
		buf = buf[n:]
		c.pos += int64(n)
		c.index++
		rolled = false
	}
	return nil
}
