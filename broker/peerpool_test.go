package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestPeerDialOutlivesItsFirstCaller: the pool's dial of a peer is its
// own, not its first caller's: when the lane that asked first ends, the
// others waiting for the same connection keep waiting for the dial's
// outcome. The dial once ran under the first caller's context, and every
// lane waiting on it failed with "context canceled".
func TestPeerDialOutlivesItsFirstCaller(t *testing.T) {
	// A peer that never answers: the dial runs until dialTimeout.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	pool := newPeerPool(&tls.Config{NextProtos: []string{transport.ALPNPeer}, ServerName: "broker-9"}, transport.Config{}, quiet(), &quicAccount{})
	defer pool.close()
	node := shardmap.Node{ID: "broker-9", Addr: pc.LocalAddr().String()}

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
	err = <-secondErr
	if err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("second caller after the first one's end: %v; want the dial's own failure", err)
	}
}
