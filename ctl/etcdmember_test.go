package ctl

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestLeaderHandsOverOnClose closes the leader of a three-member etcd
// cluster while the others run: it hands its leadership over before it
// stops (stopEmbedded), so when Close returns another member already
// leads. Without the hand-over none would for an election timeout (1 s
// here) after the leader's last heartbeat.
func TestLeaderHandsOverOnClose(t *testing.T) {
	awaitPeerConnsClosed(t)
	ports, err := freeTCPPorts(6)
	if err != nil {
		t.Fatal(err)
	}
	var peers []string
	cfgs := make([]EtcdConfig, 3)
	for i := range cfgs {
		cfgs[i] = EtcdConfig{Name: fmt.Sprint("etcd-", i),
			ClientURL: fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]),
			PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]),
			TickMs:    100, ElectionMs: 1000, Insecure: true}
		peers = append(peers, cfgs[i].Name+"="+cfgs[i].PeerURL)
	}
	members := make([]*EtcdMember, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range cfgs {
		cfgs[i].InitialCluster = strings.Join(peers, ",")
		wg.Go(func() { members[i], errs[i] = StartEtcdMember(t.TempDir(), cfgs[i], testLogger(t)) })
	}
	wg.Wait()
	for i, m := range members {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		t.Cleanup(m.Close)
	}

	var leader *EtcdMember
	for deadline := time.Now().Add(waitFor); leader == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no etcd leader elected")
		}
		for _, m := range members {
			if m.e.Server.Leader() == m.e.Server.MemberID() {
				leader = m
			}
		}
	}
	leader.Close()
	var now []string
	for _, m := range members {
		if m == leader {
			continue
		}
		if m.e.Server.Leader() == m.e.Server.MemberID() {
			return
		}
		now = append(now, fmt.Sprintf("%s sees leader %s", m.e.Config().Name, m.e.Server.Leader()))
	}
	t.Errorf("the leader (%s) closed without handing its leadership over: %s", leader.e.Server.MemberID(), strings.Join(now, ", "))
}

// A plain http URL naming localhost is allowed because it stays on this
// machine: the member must listen on loopback, not on every interface.
func TestLocalhostURLsListenOnLoopback(t *testing.T) {
	ports, err := freeTCPPorts(2)
	if err != nil {
		t.Fatal(err)
	}
	m, err := StartEtcdMember(t.TempDir(), EtcdConfig{Name: "m",
		ClientURL: fmt.Sprintf("http://localhost:%d", ports[0]),
		PeerURL:   fmt.Sprintf("http://localhost:%d", ports[1])}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, ln := range m.e.Clients {
		if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
			t.Errorf("plain http client URL http://localhost:%d listens on %s", ports[0], ln.Addr())
		}
	}
	for _, p := range m.e.Peers {
		if ip := p.Listener.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
			t.Errorf("plain http peer URL http://localhost:%d listens on %s", ports[1], p.Listener.Addr())
		}
	}
}
