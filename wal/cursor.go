package wal

import (
	"os"

	"github.com/felix-broker/felix/internal/tidseg"
)

// This file reads old records for a reader that reads on from where it
// left off (a subscriber catching up), by file position: the cursor (tidseg.Cursor) knows
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
// files (tidseg.Files, two): an open and a close cost more than the pread.
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
	c tidseg.Cursor
}

// NewReader returns a Reader of l.
func (l *Log) NewReader() *Reader { return &Reader{l: l} }

// Read is Log.Read, read by position when the records are on disk.
func (r *Reader) Read(from uint64, maxRecords int, maxBytes int) ([]Record, error) {
	return r.l.read(&r.c, from, maxRecords, maxBytes)
}

// recordTaker takes the records of a Reader's read from a tidseg.Cursor:
// each verified as readOne verifies it (decodeRecord: its checksum, and its
// own offset), up to maxRecords and maxBytes.
type recordTaker struct {
	name       string
	maxRecords int
	maxBytes   int
	out        []Record
	bytes      int
}

func (t *recordTaker) More(reading bool) int {
	if reading && len(t.out) > 0 && t.maxBytes > 0 && t.bytes >= t.maxBytes {
		return 0
	}
	return t.maxRecords - len(t.out)
}

func (t *recordTaker) Take(entry []byte, index uint64) (bool, error) {
	rec, err := decodeRecord(t.name, entry, index-1)
	if err != nil {
		return false, err // readLog reports it
	}
	sz := ReadSize(&rec)
	if len(t.out) > 0 && t.maxBytes > 0 && t.bytes+sz > t.maxBytes {
		return false, nil
	}
	t.out = append(t.out, rec)
	t.bytes += sz
	return true, nil
}

// readCursor reads records from from, below next, by c's position (the
// cursor counts tidwall indexes: offset + 1). ok is false if it read
// none: the caller reads them through readLog.
func (l *Log) readCursor(c *tidseg.Cursor, from, next uint64, maxRecords, maxBytes int) (out []Record, ok bool) {
	if c.Avoided(from + 1) {
		return nil, false
	}
	if l.scans.cached(from) != nil { // a damaged segment, parsed by the wal
		return nil, false
	}
	if !c.At(from + 1) {
		if err := c.Place(&l.files, from+1); err != nil {
			c.Avoid(&l.files, from+1, next+1)
			return nil, false
		}
	}
	t := recordTaker{name: l.name, maxRecords: maxRecords, maxBytes: maxBytes}
	_ = c.ReadOn(&l.files, next+1, &t)
	if len(t.out) == 0 {
		c.Avoid(&l.files, from+1, next+1)
		return nil, false
	}
	return t.out, true
}

// openSegment opens a segment file for Readers, through Options.FS.
func (l *Log) openSegment(path string) (tidseg.File, error) {
	return l.fs.OpenFile(path, os.O_RDONLY, 0)
}
