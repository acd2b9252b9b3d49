package replica

import (
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/felix-broker/felix/internal/tidseg"
	"github.com/felix-broker/felix/wal"
)

// This file reads old entries for a reader that reads on from where it
// left off (a subscriber catching up), by file position (tidseg.Cursor,
// shared with package wal): the cursor knows the segment file and the
// byte where its next entry starts, and reads that entry, about its own
// size, with bounded preads. Group.Read reads through tidwall instead,
// which loads a whole segment (1 MiB) into a cache of two on a miss:
// readers in three segments evicted each other's, and each record they
// were given cost loading a segment (TestCatchUpReadersInterleaved,
// BenchmarkCatchUpRead).
//
// An entry holds a whole group-commit batch, and its one checksum covers
// it all, so a read reads its entry whole. A reader that asks for fewer
// records than the entry holds (a subscriber at credit 1) would read the
// entry again for each: a Reader keeps the records its read left of the
// entry it read last, up to readerHold bytes, and its next read starts
// from them. The bytes all Readers of a group keep at once are bounded
// too (readersHold): past it a Reader keeps nothing.
//
// Every entry is verified as storage.readEntry verifies it (decodeEntry:
// its checksum over the index and every byte; then the batch decoded
// whole, as Group.Read decodes it); on anything unusual (a file gone, an
// entry that does not verify, a framing the cursor does not expect, a
// failed file operation) the entry is read through storage.readEntry,
// which reports damage and retention as it always does, and the cursor
// leaves the segment to it and places itself afresh after it.

const (
	// readerHold bounds what a Reader keeps between reads: the records
	// left of its last entry, counted by wal.ReadSize and recordCost.
	readerHold = 16 << 10
	// readersHold bounds what all Readers of a group keep at once.
	readersHold = 1 << 20
)

// Reader reads a Group for one consumer that goes on reading from where
// its last read ended, such as a subscription: like Group.Read, and
// records older than the in-memory tail cost about their own bytes read
// from the segment files, however few records each read asks for and
// however many readers read other parts of the log meanwhile.
//
// Between reads a Reader holds its position and at most readerHold (16
// KiB) of records of the entry it read last, and a group's Readers hold
// at most readersHold (1 MiB) of them at once; Close lets them go. The
// group keeps the two segment files Readers read most recently open, at
// most three at once (tidseg.FilesMax). A
// Reader is not safe for concurrent use; many Readers may read one Group
// at once.
type Reader struct {
	g *Group
	c tidseg.Cursor
	// keep is what the Reader keeps: records with consecutive offsets of
	// the entry it read last, after the ones its last read returned;
	// kept is what it counts against the group's readersHold.
	keep []wal.Record
	kept int64
	// last is the records of the entry this read decoded from disk last:
	// what the Reader may keep records of.
	last []wal.Record
}

// NewReader returns a Reader of g. Close it when done.
func (g *Group) NewReader() *Reader { return &Reader{g: g} }

// Read is Group.Read, read by position when the entries are on disk.
func (r *Reader) Read(from uint64, max int, maxBytes int) ([]wal.Record, error) {
	out, err := r.g.offs.read(r.g.tail, r.g.cfg.Name, r, from, max, maxBytes)
	switch {
	case err != nil:
		r.drop()
	case len(out) == 0:
	case r.last != nil: // an entry read from disk: keep what is left of it
		r.drop()
		r.hold(out[len(out)-1].Offset + 1)
	default: // keep what is left of what r kept
		if rest := r.held(out[len(out)-1].Offset + 1); rest != nil {
			r.keep = rest
		} else {
			r.drop()
		}
	}
	r.last = nil
	return out, err
}

// Close lets go of what r keeps. r reads on if used again.
func (r *Reader) Close() { r.drop() }

// held implements entrySource: the records r kept, from from on.
func (r *Reader) held(from uint64) []wal.Record {
	if len(r.keep) == 0 || from < r.keep[0].Offset || from-r.keep[0].Offset >= uint64(len(r.keep)) {
		return nil
	}
	return r.keep[from-r.keep[0].Offset:]
}

// decoded implements entrySource: r may keep records of it.
func (r *Reader) decoded(_ uint64, recs []wal.Record) { r.last = recs }

// readEntry implements entrySource: entry index by position, or through
// storage.readEntry (which also says that the group is closed).
func (r *Reader) readEntry(index uint64) (pb.EntryType, []byte, error) {
	st := r.g.st
	if !st.closed.Load() && !r.c.Avoided(index) {
		if !r.c.At(index) {
			if err := r.c.Place(&st.files, index); err != nil {
				r.c.Avoid(&st.files, index, r.g.offs.entries())
				return r.fallback(index)
			}
		}
		t := entryTaker{}
		_ = r.c.ReadOn(&st.files, index+1, &t)
		if t.took {
			return t.typ, t.data, nil
		}
		r.c.Avoid(&st.files, index, r.g.offs.entries())
	}
	return r.fallback(index)
}

// fallback reads entry index through storage.readEntry.
func (r *Reader) fallback(index uint64) (pb.EntryType, []byte, error) {
	typ, _, data, err := r.g.st.readEntry(index)
	return typ, data, err
}

// entryTaker takes one entry a cursor reads, verified as readEntry
// verifies it.
type entryTaker struct {
	took bool
	typ  pb.EntryType
	data []byte
}

func (t *entryTaker) More(bool) int {
	if t.took {
		return 0
	}
	return 1
}

func (t *entryTaker) Take(entry []byte, index uint64) (bool, error) {
	typ, _, data, ok := decodeEntry(entry, index)
	if !ok {
		return false, tidseg.ErrCursor // storage.readEntry reports it
	}
	t.took, t.typ, t.data = true, typ, data
	return true, nil
}

// hold keeps the records of r.last from offset next on, up to
// readerHold, in a buffer of their own.
func (r *Reader) hold(next uint64) {
	last := r.last
	if len(last) == 0 || next < last[0].Offset || next-last[0].Offset >= uint64(len(last)) {
		return
	}
	rest := last[next-last[0].Offset:]
	n, size := 0, 0
	for n < len(rest) {
		s := wal.ReadSize(&rest[n]) + recordCost
		if size+s > readerHold {
			break
		}
		size += s
		n++
	}
	if n == 0 || r.g.readersHeld.Add(int64(size)) > readersHold {
		r.g.readersHeld.Add(-int64(size))
		return
	}
	keep := make([]wal.Record, n)
	copy(keep, rest)
	wal.Compact(keep) // not the entry's buffer: it may be far larger
	r.keep, r.kept = keep, int64(size)
}

// drop lets go of what r keeps.
func (r *Reader) drop() {
	if r.kept != 0 {
		r.g.readersHeld.Add(-r.kept)
	}
	r.keep, r.kept = nil, 0
}
