package cluster_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/internal/clustertest"
)

// TestStartSaysWhyABrokerExited: a broker that cannot start (its port is
// taken) ends Start at once with the broker's own words; Start waited
// for its context (30 s under felix dev) and said only that the map never
// showed the brokers live.
func TestStartSaysWhyABrokerExited(t *testing.T) {
	taken, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Options{
		Dir: t.TempDir(), Binary: clustertest.Binary(t), Brokers: 1,
		BrokerPorts: []int{taken.LocalAddr().(*net.UDPAddr).Port},
	})
	if err == nil {
		c.Close()
		t.Fatal("a cluster whose broker's port is taken started")
	}
	if ctx.Err() != nil || !strings.Contains(err.Error(), "broker-0 exited") || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Start: %v; want it to say at once that broker-0 exited, and why", err)
	}
}

// TestFailedBrokerStartClosesItsLog: a cluster whose broker binary
// cannot be run fails Start and leaves no broker log file open; the one
// opened for the broker's output stayed open.
func TestFailedBrokerStartClosesItsLog(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Options{Dir: dir, Binary: filepath.Join(dir, "no-such-felix"), Brokers: 1, LeaseTTL: time.Second})
	if err == nil {
		c.Close()
		t.Fatal("Start succeeded without a binary")
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	for _, fd := range fds {
		if p, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(p, dir) {
			t.Errorf("after Start failed: %s still open", p)
		}
	}
}
