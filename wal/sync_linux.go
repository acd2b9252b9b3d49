//go:build linux

package wal

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// fdatasync flushes f's data and the metadata needed to read it (its size).
func fdatasync(f *os.File) error {
	fd := int(f.Fd())
	for {
		err := unix.Fdatasync(fd)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// fileSize returns f's size without allocating.
func fileSize(f *os.File) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, err
	}
	return st.Size, nil
}
