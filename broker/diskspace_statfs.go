//go:build linux || darwin || freebsd

package broker

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// freeBytes returns the bytes of dir's filesystem free to an unprivileged
// writer (what a non-root broker may still write; root may write some
// reserved blocks beyond it, which this leaves for the system).
func freeBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}
