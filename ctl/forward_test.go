package ctl

import (
	"context"
	"crypto/tls"
	"net"
	"testing"

	"github.com/felix-broker/felix/transport"
)

// TestForwarderCloseDoesNotWaitForADial checks that the forwarder holds
// its lock only around its cache, never across a dial: close (and every
// request that finds a connection) returns while a dial to a leader that
// does not answer is still under way, and the dial, once it ends, caches
// nothing.
func TestForwarderCloseDoesNotWaitForADial(t *testing.T) {
	hole, err := net.ListenPacket("udp", "127.0.0.1:0") // never answers a handshake
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	var f forwarder
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dialed := make(chan error, 1)
	go func() {
		_, err := f.dial(ctx, hole.LocalAddr().String(), &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{transport.ALPNCtl}}, transport.Config{})
		dialed <- err
	}()
	// The dial is under way once its first packet reaches the hole.
	if _, _, err := hole.ReadFrom(make([]byte, 2048)); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() {
		f.close()
		close(closed)
	}()
	select {
	case <-closed:
	case err := <-dialed:
		t.Fatalf("the dial ended (%v) before close returned: close waited for it", err)
	}
	cancel()
	if err := <-dialed; err == nil {
		t.Fatal("a dial to an address that never answers succeeded")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn != nil {
		t.Fatal("a connection is cached after close")
	}
}
