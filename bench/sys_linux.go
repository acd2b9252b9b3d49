//go:build linux

package bench

import (
	"fmt"
	"os"
	"syscall"
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
