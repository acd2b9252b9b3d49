//go:build !unix

package broker

// fdLimit reports no limit where there is no RLIMIT_NOFILE.
func fdLimit() (uint64, bool) { return 0, false }
