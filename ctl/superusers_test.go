package ctl

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/felix-broker/felix/transport"
)

// TestSuperusersFollowTheLeader: three ctls whose --superuser lists
// differ (as during a rolling change of it) push the same map at each
// epoch: the leader's superusers, recorded in etcd with the state, not
// each ctl's own. When another ctl leads, its list is the cluster's.
func TestSuperusersFollowTheLeader(t *testing.T) {
	p := newPKI(t)
	awaitPeerConnsClosed(t)
	plan := planHA(t, p, 3)
	lists := [][]string{{transport.DevAdminName}, {transport.DevAdminName, "eve"}, {"zed", transport.DevAdminName}}
	srvs := make([]*Server, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range plan {
		plan[i].Superusers = lists[i]
		wg.Go(func() { srvs[i], errs[i] = New(plan[i]) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("ctl-%d: %v", i, err)
		}
	}
	startAll(t, srvs)

	gone := map[*Server]bool{}
	agree := func(leader *Server) {
		t.Helper()
		want := slices.Clone(leader.cfg.Superusers)
		slices.Sort(want)
		for deadline := time.Now().Add(waitFor); ; time.Sleep(20 * time.Millisecond) {
			var wrong []string
			epoch := leader.Map().Epoch
			for _, s := range srvs {
				m := s.Map()
				if gone[s] {
					continue
				}
				if m.Epoch != epoch || !slices.Equal(m.ACL.Superusers, want) {
					wrong = append(wrong, s.name())
				}
			}
			if len(wrong) == 0 {
				return
			}
			if time.Now().After(deadline) {
				for _, s := range srvs {
					t.Logf("%s: epoch %d, superusers %v", s.name(), s.Map().Epoch, s.Map().ACL.Superusers)
				}
				t.Fatalf("leader %s (superusers %v): %v do not push its map", leader.name(), want, wrong)
			}
		}
	}
	leader := waitLeader(t, srvs, nil)
	agree(leader)

	// Another ctl leads: its list, another, is the cluster's.
	leader.Close()
	gone[leader] = true
	agree(waitLeader(t, srvs, gone))
}
