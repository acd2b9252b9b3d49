package broker

import (
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestCatchUpMissesShareOneWait: pipelined forwards that each need a map
// the control plane cannot give share one ForwardTimeout of waiting: the
// first waits it out, those after it fail at once. Each once waited its
// own ForwardTimeout in turn on the peer stream's reader (n forwards, n
// timeouts).
func TestCatchUpMissesShareOneWait(t *testing.T) {
	const ft, n = 300 * time.Millisecond, 10
	ip := startInprocWith(t, func(c *Config) { c.ForwardTimeout = ft }, 2, shardmap.StreamConfig{Name: "orders", Shards: 1})
	owner, other := ip.owner("orders", 0), ip.nonOwner("orders", 0)
	st, _ := owner.Map().Stream("orders")
	fwd := openStream(t, ip.dialPeer(owner, other.NodeID()))
	start := time.Now()
	for i := uint64(1); i <= n; i++ {
		p := publish(i, "orders", "x")
		// Another incarnation of the stream, by an epoch no one has: the
		// owner must catch up first, and cannot.
		p.Shard, p.Epoch, p.Via, p.Created = 0, owner.Map().Epoch+100, other.NodeID(), st.Created+1
		fwd.send(p)
	}
	for range n {
		wantError(t, fwd.recv(), transport.ErrUnavailable)
	}
	// n waits in turn take n x ForwardTimeout; one shared, about one.
	if took := time.Since(start); took > n/2*ft {
		t.Fatalf("%d pipelined forwards answered in %v, %.1f x ForwardTimeout: they waited one after another", n, took, float64(took)/float64(ft))
	}
}
