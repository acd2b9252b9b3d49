package cluster_test

import (
	"context"
	"net"
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
