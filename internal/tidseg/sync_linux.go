//go:build linux

package tidseg

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// Fdatasync flushes f's data and the metadata needed to read it (its size).
func Fdatasync(f *os.File) error {
	fd := int(f.Fd())
	for {
		err := unix.Fdatasync(fd)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// FileSize returns f's size without allocating. It moves f's offset to
// its end: for files read and written at offsets (ReadAt, WriteAt) only.
//
// It seeks rather than stats because a stat marks the file's timestamps
// as seen, and Linux (6.13 on, multigrain timestamps) then gives the next
// write a fresh fine-grained mtime instead of leaving it at the clock's
// coarse tick: the inode changes with every write, and on ext4 every
// fdatasync writes it too. Measured (2-vCPU VM, ext4 without journal),
// 100-byte overwrites of a preallocated file, each followed by
// fdatasync: p50 270–295 µs with an fstat between them, 149–203 µs
// without or with this seek, as slow as an append with it.
func FileSize(f *os.File) (int64, error) {
	return unix.Seek(int(f.Fd()), 0, unix.SEEK_END)
}
