//go:build !linux

package tidseg

import "os"

// Fdatasync is fsync where fdatasync is not available.
func Fdatasync(f *os.File) error { return f.Sync() }

// FileSize returns f's size.
func FileSize(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// FdatasyncHandOff is Fdatasync where the runtime gives no way to hand the
// P on for the call.
func FdatasyncHandOff(f *os.File) error { return f.Sync() }
