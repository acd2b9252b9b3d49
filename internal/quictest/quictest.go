// Package quictest holds what tests of QUIC servers share: it counts
// what quic-go holds in a process, so that a test can bound what a
// client makes a server keep. It is for tests only and does no I/O.
package quictest

import (
	"bytes"
	"fmt"
	"runtime/pprof"
	"strings"
)

// ServerHandshakes counts the goroutines quic-go runs per server
// connection in its handshake, in this process.
func ServerHandshakes() int {
	var buf bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&buf, 1)
	n := 0
	for _, blk := range strings.Split(buf.String(), "\n\n") {
		if !strings.Contains(blk, "(*baseServer).handleNewConn") {
			continue
		}
		// A block is "<count> @ <pcs>"; the first one has the
		// profile's header line before it.
		at := strings.Index(blk, " @ ")
		var c int
		if _, err := fmt.Sscanf(blk[strings.LastIndex(blk[:at], "\n")+1:], "%d @", &c); err == nil {
			n += c
		}
	}
	return n
}
