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

// TestCatchUpMissCoversOlderEpochs: once a wait for a map epoch gave up,
// an epoch lower than that one but still newer than the broker's map
// fails at once too, until the map moves on: a publisher naming
// incarnations from the future counting down (Publish.Created) once
// started a new wait, and a new round of map requests to the control
// plane, with each record.
func TestCatchUpMissCoversOlderEpochs(t *testing.T) {
	const ft = 3 * time.Second
	ip := startInprocWith(t, func(c *Config) { c.ForwardTimeout = ft }, 1,
		shardmap.StreamConfig{Name: "orders", Shards: 1})
	b := ip.brokers[0]
	ws := openStream(t, ip.dial(b))
	epoch := b.Map().Epoch
	for i, created := range []uint64{epoch + 1_000_000, epoch + 1_000, epoch + 10, epoch + 1} {
		start := time.Now()
		ws.send(&transport.Publish{Seq: uint64(i + 1), Stream: "orders", Shard: 0, Value: []byte("x"), Created: created})
		wantError(t, ws.recv(), transport.ErrUnavailable)
		if took := time.Since(start); i > 0 && took > ft/2 {
			t.Errorf("a record of the incarnation of epoch %d (the broker's map is %d) failed after %v (ForwardTimeout %v): it waited for the map again", created, epoch, took.Round(time.Millisecond), ft)
		}
	}
	wantAck(t, publishShard(ws, 5, "orders", 0, "next"), 5)
}
