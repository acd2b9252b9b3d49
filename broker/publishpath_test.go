package broker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
)

// TestAcksFlowWhileALaneConnects: while a publisher stream's lane to one
// owner is still dialing (held there by the DialPeer knob), the stream's
// records for shards this broker owns are read, committed and
// acknowledged; the forwards queued on the lane are written once it
// connects, in the order sent. (When routing held a lock across the dial,
// the local record was not even read until the dial ended.)
func TestAcksFlowWhileALaneConnects(t *testing.T) {
	release := make(chan struct{})
	var dials atomic.Int32
	ip := startInprocWith(t, func(c *Config) {
		c.Knobs.DialPeer = func(ctx context.Context, node string) error {
			dials.Add(1)
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}, 2, shardmap.StreamConfig{Name: "orders", Shards: 8})
	fwd := ip.brokers[0]
	st, _ := fwd.Map().Stream("orders")
	local, remote := -1, -1
	for i, o := range st.Placement.All() {
		switch {
		case o == fwd.NodeID() && local < 0:
			local = i
		case o != fwd.NodeID() && remote < 0:
			remote = i
		}
	}
	if local < 0 || remote < 0 {
		t.Fatalf("owners %v: want a shard on each broker", st.Placement)
	}

	ws := openStream(t, ip.dial(fwd))
	for seq := uint64(1); seq <= 3; seq++ {
		p := publish(seq, "orders", "remote")
		p.Shard = int32(remote)
		ws.send(p)
	}
	// The lane is dialing (held in the knob) before the local record is
	// sent: its ack must not wait for the dial.
	deadline := time.Now().Add(waitFor)
	for dials.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no dial to the remote owner within %v", waitFor)
		}
		time.Sleep(time.Millisecond)
	}
	p := publish(4, "orders", "local")
	p.Shard = int32(local)
	ws.send(p)
	if a := wantAck(t, ws.recv(), 4); a.Forwarded || a.Owner != fwd.NodeID() {
		t.Fatalf("ack %+v: want a local ack from %s", a, fwd.NodeID())
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials under way, want 1", n)
	}
	close(release)
	for seq := uint64(1); seq <= 3; seq++ {
		a := wantAck(t, ws.recv(), seq)
		if !a.Forwarded || a.Owner != st.Placement.Owner(remote) || a.Offset != seq-1 {
			t.Fatalf("ack %+v: want offset %d at %s, forwarded", a, seq-1, st.Placement.Owner(remote))
		}
	}
}
