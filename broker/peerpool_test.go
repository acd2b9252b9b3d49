package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestPeerDialOutlivesItsFirstCaller: the pool's dial of a peer is its
// own, not its first caller's: when the lane that asked first ends, the
// others waiting for the same connection keep waiting for the dial's
// outcome. The dial once ran under the first caller's context, and every
// lane waiting on it failed with "context canceled".
func TestPeerDialOutlivesItsFirstCaller(t *testing.T) {
	pool, node := poolWithSilentPeer(t)

	first, cancel := context.WithCancel(context.Background())
	firstErr := make(chan error, 1)
	go func() {
		_, err := pool.conn(first, node)
		firstErr <- err
	}()
	time.Sleep(50 * time.Millisecond) // the first call owns the dial
	secondErr := make(chan error, 1)
	go func() {
		_, err := pool.conn(context.Background(), node)
		secondErr <- err
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	if err := <-firstErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("first caller, cancelled: %v", err)
	}
	err := <-secondErr
	if err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("second caller after the first one's end: %v; want the dial's own failure", err)
	}
}

// TestMovedPeerOldConnectionClosed: once the map gives a peer a new
// address, the pool dials it there, and closes its connection to the old
// one when the last forwarding lane on it leaves (at once when it has
// none). The old connection used to be dropped from the pool unclosed,
// and the pool's close never closed it.
func TestMovedPeerOldConnectionClosed(t *testing.T) {
	self, peer := nodeTLSPair(t)
	// broker-9 at two addresses, accepting and keeping connections
	// until its listener closes them.
	listen := func() shardmap.Node {
		var accepting sync.WaitGroup
		ln, err := transport.Listen("127.0.0.1:0", peer.Server, transport.Config{})
		if err != nil {
			t.Fatal(err)
		}
		accepting.Go(func() {
			for {
				if _, err := ln.Accept(context.Background()); err != nil {
					return
				}
			}
		})
		t.Cleanup(func() { ln.Close(); accepting.Wait() })
		return shardmap.Node{ID: "broker-9", Addr: ln.Addr().String()}
	}
	atA, atB := listen(), listen()
	pool := newPeerPool(self.Peer, transport.Config{}, quiet(), &quicAccount{})
	defer pool.close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	closedSoon := func(c *quic.Conn) bool {
		select {
		case <-c.Context().Done():
			return true
		case <-time.After(2 * time.Second):
			return false
		}
	}

	lane, err := pool.lease(ctx, atA)
	if err != nil {
		t.Fatal(err)
	}
	toB, err := pool.conn(ctx, atB) // the peer moved to B
	if err != nil {
		t.Fatal(err)
	}
	if lane.conn.Context().Err() != nil {
		t.Fatal("the connection to A closed under its lane")
	}
	pool.release(lane, false)
	if !closedSoon(lane.conn) {
		t.Error("the connection to A still open after its last lane left")
	}

	if _, err := pool.conn(ctx, atA); err != nil { // and back to A
		t.Fatal(err)
	}
	if !closedSoon(toB) {
		t.Error("the connection to B, with no lane, still open after the peer moved")
	}
}

// TestPeerDownEndsDialInFlight: a map that marks a peer down ends a dial
// to it in flight, so the lanes waiting on it route their records again
// at once. dropDown used to skip dials in flight, and a record queued on
// a lane to a broker that had just shut down waited out dialTimeout (3 s).
func TestPeerDownEndsDialInFlight(t *testing.T) {
	pool, node := poolWithSilentPeer(t)
	dialed := make(chan error, 1)
	go func() {
		_, err := pool.conn(context.Background(), node)
		dialed <- err
	}()
	time.Sleep(50 * time.Millisecond) // the dial is in flight
	start := time.Now()
	pool.dropDown(shardmap.Build(2, []shardmap.Node{node}, nil)) // broker-9 not live
	select {
	case err := <-dialed:
		if err == nil {
			t.Fatal("the dial to a peer marked down succeeded")
		}
		if took := time.Since(start); took > dialTimeout/3 {
			t.Fatalf("the dial ended %v after the map marked its peer down; want at once", took)
		}
	case <-time.After(dialTimeout + time.Second):
		t.Fatal("the dial to a peer marked down did not end")
	}
}

// poolWithSilentPeer returns a peer pool and a peer, broker-9, that never
// answers: a dial to it runs until dialTimeout. Both are closed when t
// ends.
func poolWithSilentPeer(t *testing.T) (*peerPool, shardmap.Node) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	pool := newPeerPool(&tls.Config{NextProtos: []string{transport.ALPNPeer}, ServerName: "broker-9"}, transport.Config{}, quiet(), &quicAccount{})
	t.Cleanup(pool.close)
	return pool, shardmap.Node{ID: "broker-9", Addr: pc.LocalAddr().String()}
}

// TestLanesOverflowToMoreConnections: lanes to one peer past what one
// connection's streams allow go on overflow connections, each lane's
// stream opens at once, and an overflow connection closes when its last
// lane leaves while the pooled one stays. Every lane past the peer's
// stream limit once waited in OpenStreamSync until dialTimeout and
// failed.
func TestLanesOverflowToMoreConnections(t *testing.T) {
	self, peer := nodeTLSPair(t)
	cfg := transport.Config{MaxIncomingStreams: 4}
	ln, err := transport.Listen("127.0.0.1:0", peer.Server, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var serving sync.WaitGroup
	serving.Go(func() { // broker-9 accepts every stream and keeps it open
		for {
			conn, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			serving.Go(func() {
				for {
					if _, err := conn.AcceptStream(context.Background()); err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() { ln.Close(); serving.Wait() })
	node := shardmap.Node{ID: "broker-9", Addr: ln.Addr().String()}
	pool := newPeerPool(self.Peer, cfg, quiet(), &quicAccount{})
	defer pool.close()
	if pool.lanesPerConn != 3 {
		t.Fatalf("lanes per connection at 4 streams: %d, want 3", pool.lanesPerConn)
	}

	const n = 10
	var leased []*peerConn
	conns := map[*quic.Conn]int{}
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		pc, err := pool.lease(ctx, node)
		if err != nil {
			cancel()
			t.Fatalf("lease %d: %v", i, err)
		}
		s, err := pc.conn.OpenStreamSync(ctx)
		cancel()
		if err != nil {
			t.Fatalf("lane %d's stream: %v", i, err)
		}
		if _, err := s.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
		leased = append(leased, pc)
		conns[pc.conn]++
	}
	if len(conns) != 4 {
		t.Fatalf("%d lanes at 3 a connection went on %d connections, want 4", n, len(conns))
	}
	pooled := pool.pooled("broker-9")
	for _, pc := range leased {
		pool.release(pc, false)
	}
	for conn := range conns {
		if conn == pooled {
			continue
		}
		select {
		case <-conn.Context().Done():
		case <-time.After(2 * time.Second):
			t.Fatal("an overflow connection still open after its last lane left")
		}
	}
	if pooled.Context().Err() != nil {
		t.Fatal("the pooled connection closed with its lanes")
	}
}

// nodeTLSPair returns the node TLS of broker-0, the pool's own, and of
// broker-9, its peer, from one dev CA.
func nodeTLSPair(t *testing.T) (self, peer cluster.NodeTLS) {
	t.Helper()
	dir := t.TempDir()
	if err := transport.GenerateDevCerts(dir, "broker-0", "broker-9"); err != nil {
		t.Fatal(err)
	}
	self, err := cluster.LoadNodeTLS(dir, "broker-0")
	if err != nil {
		t.Fatal(err)
	}
	peer, err = cluster.LoadNodeTLS(dir, "broker-9")
	if err != nil {
		t.Fatal(err)
	}
	return self, peer
}
