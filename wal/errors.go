package wal

import (
	"errors"
	"fmt"
)

var (
	// ErrClosed is returned by operations on a closed Log.
	ErrClosed = errors.New("wal: closed")
	// ErrCorrupt matches every *CorruptError.
	ErrCorrupt = errors.New("wal: corrupt record")
	// ErrOutOfRange matches every *OutOfRangeError.
	ErrOutOfRange = errors.New("wal: offset out of range")
	// ErrFailed is wrapped by every error returned after a write or fsync
	// of the log failed. The Log accepts no more appends; close and reopen
	// it to find out what reached the disk.
	ErrFailed = errors.New("wal: log failed")
)

// CorruptError reports stored records that fail their checksum or cannot
// be decoded or found: the damaged offsets From through To (inclusive) of
// the shard. Offset is the offset whose read met the damage; it lies in
// [From, To]. No record of the range is ever returned; records before and
// after it are, so a reader can skip the damage by reading on at To+1.
type CorruptError struct {
	Shard    string
	Offset   uint64
	From, To uint64
	Reason   string
	Err      error // underlying error, if any (e.g. from reading the segment)
}

func (e *CorruptError) Error() string {
	if e.From == e.To {
		return fmt.Sprintf("wal: shard %q: corrupt record at offset %d: %s", e.Shard, e.From, e.Reason)
	}
	return fmt.Sprintf("wal: shard %q: corrupt records at offsets %d-%d: %s", e.Shard, e.From, e.To, e.Reason)
}

// Is reports whether target is ErrCorrupt.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// Unwrap returns the underlying error, if any.
func (e *CorruptError) Unwrap() error { return e.Err }

// OutOfRangeError reports a read below the first retained offset or beyond
// the next offset. First and Next are the log's bounds when it was checked;
// a reader that fell behind retention can resume at First.
type OutOfRangeError struct {
	Shard  string
	Offset uint64
	First  uint64
	Next   uint64
}

func (e *OutOfRangeError) Error() string {
	return fmt.Sprintf("wal: shard %q: offset %d out of range (first %d, next %d)", e.Shard, e.Offset, e.First, e.Next)
}

// Is reports whether target is ErrOutOfRange.
func (e *OutOfRangeError) Is(target error) bool { return target == ErrOutOfRange }

// ErrLostRecords matches every *LostRecordsError.
var ErrLostRecords = errors.New("wal: acknowledged records lost")

// LostRecordsError is returned by Open when the log on disk ends below its
// committed high-water mark: records at offsets [From, To) were
// acknowledged (fsynced) once and are gone or damaged, which a crash alone
// cannot do. The log refuses to hand those offsets out again. No record on
// disk was cut: restore the files, or open with Options.AcceptLoss to
// continue at offset To, reads of [From, To) then failing as corrupt.
type LostRecordsError struct {
	Shard  string
	Dir    string
	From   uint64 // first lost offset
	To     uint64 // one past the last lost offset: the committed high-water mark, or the first offset left
	Reason string // what recovery found, e.g. where the tail segment is damaged
	// Front: the lost records are the log's first ones (its first
	// segments are missing), not its last.
	Front bool
}

func (e *LostRecordsError) Error() string {
	if e.Front {
		return fmt.Sprintf("wal: shard %q: acknowledged records at offsets %d-%d (%d) are missing from %q (%s); "+
			"refusing to open it as if retention had dropped them: restore the log's files, or accept the loss to serve it from offset %d",
			e.Shard, e.From, e.To-1, e.To-e.From, e.Dir, e.Reason, e.To)
	}
	return fmt.Sprintf("wal: shard %q: acknowledged records at offsets %d-%d (%d) are missing from %q (%s); "+
		"refusing to reuse their offsets: restore the log's files, or accept the loss to continue at offset %d",
		e.Shard, e.From, e.To-1, e.To-e.From, e.Dir, e.Reason, e.To)
}

// Is reports whether target is ErrLostRecords.
func (e *LostRecordsError) Is(target error) bool { return target == ErrLostRecords }
