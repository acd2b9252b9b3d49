package ctl

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"
	"go.etcd.io/etcd/server/v3/etcdserver/api/membership"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
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

// TestEtcdChangedInitialClusterRefused restarts a ctl that ran alone (a
// single-member etcd) as ctl-0 of three, with the initial cluster of the
// three, while ctl-1 and ctl-2 start with empty data directories. etcd
// ignores the initial cluster of a member that has data: ctl-0 would stay
// a one-member cluster with the old state, and ctl-1 and ctl-2 would form
// a second one (two of three are a quorum), each side electing a Felix
// leader. ctl-0 must refuse to start instead, saying why, and keep its
// data: started again with no initial cluster it serves its state.
// (ctl-1 and ctl-2 may still form a new, empty cluster of their own: they
// cannot tell that ctl-0 holds data.)
func TestEtcdChangedInitialClusterRefused(t *testing.T) {
	awaitPeerConnsClosed(t)
	p := newPKI(t)
	ports, err := freeTCPPorts(6)
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	client := func(i int) string { return fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]) }
	peer := func(i int) string { return fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]) }
	cfg := func(i int, initial string) Config {
		return Config{
			Addr:    "127.0.0.1:0",
			DataDir: filepath.Join(base, fmt.Sprint("ctl-", i)),
			TLS:     transport.ServerTLS(p.cert(t, "ctl"), p.ca, transport.ALPNCtl),
			Etcd: EtcdConfig{Name: fmt.Sprint("ctl-", i), ClientURL: client(i), PeerURL: peer(i),
				InitialCluster: initial, Insecure: true, TickMs: 20, ElectionMs: 200},
			LeaseTTL: shortTTL, CtlTTL: time.Second,
			Logger: testLogger(t).With("ctl", i),
		}
	}

	// ctl-0 alone, with a stream.
	first, err := New(cfg(0, ""))
	if err != nil {
		t.Fatal(err)
	}
	if err := first.CreateStream(shardmap.StreamConfig{Name: "orders", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	cluster := first.Map().Cluster
	first.Close()

	// The control plane "grows" to three ctls.
	var peers []string
	for i := range 3 {
		peers = append(peers, fmt.Sprintf("ctl-%d=%s", i, peer(i)))
	}
	initial := strings.Join(peers, ",")
	srvs := make([]*Server, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() { srvs[i], errs[i] = New(cfg(i, initial)) })
	}
	wg.Wait()
	for _, s := range srvs {
		if s != nil {
			t.Cleanup(func() { s.Close() })
		}
	}
	if srvs[0] != nil {
		t.Fatalf("ctl-0 started on the data of a one-member etcd cluster with an initial cluster of three (etcd members %d, leader %v, cluster %s)",
			len(srvs[0].etcd.embedded.Server.Cluster().Members()), srvs[0].IsLeader(), srvs[0].Map().Cluster)
	}
	if !errors.Is(errs[0], errMembership) {
		t.Fatalf("ctl-0: %v, want an error matching %v", errs[0], errMembership)
	}
	for _, want := range []string{"ctl-0=" + peer(0), "Start it with the initial cluster it was created with", "cannot grow", "empty their data directories"} {
		if !strings.Contains(errs[0].Error(), want) {
			t.Errorf("ctl-0's error does not say %q: %v", want, errs[0])
		}
	}
	t.Logf("ctl-0 refused to start: %v", errs[0])
	for i, s := range srvs[1:] {
		if s != nil {
			t.Logf("ctl-%d started (a new cluster %s, of ctl-1 and ctl-2)", i+1, s.Map().Cluster)
			s.Close()
		}
	}

	// Its data is as it was: alone again, it serves its state.
	again, err := New(cfg(0, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if _, ok := again.Map().Stream("orders"); !ok || again.Map().Cluster != cluster {
		t.Errorf("ctl-0 restarted alone: cluster %s (was %s), stream orders: %v", again.Map().Cluster, cluster, ok)
	}
	if n := len(again.etcd.embedded.Server.Cluster().Members()); n != 1 {
		t.Errorf("ctl-0 restarted alone: %d etcd members, want 1", n)
	}
}

// TestEtcdCheckMembership compares a member's stored etcd membership with
// the initial cluster it is started with.
func TestEtcdCheckMembership(t *testing.T) {
	member := func(id uint64, name string, urls ...string) *membership.Member {
		return &membership.Member{ID: types.ID(id), RaftAttributes: membership.RaftAttributes{PeerURLs: urls}, Attributes: membership.Attributes{Name: name}}
	}
	three := []*membership.Member{
		member(1, "ctl-0", "https://ctl-0:2380"),
		member(2, "ctl-1", "https://ctl-1:2380"),
		member(3, "", "https://ctl-2:2380"), // never started yet
	}
	for _, c := range []struct {
		name    string
		members []*membership.Member
		initial string
		ok      bool
	}{
		{"same", three, "ctl-0=https://ctl-0:2380,ctl-1=https://ctl-1:2380,ctl-2=https://ctl-2:2380", true},
		{"other order", three, "ctl-2=https://ctl-2:2380,ctl-0=https://ctl-0:2380,ctl-1=https://ctl-1:2380", true},
		{"alone", three[:1], "ctl-0=https://ctl-0:2380", true},
		{"grown from one", three[:1], "ctl-0=https://ctl-0:2380,ctl-1=https://ctl-1:2380,ctl-2=https://ctl-2:2380", false},
		{"shrunk", three, "ctl-0=https://ctl-0:2380,ctl-1=https://ctl-1:2380", false},
		{"peer url changed", three, "ctl-0=https://ctl-0:2390,ctl-1=https://ctl-1:2380,ctl-2=https://ctl-2:2380", false},
		{"renamed", three, "ctl-a=https://ctl-0:2380,ctl-1=https://ctl-1:2380,ctl-2=https://ctl-2:2380", false},
		{"several urls", []*membership.Member{member(1, "a", "https://a:2380", "https://10.0.0.1:2380")}, "a=https://10.0.0.1:2380,a=https://a:2380", true},
	} {
		err := checkMembership("dir", c.members, c.initial)
		if (err == nil) != c.ok || err != nil && !errors.Is(err, errMembership) {
			t.Errorf("%s: %v, want ok %v", c.name, err, c.ok)
		}
	}
}
