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

// FileSize returns f's size without allocating.
func FileSize(f *os.File) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, err
	}
	return st.Size, nil
}
