package freeport

import (
	"net"
	"strconv"
	"testing"
)

// TestPortsBelowEphemeralRange: the ports picked are free, distinct, and
// below the kernel's ephemeral range, where no socket that binds none
// of its own can take them while their server is down.
func TestPortsBelowEphemeralRange(t *testing.T) {
	low := EphemeralLow()
	if low <= Min+1000 {
		t.Skipf("no room below the ephemeral range (its first port: %d)", low)
	}
	inRange := func(port int) {
		t.Helper()
		if port < Min || port >= low {
			t.Fatalf("picked %d, not in [%d, %d)", port, Min, low)
		}
	}
	for range 20 {
		port, err := UDP("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		inRange(port)
		pc, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("UDP port %d is not free: %v", port, err)
		}
		pc.Close()

		ports, err := TCP("127.0.0.1", 6)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[int]bool{}
		for _, port := range ports {
			inRange(port)
			if seen[port] {
				t.Fatalf("TCP gave %d twice: %v", port, ports)
			}
			seen[port] = true
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err != nil {
				t.Fatalf("TCP port %d is not free: %v", port, err)
			}
			ln.Close()
		}
	}
}
