//go:build linux

package bench

import (
	"fmt"
	"math"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// fdatasync makes f's data durable, as the wal does (fdatasync on Linux).
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }

// fsType names the filesystem holding path.
func fsType(path string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return "unknown"
	}
	switch uint64(st.Type) {
	case 0x01021994:
		return "tmpfs"
	case 0xef53:
		return "ext4"
	case 0x58465342:
		return "xfs"
	case 0x9123683e:
		return "btrfs"
	case 0x794c7630:
		return "overlayfs"
	case 0x2fc12fc1:
		return "zfs"
	}
	return fmt.Sprintf("0x%x", st.Type)
}

// dieWithParent makes a child process get SIGKILL when the bench dies, so
// a killed bench leaves no echo process behind.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// futexWait parks the calling thread in the kernel while *addr is val
// (it may return early, spuriously). A goroutine parked on a channel is
// made runnable by Go's scheduler one at a time, each through another
// thread's wake-up; threads parked on one futex are all made runnable by
// one futexWakeAll, in the kernel (see sharedSyncer).
func futexWait(addr *atomic.Uint32, val uint32) {
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), linuxFutexWaitPrivate, uintptr(val), 0, 0, 0)
}

// futexWakeAll wakes every thread parked in futexWait on addr.
func futexWakeAll(addr *atomic.Uint32) {
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), linuxFutexWakePrivate, math.MaxInt32, 0, 0, 0)
}

// FUTEX_WAIT and FUTEX_WAKE with FUTEX_PRIVATE_FLAG (linux/futex.h).
const (
	linuxFutexWaitPrivate = 0 | 128
	linuxFutexWakePrivate = 1 | 128
)
