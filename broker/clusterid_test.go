package broker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestOtherClusterRefused: a broker keeps the ID of its cluster with its
// data, and a control plane of another cluster (here: its own, started
// again with its state lost) is refused, before any map of it is applied.
// Applied, that map would have removed the broker's stream: the new
// cluster does not hold it, and its epochs have passed the stream's
// creation mark. The other control plane refuses the registration before
// it records the broker (a member of its own refuses the map too, should
// a control plane not check: ctlclient TestMemberCluster). Back with its
// own control plane, the broker serves the stream where it left off.
func TestOtherClusterRefused(t *testing.T) {
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	caFile := filepath.Join(ip.dir, "certs", "ca.crt")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	publish := func(b *Broker) client.Ack {
		t.Helper()
		c, err := client.Connect(ctx, b.Addr().String(), client.WithCAFile(caFile), adminCert(caFile), client.WithLogger(quiet()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ack, err := c.Publish(ctx, "orders", nil, []byte("kept"))
		if err != nil {
			t.Fatal(err)
		}
		return ack
	}
	if ack := publish(ip.brokers[0]); ack.Offset != 0 {
		t.Fatalf("first record at offset %d", ack.Offset)
	}
	dataDir := filepath.Join(ip.dir, cluster.BrokerID(0))
	first := ip.ctl.Map().Cluster
	if kept, err := readClusterID(dataDir); err != nil || kept == "" || kept != first {
		t.Fatalf("the broker keeps cluster %q (%v), want the map's %q", kept, err, first)
	}
	if err := ip.brokers[0].Close(); err != nil {
		t.Fatal(err)
	}
	ip.brokers = nil
	ip.ctl.Close()

	// Its control plane again, with its state lost: a new cluster, whose
	// epochs pass the stream's creation mark.
	lost := ip.startCtl("ctl-lost")
	if lost.Map().Cluster == first || lost.Map().Cluster == "" {
		t.Fatalf("a control plane with its state lost has cluster %q, the first was %q", lost.Map().Cluster, first)
	}
	for i := range 5 {
		if err := lost.CreateStream(shardmap.StreamConfig{Name: fmt.Sprintf("other%d", i), Shards: 1}); err != nil {
			t.Fatal(err)
		}
	}
	b := ip.newBroker(0)
	err := b.Start(ctx)
	b.Close()
	if !errors.Is(err, transport.ErrInvalid) || !strings.Contains(err.Error(), "belongs to another cluster") {
		t.Fatalf("start against another cluster: %v, want its registration refused", err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "streams", "orders")); err != nil {
		t.Fatalf("the stream's data after a start against another cluster: %v", err)
	}
	// Refused before it was recorded: the other cluster has no such member.
	for _, n := range lost.Map().Nodes {
		if n.ID == cluster.BrokerID(0) {
			t.Fatalf("the other cluster's map lists %s (live %v) after refusing it", n.ID, n.Live)
		}
	}
	lost.Close()

	// Its own control plane, state and all: the broker goes on.
	ip.startCtl("ctl")
	b = ip.startBroker(0)
	ip.brokers = append(ip.brokers, b)
	if ack := publish(b); ack.Offset != 1 {
		t.Fatalf("back in its cluster, the next record is at offset %d, want 1", ack.Offset)
	}
}
