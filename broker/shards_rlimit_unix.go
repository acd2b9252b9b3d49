//go:build unix

package broker

import "syscall"

// fdLimit returns the soft RLIMIT_NOFILE (which the Go runtime raises to
// the hard limit at start).
func fdLimit() (uint64, bool) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, false
	}
	return uint64(r.Cur), true // int64 on some BSDs
}
