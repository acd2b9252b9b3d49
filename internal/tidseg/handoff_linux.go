package tidseg

import (
	"os"
	"runtime"
	"syscall"
	_ "unsafe" // go:linkname

	"golang.org/x/sys/unix"
)

// FdatasyncHandOff is Fdatasync that gives the calling goroutine's P to
// the rest of the process for the length of the call, as the runtime does
// for its own blocking system calls.
//
// A goroutine in an ordinary system call keeps its P: the runtime hands
// it on only when sysmon finds the same call still running at two of its
// checks, and sysmon checks every 10 ms once a process has been busy
// without retaking anything for a millisecond. A broker whose P is held by
// an fdatasync reads no packet, writes no ack and starts no other shard's
// commit until the disk answers; with GOMAXPROCS=1 (a local cluster's
// brokers) that is the whole process. Traced at 10% load (bench's load
// rows, 2 shards per broker): 1,580 fdatasyncs a second per broker, 0 to
// 35% of them with any other goroutine running meanwhile, the rest of the
// broker waiting up to 10 ms (p99) to be scheduled.
//
// Handing the P on costs a thread wake-up when nothing else would poll the
// network (the runtime starts a thread to do it), which a lone record on
// an idle process pays for nothing (measured 2% on a closed loop's p50),
// and once the disk answers the caller waits for a P like any runnable
// goroutine, which a busy process makes long: package wal chooses per
// commit (its tailSync). Each call blocks a thread; a process has at most
// one such call per file it syncs this way at a time.
//
// entersyscallblock and exitsyscall are the runtime's own entry and exit
// for a system call known to block; the runtime keeps both reachable by
// go:linkname (go.dev/issue/67401: gVisor uses them the same way). Between
// them the code may not grow the stack or touch the race detector: the
// function is nosplit and norace, and the call is the raw one.
func FdatasyncHandOff(f *os.File) error {
	fd := f.Fd()
	defer runtime.KeepAlive(f)
	for {
		switch e := fdatasyncBlock(fd); e {
		case 0:
			return nil
		case unix.EINTR:
		default:
			return e
		}
	}
}

//go:nosplit
//go:norace
func fdatasyncBlock(fd uintptr) syscall.Errno {
	entersyscallblock()
	_, _, e := syscall.RawSyscall6(unix.SYS_FDATASYNC, fd, 0, 0, 0, 0, 0)
	exitsyscall()
	return e
}

//go:linkname entersyscallblock runtime.entersyscallblock
func entersyscallblock()

//go:linkname exitsyscall runtime.exitsyscall
func exitsyscall()
