//go:build !linux

package wal

import "os"

func fdatasync(f *os.File) error { return f.Sync() }

func fileSize(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}
