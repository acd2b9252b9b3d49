package ctl

import (
	"context"
	"testing"
	"time"

	"github.com/felix-broker/felix/ctl/ctlclient"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestUncommittedMapNotPushed: a liveness change the leader cannot commit
// (its etcd request times out) is not pushed until it is committed, so no
// broker holds a map etcd did not commit: there is one map history. Before,
// the leader logged the failed write and pushed the map anyway.
func TestUncommittedMapNotPushed(t *testing.T) {
	p := newPKI(t)
	srvs := startHA(t, p, 3)
	leader := waitLeader(t, srvs, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	join := func(id string) *ctlclient.Member {
		m, err := ctlclient.Join(ctx, ctlclient.MemberConfig{
			CtlAddrs: []string{leader.Addr()},
			TLS:      p.clientTLS(t, id), Node: transport.Register{NodeID: id, Addr: "127.0.0.1:7400"},
			LeaseTTL: shortTTL, MaxBackoff: 100 * time.Millisecond, Logger: testLogger(t),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	b0, b1 := join("b0"), join("b1")
	waitMap(t, b0, "b0 and b1 live", func(mp *shardmap.Map) bool { return liveCount(mp) == 2 })
	epoch := b0.Map().Epoch

	timedOut := error(context.DeadlineExceeded)
	leader.store.saveFault.Store(&timedOut)
	b1.Close() // its registration ends: the leader marks it down but cannot commit that

	watch := time.After(2 * time.Second)
	for watching := true; watching; {
		changed := b0.Changed()
		if m := b0.Map(); m.Epoch != epoch {
			t.Fatalf("b0 was pushed the map of epoch %d (live %d), which etcd did not commit; the last committed epoch is %d", m.Epoch, liveCount(m), epoch)
		}
		select {
		case <-changed:
		case <-watch:
			watching = false
		}
	}

	// etcd answers again: the change is committed, then pushed.
	leader.store.saveFault.Store(nil)
	m := waitMap(t, b0, "b1 down", func(mp *shardmap.Map) bool { return liveCount(mp) == 1 })
	if m.Epoch <= epoch {
		t.Errorf("b1 down at epoch %d, not after %d", m.Epoch, epoch)
	}
	// The followers adopt it from etcd: it was committed.
	deadline := time.Now().Add(waitFor)
	for _, s := range srvs {
		for s != leader && s.Map().Epoch < m.Epoch {
			if time.Now().After(deadline) {
				t.Fatalf("a follower holds epoch %d, never the pushed %d: the pushed map is not in etcd", s.Map().Epoch, m.Epoch)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
