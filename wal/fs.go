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

// tailSync is how a commit's fdatasync of the tail segment waits for the
// disk. The guarantee and the failure handling are the same every way;
// what differs is what the rest of the process can do meanwhile. A
// goroutine in an ordinary system call keeps its P (with GOMAXPROCS=1, a
// local cluster's brokers, the whole process) until sysmon happens to see
// the call twice, so a broker holding it reads no packet, writes no ack
// and starts no other shard's commit until the disk answers.
type tailSync uint8

const (
	// syncHold blocks the thread and keeps the P: a lone record committed
	// inline while no log of the process is busy, where nothing else
	// waits for the P and each of the ways below costs tens of
	// microseconds more (BenchmarkFdatasyncFiles, files=1); and a
	// committer's batch of holdFrom records or more.
	syncHold tailSync = iota
	// syncHandOff blocks the thread and hands the P to the rest of the
	// process, as the runtime does for its own blocking calls
	// (tidseg.FdatasyncHandOff): the committer goroutine's batches of
	// fewer than holdFrom records, and an inline commit while another
	// log is busy. One commit runs per log at a time, so the threads
	// blocked this way are at most the open logs (the broker bounds
	// them, MaxOpenShards), as were the threads sysmon could leave
	// blocked after taking their P.
	syncHandOff
	// syncPark submits the call to the kernel (Linux AIO,
	// tidseg.Parker) and waits in Go's poller, no thread blocked: with
	// Options.ParkedSync, or while the SyncGroup's threshold of logs are
	// busy, so that hundreds of shards' fsyncs overlap without a thread
	// each. Where the kernel gives no AIO context (not Linux, or
	// fs.aio-max-nr reached) it blocks.
	syncPark
)

// holdFrom is the batch size from which the committer keeps its P
// through the fdatasync (syncHold). A batch that large means records
// arrive faster than the disk syncs them: the process has other work
// for the P, and a committer that handed it on would, once the disk
// answered, wait behind that work for a P before it could ack the batch.
// Measured on a 2-vCPU VM (docs/performance.md, "Handing the P on"),
// brokers at GOMAXPROCS=1: at half the maximum load (20 to 70 records a batch),
// handing every batch on doubled the wait from the batch's stamp to its
// ack and took the row's p99 from 37 to 53 ms (medians of nine runs
// each); at a tenth (3 or 4 a batch) it halved the wait before the
// stamp.
const holdFrom = 16

// syncTail fdatasyncs the tail segment as how says. A file of another FS
// (FaultFS in tests) gets its own Sync. The caller holds the commit role
// and l.tail's lock.
func (l *Log) syncTail(how tailSync) error {
	f := l.tail.f
	of, ok := f.(osFile)
	switch {
	case !ok || how == syncHold:
		return f.Sync()
	case how == syncPark:
		return l.c.parker.Fdatasync(of.File)
	default:
		return tidseg.FdatasyncHandOff(of.File)
	}
}
