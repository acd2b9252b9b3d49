package wal

import (
	"errors"
	"os"
)

// Op names an operation of an FS or File, for FaultFS.
type Op uint8

// The operations FaultFS can fail.
const (
	OpOpen     Op = iota // FS.OpenFile, FS.OpenDir
	OpRead               // File.ReadAt
	OpWrite              // File.WriteAt
	OpSync               // File.Sync
	OpStat               // File.Size
	OpTruncate           // File.Truncate
)

func (o Op) String() string {
	switch o {
	case OpOpen:
		return "open"
	case OpRead:
		return "read"
	case OpWrite:
		return "write"
	case OpSync:
		return "sync"
	case OpStat:
		return "stat"
	case OpTruncate:
		return "truncate"
	}
	return "unknown"
}

// ErrInjected is the error a FaultFS returns when its Inject function
// returns true; errors.Is matches it through the Log's wrapping.
var ErrInjected = errors.New("wal: injected fault")

// FaultFS is an FS for tests, after pebble's vfs/errorfs: before each
// operation it asks Inject, and if Inject returns true it fails the
// operation with ErrInjected instead of performing it. Close is never
// failed. It covers what FS covers, nothing of tidwall's own I/O (see FS).
type FaultFS struct {
	// Base performs the operations that are not failed. Default: the OS.
	Base FS
	// Inject decides, for each operation on the file at path (as the Log
	// names it: dir joined with the file name), whether it fails. It is
	// called from the Log's goroutines and must be safe for concurrent use.
	Inject func(op Op, path string) bool
}

func (f *FaultFS) base() FS {
	if f.Base == nil {
		return osFS{}
	}
	return f.Base
}

func (f *FaultFS) fail(op Op, path string) error {
	if f.Inject != nil && f.Inject(op, path) {
		return &os.PathError{Op: op.String(), Path: path, Err: ErrInjected}
	}
	return nil
}

// OpenFile implements FS.
func (f *FaultFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	if err := f.fail(OpOpen, name); err != nil {
		return nil, err
	}
	file, err := f.base().OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: file, fs: f, path: name}, nil
}

// OpenDir implements FS.
func (f *FaultFS) OpenDir(name string) (File, error) {
	if err := f.fail(OpOpen, name); err != nil {
		return nil, err
	}
	file, err := f.base().OpenDir(name)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: file, fs: f, path: name}, nil
}

type faultFile struct {
	File
	fs   *FaultFS
	path string
}

func (f *faultFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.fs.fail(OpRead, f.path); err != nil {
		return 0, err
	}
	return f.File.ReadAt(p, off)
}

func (f *faultFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.fs.fail(OpWrite, f.path); err != nil {
		return 0, err
	}
	return f.File.WriteAt(p, off)
}

func (f *faultFile) Sync() error {
	if err := f.fs.fail(OpSync, f.path); err != nil {
		return err
	}
	return f.File.Sync()
}

func (f *faultFile) Size() (int64, error) {
	if err := f.fs.fail(OpStat, f.path); err != nil {
		return 0, err
	}
	return f.File.Size()
}

func (f *faultFile) Truncate(size int64) error {
	if err := f.fs.fail(OpTruncate, f.path); err != nil {
		return err
	}
	return f.File.Truncate(size)
}
