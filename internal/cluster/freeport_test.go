package cluster

import (
	"net"
	"strconv"
	"testing"
)

// TestFreePortOutsideEphemeralRange: a broker's port is one no socket
// gets by binding none of its own, so a broker restarted on it after a
// kill finds it free.
func TestFreePortOutsideEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	if low <= minFreePort+1000 {
		t.Skipf("no room below the ephemeral range (its first port: %d)", low)
	}
	for range 20 {
		port, err := FreePort("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		if port < minFreePort || port >= low {
			t.Fatalf("FreePort gave %d, not in [%d, %d)", port, minFreePort, low)
		}
		pc, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("port %d from FreePort is not free: %v", port, err)
		}
		pc.Close()
	}
}
