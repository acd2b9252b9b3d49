package ctl

import (
	"testing"
)

// TestClusterIDKept: the first leader makes the cluster's ID, commits it,
// and every map of every ctl names it, across a change of leader.
func TestClusterIDKept(t *testing.T) {
	p := newPKI(t)
	srvs := startHA(t, p, 3)
	leader := waitLeader(t, srvs, nil)
	id := leader.Map().Cluster
	if len(id) < 20 {
		t.Fatalf("cluster ID %q, want a random one", id)
	}
	if err := leader.Close(); err != nil {
		t.Fatal(err)
	}
	next := waitLeader(t, srvs, map[*Server]bool{leader: true})
	for _, s := range srvs {
		if s == leader {
			continue
		}
		if got := s.Map().Cluster; got != id {
			t.Errorf("%s's map (epoch %d) names cluster %q, want %q", s.name(), s.Map().Epoch, got, id)
		}
	}
	snap, _, err := next.store.read(t.Context())
	if err != nil || snap.ClusterID != id {
		t.Fatalf("etcd holds cluster ID %q (%v), want %q", snap.ClusterID, err, id)
	}
}
