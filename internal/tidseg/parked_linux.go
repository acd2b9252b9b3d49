//go:build linux

package tidseg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ParkedSyncer runs fdatasync without holding a thread of the Go runtime
// while the disk works: it submits the fdatasync to a Linux AIO context of
// its own (IOCB_CMD_FDSYNC, Linux 4.18 and later, run by a kernel worker)
// and parks the calling goroutine on an eventfd in Go's network poller
// until the kernel completes it. A blocking fdatasync keeps its goroutine's
// P for the whole call (until the runtime's monitor notices and hands the
// P to another thread, which on a small VM takes hundreds of
// microseconds): with GOMAXPROCS=1 that stalls every other goroutine of
// the process, its network input included, and the fsyncs of several logs
// queue instead of overlapping. Parked, the P runs them meanwhile.
//
// The price is a kernel worker's hop and a poller wake-up per call (tens
// of microseconds), which is why a lone record's commit (an idle log,
// committed inline) still uses the blocking call; see package wal.
//
// A ParkedSyncer is owned by one goroutine (a log's committer): it is not
// safe for concurrent use. It holds one file descriptor (the eventfd) and
// one AIO context until Close.
type ParkedSyncer struct {
	ctx uintptr  // aio_context_t
	efd *os.File // the eventfd, non-blocking, in Go's poller
	raw int      // its descriptor, named in each iocb
	cb  iocb
	ev  ioEvent
	buf [8]byte
	off bool // the kernel refused the operation: every call blocks
}

// iocb is struct iocb of linux/aio_abi.h on a little-endian machine.
type iocb struct {
	data      uint64
	key       uint32
	rwFlags   uint32
	opcode    uint16
	reqprio   int16
	fildes    uint32
	buf       uint64
	nbytes    uint64
	offset    int64
	reserved2 uint64
	flags     uint32
	resfd     uint32
}

// ioEvent is struct io_event of linux/aio_abi.h.
type ioEvent struct {
	data, obj uint64
	res, res2 int64
}

const (
	iocbCmdFdsync = 3 // IOCB_CMD_FDSYNC
	iocbFlagResfd = 1 // IOCB_FLAG_RESFD: signal aio_resfd on completion
)

// NewParkedSyncer returns a ParkedSyncer, or an error when the kernel
// gives no AIO context (ENOSYS, or EAGAIN past fs.aio-max-nr): the caller
// then uses Fdatasync.
func NewParkedSyncer() (*ParkedSyncer, error) {
	if isBigEndian() {
		return nil, errors.New("tidseg: parked fdatasync: big-endian iocb layout not supported")
	}
	s := &ParkedSyncer{}
	if _, _, e := unix.Syscall(unix.SYS_IO_SETUP, 1, uintptr(unsafe.Pointer(&s.ctx)), 0); e != 0 {
		return nil, fmt.Errorf("tidseg: io_setup: %w", e)
	}
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Syscall(unix.SYS_IO_DESTROY, s.ctx, 0, 0)
		return nil, fmt.Errorf("tidseg: eventfd: %w", err)
	}
	// A non-blocking descriptor: os.NewFile registers it with the poller,
	// so a Read parks the goroutine instead of blocking its thread.
	s.efd, s.raw = os.NewFile(uintptr(fd), "fdatasync-eventfd"), fd
	return s, nil
}

// Fdatasync flushes f's data and the metadata needed to read it, like
// Fdatasync(f), parking the calling goroutine meanwhile. If the kernel
// refuses the request itself (no AIO fsync for this file or kernel, or no
// room in the context), it runs the blocking call instead, and a refusal
// of the operation (EINVAL) makes every later call block. An error of
// the fdatasync itself is returned as the blocking call's would be.
func (s *ParkedSyncer) Fdatasync(f *os.File) error {
	if s.off {
		return Fdatasync(f)
	}
	s.cb = iocb{opcode: iocbCmdFdsync, fildes: uint32(f.Fd()), flags: iocbFlagResfd, resfd: uint32(s.raw)}
	cbs := [1]*iocb{&s.cb}
	for {
		_, _, e := unix.Syscall(unix.SYS_IO_SUBMIT, s.ctx, 1, uintptr(unsafe.Pointer(&cbs[0])))
		switch e {
		case 0:
			return s.wait()
		case unix.EINTR:
			continue
		case unix.EINVAL:
			s.off = true
			return Fdatasync(f)
		case unix.EAGAIN:
			return Fdatasync(f)
		default:
			return &os.SyscallError{Syscall: "io_submit", Err: e}
		}
	}
}

// wait parks until the submitted fdatasync completes and returns its
// result.
func (s *ParkedSyncer) wait() error {
	for {
		n, err := s.efd.Read(s.buf[:])
		if err != nil {
			// Not expected of an eventfd. The fdatasync is still the
			// kernel's: wait for it blocking; its result is the answer.
			return s.reap()
		}
		if n == len(s.buf) && binary.LittleEndian.Uint64(s.buf[:]) > 0 {
			return s.reap()
		}
	}
}

// reap takes the completed fdatasync's event (blocking until it is there,
// which the eventfd said it is) and returns its result.
func (s *ParkedSyncer) reap() error {
	for {
		n, _, e := unix.Syscall6(unix.SYS_IO_GETEVENTS, s.ctx, 1, 1, uintptr(unsafe.Pointer(&s.ev)), 0, 0)
		switch {
		case e == unix.EINTR:
			continue
		case e != 0:
			return &os.SyscallError{Syscall: "io_getevents", Err: e}
		case n != 1:
			return fmt.Errorf("tidseg: io_getevents returned %d events, want 1", n)
		case s.ev.res < 0:
			return unix.Errno(-s.ev.res) // as unix.Fdatasync returns it
		}
		return nil
	}
}

// Close releases the AIO context and the eventfd. No Fdatasync may be
// running.
func (s *ParkedSyncer) Close() error {
	_, _, e := unix.Syscall(unix.SYS_IO_DESTROY, s.ctx, 0, 0)
	err := s.efd.Close()
	if e != 0 {
		return errors.Join(&os.SyscallError{Syscall: "io_destroy", Err: e}, err)
	}
	return err
}

func isBigEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 0
}
