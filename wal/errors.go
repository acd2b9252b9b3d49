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

// CorruptError reports a stored record that fails its checksum or cannot be
// decoded. The record is never returned.
type CorruptError struct {
	Shard  string
	Offset uint64
	Reason string
	Err    error // underlying error, if any (e.g. from reading the segment)
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("wal: shard %q: corrupt record at offset %d: %s", e.Shard, e.Offset, e.Reason)
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
