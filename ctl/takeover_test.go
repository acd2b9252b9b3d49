package ctl

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/felix-broker/felix/ctl/ctlclient"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestHoldLive: a member live in the stored map stays live with no
// registration until it registers or the hold ends.
func TestHoldLive(t *testing.T) {
	s := threeNodes(t)
	r := newState(s.snapshot(), nil) // all down: no registration yet
	epoch := r.epoch
	for _, id := range []string{"1", "2"} {
		if !r.holdLive(id) {
			t.Fatalf("holdLive(%s) changed nothing", id)
		}
	}
	if r.holdLive("1") || r.holdLive("nope") {
		t.Error("holdLive of a held or unknown member changed the map")
	}
	if liveCount(r.Map()) != 2 || r.epoch <= epoch {
		t.Fatalf("after holding 1 and 2: %d live at epoch %d (was %d)", liveCount(r.Map()), r.epoch, epoch)
	}
	// 1 registers again: no change to the map, and it is no longer held.
	if changed, _, err := r.register(node("1"), 7); err != nil || changed {
		t.Fatalf("register of a held member: changed=%v err=%v, want no change", changed, err)
	}
	epoch = r.epoch
	if got := r.endHeld(); len(got) != 1 || got[0] != "2" {
		t.Fatalf("endHeld = %v, want [2]", got)
	}
	if n, _ := r.Map().Node("2"); n.Live || r.epoch != epoch+1 {
		t.Errorf("2 live=%v at epoch %d after endHeld, want down at %d", n.Live, r.epoch, epoch+1)
	}
	if n, _ := r.Map().Node("1"); !n.Live {
		t.Error("1, registered again, went down at the end of the hold")
	}
	if got := r.endHeld(); len(got) != 0 {
		t.Errorf("second endHeld = %v, want none", got)
	}
}

// TestLeasesRunOutWithNoCtl stops the only ctl of a cluster whose etcd
// is external, long enough for the brokers' leases to run out: no ctl is
// there to renew them, but the brokers are fine and serving. The ctl that
// takes over must not push a map with them down (their publishes would
// be refused until they register again): it keeps them live for a
// registration grace, and marks down only those that do not register
// within it.
func TestLeasesRunOutWithNoCtl(t *testing.T) {
	p := newPKI(t)
	ext, err := StartEtcdMember(t.TempDir(), EtcdConfig{Name: "etcd-0"}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer ext.Close()
	start := func(dir, addr string) *Server {
		srv, err := New(Config{Addr: addr, DataDir: dir, TLS: transport.ServerTLS(p.cert(t, "ctl"), p.ca, transport.ALPNCtl),
			LeaseTTL: shortTTL, Etcd: EtcdConfig{Endpoints: []string{ext.ClientURL()}}, Name: "ctl", Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(); err != nil {
			srv.Close()
			t.Fatal(err)
		}
		return srv
	}
	dir := filepath.Join(t.TempDir(), "ctl")
	srv := start(dir, "127.0.0.1:0")
	addr := srv.Addr()
	b0, b1 := join(t, p, addr, "b0"), join(t, p, addr, "b1")
	for _, m := range []*ctlclient.Member{b0, b1} {
		waitMap(t, m, "b0 and b1 live", func(mp *shardmap.Map) bool { return liveCount(mp) == 2 })
	}
	srv.Close()
	b1.Close() // b1 really goes away while no ctl runs

	// Both leases run out.
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ext.ClientURL()}, DialTimeout: waitFor, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for {
		live, _, err := newStore(cli, DefaultCluster).readLive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(live) == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}

	srv = start(dir, addr)
	defer srv.Close()
	// The takeover happened in New, before the ctl listened: no broker
	// could register first.
	if n, _ := srv.Map().Node("b0"); !n.Live {
		t.Fatalf("the new leader's first map (epoch %d) has b0 down: its publishes are refused until it registers", srv.Map().Epoch)
	}
	// b0 registers again and stays live; b1 does not and goes down after
	// the grace.
	mp := waitMap(t, b0, "b1 down", func(mp *shardmap.Map) bool {
		n, _ := mp.Node("b1")
		return !n.Live
	})
	if n, _ := mp.Node("b0"); !n.Live {
		t.Errorf("b0 down at epoch %d though it registered again", mp.Epoch)
	}
}

// TestLeaseRunsOutDuringGrace restarts a ctl with its embedded etcd,
// which renews every lease for one TTL when it starts: a broker whose
// lease then runs out before it registers again, within the new leader's
// registration grace, is held live until the grace ends, not marked down
// when the lease ends.
func TestLeaseRunsOutDuringGrace(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	srv := startCtl(t, p, dir, "127.0.0.1:0")
	addr := srv.Addr()
	b0, b1 := join(t, p, addr, "b0"), join(t, p, addr, "b1")
	for _, m := range []*ctlclient.Member{b0, b1} {
		waitMap(t, m, "b0 and b1 live", func(mp *shardmap.Map) bool { return liveCount(mp) == 2 })
	}
	srv.Close()
	b1.Close() // b1 goes away while no ctl runs: its lease runs out after the restart

	restarted := time.Now() // before the takeover
	srv = startCtl(t, p, dir, addr)
	if n, _ := srv.Map().Node("b1"); !n.Live {
		t.Fatalf("b1 down in the new leader's first map (epoch %d), though its lease was still there", srv.Map().Epoch)
	}
	waitMap(t, b0, "b1 down", func(mp *shardmap.Map) bool { n, _ := mp.Node("b1"); return !n.Live })
	if took, grace := time.Since(restarted), srv.registrationGrace(); took < grace {
		t.Errorf("b1 down %v after the restart, before the end of the registration grace (%v)", took, grace)
	}
	if n, _ := b0.Map().Node("b0"); !n.Live {
		t.Error("b0 down, though it registered again")
	}
}
