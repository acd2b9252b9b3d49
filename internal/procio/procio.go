// Package procio reads what the process has read, for tests that bound
// the bytes a code path reads from files (rchar of /proc/self/io). It
// holds no state and starts no goroutine.
package procio

import (
	"os"
	"strconv"
	"strings"
)

// Read returns the bytes this process has read through read system calls
// (read, pread, readv: rchar of /proc/self/io; recvmsg, which QUIC uses,
// is not counted), or ok false where there is no such file (not Linux).
func Read() (n uint64, ok bool) {
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(data)) {
		if v, found := strings.CutPrefix(line, "rchar: "); found {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
