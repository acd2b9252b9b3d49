package broker

import (
	"context"
	"crypto/tls"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
	"github.com/felix-broker/felix/wal"
)

// dialPeer opens a peer connection to b presenting the node certificate
// of as, the way a forwarding broker does.
func (ip *inproc) dialPeer(b *Broker, as string) *quic.Conn {
	t := ip.t
	t.Helper()
	nt, err := cluster.LoadNodeTLS(filepath.Join(ip.dir, "certs"), as)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	conn, err := transport.Dial(ctx, b.Addr().String(), nt.Peer, transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.CloseWithError(0, "") })
	return conn
}

// TestOwnerFencesStaleForward: a forward routed by a map under which the
// receiver owned the shard, arriving after a newer map gave the shard away,
// is refused with NotOwner and the newer epoch, and nothing is written.
func TestOwnerFencesStaleForward(t *testing.T) {
	ip := startInproc(t, 2, shardmap.StreamConfig{Name: "orders", Shards: 1})
	owner, other := ip.owner("orders", 0), ip.nonOwner("orders", 0)

	fwd := openStream(t, ip.dialPeer(other, owner.NodeID()))
	p := publish(1, "orders", "stale")
	p.Shard, p.Epoch, p.Via = 0, 1, owner.NodeID()
	fwd.send(p)
	e := wantError(t, fwd.recv(), transport.ErrNotOwner)
	if e.Owner != owner.NodeID() || e.Epoch != other.Map().Epoch {
		t.Fatalf("refusal %+v: want owner %s at epoch %d", e, owner.NodeID(), other.Map().Epoch)
	}
	if next := ip.logOf(owner, "orders", 0).NextOffset(); next != 0 {
		t.Fatalf("a refused forward was written: next offset %d", next)
	}
}

// TestOwnerCatchesUpToForwarderEpoch: a forward carrying a newer epoch
// than the owner holds makes the owner fetch that map before judging.
func TestOwnerCatchesUpToForwarderEpoch(t *testing.T) {
	ip := startInproc(t, 2, shardmap.StreamConfig{Name: "orders", Shards: 1})
	owner, other := ip.owner("orders", 0), ip.nonOwner("orders", 0)
	fwd := openStream(t, ip.dialPeer(owner, other.NodeID()))
	p := publish(1, "orders", "future")
	p.Shard, p.Epoch, p.Via = 0, owner.Map().Epoch+1, other.NodeID()
	// Make the epoch exist: any map change will do.
	if err := ip.ctl.CreateStream(shardmap.StreamConfig{Name: "bump", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	fwd.send(p)
	a := wantAck(t, fwd.recv(), 1)
	if a.Owner != owner.NodeID() || !a.Forwarded || a.Via != other.NodeID() {
		t.Fatalf("ack %+v", a)
	}
	if owner.Map().Epoch < p.Epoch {
		t.Fatalf("owner did not catch up: epoch %d < %d", owner.Map().Epoch, p.Epoch)
	}
}

// TestPeerIdentity: the peer protocol needs a broker's node certificate
// (not a client's, not the control plane's, not none), and a peer
// forwards in its own name only (Via is its certificate's node id).
func TestPeerIdentity(t *testing.T) {
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	dir := filepath.Join(ip.dir, "certs")
	ca, err := transport.LoadCA(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	load := func(name string) *tls.Certificate {
		cert, err := transport.LoadKeyPair(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		return &cert
	}
	ip.clientCert("mallory")
	for _, tc := range []struct {
		name string
		cert *tls.Certificate
	}{
		{"client certificate", load("mallory")},
		{"control plane certificate", load("ctl")},
		{"no certificate", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			conn, err := transport.Dial(ctx, ip.brokers[0].Addr().String(), transport.ClientTLS(ca, tc.cert, "", transport.ALPNPeer), transport.Config{})
			if err != nil {
				return // refused at the handshake: fine
			}
			defer conn.CloseWithError(0, "")
			select {
			case <-conn.Context().Done():
			case <-ctx.Done():
				t.Fatal("the peer connection stayed open")
			}
		})
	}

	t.Run("node certificate forwarding as another node", func(t *testing.T) {
		// broker-1 is a member (registered, then stopped: its
		// certificate still names a member); broker-2 never joined.
		b1 := ip.startBroker(1)
		if err := b1.Close(); err != nil {
			t.Fatal(err)
		}
		ip.waitEpoch(ip.ctl.Map().Epoch)
		ws := openStream(t, ip.dialPeer(ip.brokers[0], cluster.BrokerID(1)))
		p := publish(1, "orders", "forged")
		p.Shard, p.Epoch, p.Via = 0, ip.brokers[0].Map().Epoch, cluster.BrokerID(2)
		ws.send(p)
		if e, ok := ws.recv().(*transport.Error); !ok || e.Code != transport.CodeUnauthorized {
			t.Fatalf("forward with Via of another node: %+v, want unauthorized", e)
		}
		p = publish(2, "orders", "genuine")
		p.Shard, p.Epoch, p.Via = 0, ip.brokers[0].Map().Epoch, cluster.BrokerID(1)
		ws.send(p)
		if a, ok := ws.recv().(*transport.Ack); !ok || a.Offset != 0 || a.Via != cluster.BrokerID(1) {
			t.Fatalf("forward in its own name: %+v, want the ack of offset 0", a)
		}
	})
}

// staleRoute is a three-broker cluster with one single-shard stream,
// "orders", and a routing seam: the next routing decision on any broker
// takes next, if set, instead of the broker's map. stale is the map as it
// was before the shard reached its owner (an epoch back, the shard on the
// wrong broker); storing it in next makes fwd forward to wrong, which
// refuses, so fwd must re-route to owner.
type staleRoute struct {
	ip                *inproc
	owner, fwd, wrong *Broker
	next              atomic.Pointer[shardmap.Map]
	stale             *shardmap.Map
}

// startStaleRoute starts it, with tweak (if any) applied to every broker's
// config first.
func startStaleRoute(t *testing.T, tweak func(*Config)) *staleRoute {
	t.Helper()
	sr := &staleRoute{}
	sr.ip = startInprocWith(t, func(c *Config) {
		if tweak != nil {
			tweak(c)
		}
		c.Knobs.RouteMap = func(m *shardmap.Map) *shardmap.Map {
			if s := sr.next.Swap(nil); s != nil {
				return s
			}
			return m
		}
	}, 3, shardmap.StreamConfig{Name: "orders", Shards: 1})
	sr.owner = sr.ip.owner("orders", 0)
	for _, b := range sr.ip.brokers {
		switch {
		case b == sr.owner:
		case sr.fwd == nil:
			sr.fwd = b
		default:
			sr.wrong = b
		}
	}
	cur := sr.fwd.Map()
	st, _ := cur.Stream("orders")
	moved := *st
	moved.Placement = shardmap.NewPlacement(sr.wrong.NodeID())
	sr.stale = shardmap.Assemble(cur.Epoch-1, cur.Nodes, []shardmap.Stream{moved})
	return sr
}

func (ip *inproc) logOf(b *Broker, stream string, shard int) interface{ NextOffset() uint64 } {
	ip.t.Helper()
	e, err := b.shards.acquire(b.Map(), shardmap.ShardID{Stream: stream, Shard: shard})
	if err != nil {
		ip.t.Fatal(err)
	}
	e.release()
	return e.log
}

func (s *shardSet) mustLog(t *testing.T, stream string, shard int) interface {
	Read(uint64, int, int) ([]wal.Record, error)
} {
	t.Helper()
	s.mu.RLock()
	e := s.mu.entries[shardmap.ShardID{Stream: stream, Shard: shard}]
	s.mu.RUnlock()
	if e == nil {
		t.Fatalf("shard %s/%d not open", stream, shard)
	}
	<-e.ready
	return e.log
}

// TestForwarderReroutesAfterMapChange: the forwarder routes by a map that
// is already stale (it names a broker that no longer owns the shard); that
// broker refuses with NotOwner and its epoch, and the forwarder refreshes
// and re-routes. The publisher sees exactly one ack, from the owner, which
// holds the record; the refusing broker wrote nothing.
func TestForwarderReroutesAfterMapChange(t *testing.T) {
	sr := startStaleRoute(t, nil)
	ip, owner, fwd, wrong, staleMap, stale := sr.ip, sr.owner, sr.fwd, sr.wrong, &sr.next, sr.stale

	ws := openStream(t, ip.dial(fwd))
	staleMap.Store(stale)
	ws.send(publish(1, "orders", "rerouted"))
	a := wantAck(t, ws.recv(), 1)
	if a.Owner != owner.NodeID() || !a.Forwarded || a.Via != fwd.NodeID() || a.Offset != 0 {
		t.Fatalf("ack %+v: want %s at offset 0 via %s", a, owner.NodeID(), fwd.NodeID())
	}
	if staleMap.Load() != nil {
		t.Fatal("the stale map was never used for routing")
	}
	if next := ip.logOf(owner, "orders", 0).NextOffset(); next != 1 {
		t.Fatalf("owner holds %d records, want 1", next)
	}
	wrong.shards.mu.RLock()
	_, open := wrong.shards.mu.entries[shardmap.ShardID{Stream: "orders", Shard: 0}]
	wrong.shards.mu.RUnlock()
	if open {
		t.Fatal("the broker that refused opened a log for the shard")
	}
	// Exactly one answer: the next frame is the ack of the next publish.
	ws.send(publish(2, "orders", "next"))
	if a := wantAck(t, ws.recv(), 2); a.Offset != 1 {
		t.Fatalf("second ack %+v", a)
	}
}

// TestRerouteKeepsOrder: a publisher pipelines records of one shard
// through a forwarder whose map is stale for the first of them. The first
// is refused by the broker the stale map named and routed again; the ones
// after it, routed by the current map, must not overtake it: the owner
// commits them in the order sent (DESIGN: order holds through a
// forwarding broker, and the client never sees the retry).
func TestRerouteKeepsOrder(t *testing.T) {
	sr := startStaleRoute(t, nil)
	ip, owner, fwd, staleMap, stale := sr.ip, sr.owner, sr.fwd, &sr.next, sr.stale

	ws := openStream(t, ip.dial(fwd))
	staleMap.Store(stale)
	const n = 8
	for i := uint64(1); i <= n; i++ {
		p := publish(i, "orders", "k")
		p.Value = []byte(fmt.Sprint(i))
		ws.send(p)
	}
	offsets := map[uint64]uint64{}
	for range n {
		f := ws.recv()
		a, ok := f.(*transport.Ack)
		if !ok {
			t.Fatalf("want an ack, got %T %+v", f, f)
		}
		offsets[a.Seq] = a.Offset
	}
	for i := uint64(1); i <= n; i++ {
		if off, ok := offsets[i]; !ok || off != i-1 {
			t.Errorf("record %d: acked %v at offset %d, want offset %d (sent in order on one stream)", i, ok, off, i-1)
		}
	}
	recs, err := owner.shards.mustLog(t, "orders", 0).Read(0, n, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range recs {
		if got, want := string(r.Value), fmt.Sprint(i+1); got != want {
			t.Errorf("offset %d holds record %s, want %s", i, got, want)
		}
	}
}

// TestOwnerServesIncarnationWithoutCatchingUp: a forward carrying a newer
// epoch than the owner holds, and the incarnation of the stream the
// owner's map has, with the shard on the owner, is written at once: the
// owner need not reach the control plane (the epoch here never exists,
// as when the owner's link to the control plane is down). A forward
// naming another incarnation still waits for the newer map, and is
// refused unavailable when none comes.
func TestOwnerServesIncarnationWithoutCatchingUp(t *testing.T) {
	ip := startInprocWith(t, func(c *Config) { c.ForwardTimeout = 300 * time.Millisecond }, 2, shardmap.StreamConfig{Name: "orders", Shards: 1})
	owner, other := ip.owner("orders", 0), ip.nonOwner("orders", 0)
	st, _ := owner.Map().Stream("orders")
	if st.Created == 0 {
		t.Fatal("the stream has no incarnation")
	}
	fwd := openStream(t, ip.dialPeer(owner, other.NodeID()))
	p := publish(1, "orders", "same stream")
	p.Shard, p.Epoch, p.Via, p.Created = 0, owner.Map().Epoch+100, other.NodeID(), st.Created
	fwd.send(p)
	if a := wantAck(t, fwd.recv(), 1); a.Owner != owner.NodeID() || a.Offset != 0 {
		t.Fatalf("ack %+v", a)
	}

	p = publish(2, "orders", "another incarnation")
	p.Shard, p.Epoch, p.Via, p.Created = 0, owner.Map().Epoch+100, other.NodeID(), st.Created+1
	fwd.send(p)
	wantError(t, fwd.recv(), transport.ErrUnavailable)
	if next := ip.logOf(owner, "orders", 0).NextOffset(); next != 1 {
		t.Fatalf("owner holds %d records, want 1", next)
	}
}
