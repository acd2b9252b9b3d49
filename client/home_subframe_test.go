package client

import (
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestSubscriptionErrorFrameKeepsHome: the home broker answers a
// subscription with a shutting_down error frame (as readError does when
// the shard's log or replica is closed under the read: a replica moved
// away or replaced), without closing the connection or stopping
// anything else. That does not say the broker is going away, and must
// not move the home; it once did, for good (ad57178; the client does not
// move back).
func TestSubscriptionErrorFrameKeepsHome(t *testing.T) {
	fc := newFakeCluster(t, 3)
	c0 := connect(t, fc, 0)
	ctx := testCtx(t)
	if err := c0.CreateStream(ctx, shardmap.StreamConfig{Name: "s", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	m, err := c0.refreshMap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	owner, err := m.Owner("s", 0)
	if err != nil {
		t.Fatal(err)
	}
	idx := -1
	for i, b := range fc.brokers {
		if b.id == owner.ID {
			idx = i
		}
	}
	c := connect(t, fc, idx)
	home := c.Addr()
	fc.brokers[idx].subErr.Store(&transport.Error{Code: transport.CodeShuttingDown, Message: "reading s/0 at offset 0: wal: closed"})
	sub, err := c.Subscribe(ctx, "s", Earliest())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && fc.brokers[idx].subs.Load() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	if got := c.Addr(); got != home {
		t.Fatalf("home moved from %s to %s after a shutting_down error frame on a subscription; the broker is not shutting down (connection open, publishes served)", home, got)
	}
}
