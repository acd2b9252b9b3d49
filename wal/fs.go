package wal

import (
	"io"
	"os"

	"github.com/felix-broker/felix/internal/tidseg"
)

// FS is the filesystem seam under the operations this package performs on
// files itself, so that tests can make them fail (see FaultFS). It is set
// through Options.FS; the zero value is the real OS.
//
// What it covers, exactly:
//   - the tail segment: opening it to sync it, writing the zeros that
//     preallocate it (WriteAt) and cutting them (Truncate), checking its
//     size after each batch (Stat) and its fdatasync after each batch
//     (Sync);
//   - the directory fsync after a segment roll and after Open;
//   - the high-water-mark file (hwm): opening it, its write after each
//     commit (WriteAt), its fdatasync on Open and Close;
//   - repair on Open: reading the tail segment, cutting it and syncing it;
//   - the reads of segment files by Readers (opening them and ReadAt).
//
// What it cannot cover: everything tidwall/wal does with its own *os.File
// values — writing batches into segments, creating segments on a roll,
// reading segments for Log.Read, the rewrites of TruncateFront — and the
// retention pass's own reads. A test that needs a segment write to fail
// makes the write of the hwm file fail instead: it is written after the
// batch's fsync and before the batch is acked, and its failure fails the
// batch and the Log exactly like a failed segment write.
type FS interface {
	// OpenFile opens name like os.OpenFile.
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	// OpenDir opens directory name so that it can be synced.
	OpenDir(name string) (File, error)
}

// File is a file opened through an FS.
type File interface {
	io.ReaderAt
	io.WriterAt
	io.Closer
	// Sync makes the file's data durable: fdatasync on Linux for a regular
	// file, fsync for a directory and on other systems.
	Sync() error
	// Size returns the file's current size.
	Size() (int64, error)
	// Truncate changes the file's size.
	Truncate(size int64) error
}

// osFS is the real filesystem.
type osFS struct{}

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) OpenDir(name string) (File, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	return osDir{osFile{f}}, nil
}

// osFile is a regular file of the OS; Sync is fdatasync.
type osFile struct{ *os.File }

func (f osFile) Sync() error          { return tidseg.Fdatasync(f.File) }
func (f osFile) Size() (int64, error) { return tidseg.FileSize(f.File) }

// osDir is a directory of the OS; Sync is fsync.
type osDir struct{ osFile }

func (d osDir) Sync() error { return d.File.Sync() }

// readFile reads the whole of name through fs.
func readFile(fs FS, name string) ([]byte, error) {
	f, err := fs.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, err
	}
	data := make([]byte, size)
	n, err := f.ReadAt(data, 0)
	if err == io.EOF && int64(n) == size {
		err = nil
	}
	return data[:n], err
}

// parkedSync is the committer goroutine's fdatasync of the tail segment
// with Options.ParkedSync: parked on the kernel (tidseg.ParkedSyncer), so
// that while the disk works the goroutine's P runs the rest of the process
// — the network input, the other shards' commits, whose fsyncs then
// overlap instead of queueing. With GOMAXPROCS=1 (a local cluster's
// brokers) a blocking fdatasync holds the only P for the whole call. A
// nil *parkedSync (the option off, or a lone record committed inline on an
// idle log, which is tens of microseconds faster blocking) syncs blocking.
//
// Only a real OS file is synced parked; a file of another FS (FaultFS in
// tests) gets its own Sync. Where the kernel gives no AIO context (not
// Linux, or fs.aio-max-nr reached), every fdatasync blocks.
type parkedSync struct{ p tidseg.Parker }

func (p *parkedSync) sync(f File) error {
	of, ok := f.(osFile)
	if p == nil || !ok {
		return f.Sync()
	}
	return p.p.Fdatasync(of.File)
}

func (p *parkedSync) close() { _ = p.p.Close() }
