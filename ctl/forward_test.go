package ctl

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"testing"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/shardmap"
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

// TestFollowerErrorsMatchCtlSentinels: Server.CreateStream, DeleteStream
// and Revoke say their errors match ErrStreamExists, ErrUnknownStream,
// ErrUnknownGrant, "on a follower the change is made by the leader":
// the leader's answer comes back from the wire, and matches none.
func TestFollowerErrorsMatchCtlSentinels(t *testing.T) {
	p := newPKI(t)
	srvs := startHA(t, p, 3)
	leader, follower := leaderAndFollower(t, srvs)
	if err := leader.CreateStream(shardmap.StreamConfig{Name: "orders", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Server{leader, follower} {
		role := s.role()
		if err := s.CreateStream(shardmap.StreamConfig{Name: "orders", Shards: 1}); !errors.Is(err, ErrStreamExists) {
			t.Errorf("%s: create again: %v, want it to match ctl.ErrStreamExists", role, err)
		}
		if err := s.DeleteStream("nope"); !errors.Is(err, ErrUnknownStream) {
			t.Errorf("%s: delete unknown: %v, want it to match ctl.ErrUnknownStream", role, err)
		}
		if err := s.Revoke(auth.Grant{Principal: "x", Action: auth.Subscribe, Pattern: "y"}); !errors.Is(err, ErrUnknownGrant) {
			t.Errorf("%s: revoke unknown: %v, want it to match ctl.ErrUnknownGrant", role, err)
		}
		if err := s.CreateStream(shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3}); !errors.Is(err, ErrTooFewMembers) {
			t.Errorf("%s: R=3 without members: %v, want it to match ctl.ErrTooFewMembers", role, err)
		}
	}
}
