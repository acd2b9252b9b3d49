package wal

import (
	"errors"
	"fmt"
	"os"

	"github.com/felix-broker/felix/internal/tidseg"
)

// The tail segment is preallocated (tidseg.Padding): the committer writes
// zeros ahead of tidwall's writes, so that a commit's fdatasync writes
// its data alone, not the inode of a grown file. Its size is checked by
// seeking, not by stat (see tidseg.FileSize). The zeros are cut from the
// tail tidwall leaves on a roll (writeAndSync), from the tail on Close,
// and, after a crash, by repairTail before tidwall opens the log (without
// the torn-tail warning); a retention pass that rewrites the tail gets a
// new file without them (truncateFront reopens it).

// preallocate writes zeros ahead of the tail's data before a batch of
// sizes. Callers hold l.tail's lock.
func (l *Log) preallocate(sizes []int) error {
	if err := l.tail.pad.Extend(l.tail.f, l.tail.size, int64(l.opts.SegmentSize), sizes); err != nil {
		return fmt.Errorf("preallocate %s: %w", segmentName(l.tail.index), err)
	}
	return nil
}

// unpad cuts the zeros after the tail's data (tidwall has written size
// bytes of it), if there are any. Callers hold l.tail's lock.
// Bytes other than zeros where they should be mean that the count of
// the tail's bytes is wrong: nothing is cut, which is safe (zeros left
// after the data of a segment tidwall left are harmless), and it is
// logged.
func (l *Log) unpad(size int64) error {
	err := l.tail.pad.Cut(l.tail.f, size)
	if errors.Is(err, tidseg.ErrNotZeros) {
		l.logger.Error("wal: lost track of the tail segment's end; its preallocated zeros are left", "shard", l.name, "file", segmentName(l.tail.index), "err", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("cut preallocated zeros of %s: %w", segmentName(l.tail.index), err)
	}
	return nil
}

// findPadding sets where the tail's data ends and its zeros begin from the
// file itself, for a tail opened without knowing whether it was
// preallocated (after losing track of tidwall's roll): the zeros are what
// follows the last whole entry when nothing but zeros does. Nothing is
// cut. Callers hold l.tail's lock.
func (l *Log) findPadding() error {
	data, err := readFile(l.fs, l.dir+string(os.PathSeparator)+segmentName(l.tail.index))
	if err != nil {
		return fmt.Errorf("wal: shard %q: read tail segment: %w", l.name, err)
	}
	if end, zeros := tidseg.EntriesEnd(data); zeros && end < len(data) {
		l.tail.size = int64(end)
		l.tail.pad.Found(int64(len(data)))
	}
	return nil
}
