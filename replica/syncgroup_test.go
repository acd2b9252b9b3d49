package replica

import (
	"fmt"
	"testing"
	"time"

	"github.com/felix-broker/felix/wal"
)

// TestSyncGroupParksBusyReplicas: the replicas of one process share a
// wal.SyncGroup. With records pipelined through the leader, the leader and
// its followers all have entries to write at once, so with a threshold of
// two busy logs some of their fdatasyncs park; with a threshold above the
// replicas there are, none does. Every record is committed either way,
// and once the groups are closed none counts as busy.
func TestSyncGroupParksBusyReplicas(t *testing.T) {
	for _, tc := range []struct {
		parkAt int
		parks  bool
	}{{2, true}, {100, false}} {
		t.Run(fmt.Sprintf("parkAt=%d", tc.parkAt), func(t *testing.T) {
			g := wal.NewSyncGroup(tc.parkAt)
			t.Cleanup(func() { // after the cluster's own cleanup has closed every replica
				if b := g.Busy(); b != 0 {
					t.Errorf("every replica closed, the group counts %d busy", b)
				}
			})
			c := newCluster(t, 3, 1, func(cfg *Config) { cfg.SyncGroup = g })
			leader := c.waitLeader()
			const n = 400
			results := make([]<-chan result, n)
			for i := range n {
				results[i] = appendTo(leader, fmt.Appendf(nil, "r%d", i))
			}
			for i, ch := range results {
				select {
				case r := <-ch:
					if r.err != nil {
						t.Fatalf("record %d: %v", i, r.err)
					}
				case <-time.After(30 * time.Second):
					t.Fatalf("record %d: not committed after 30s", i)
				}
			}
			parks := g.Parked()
			if tc.parks && parks == 0 {
				t.Fatalf("%d records pipelined through three replicas sharing a group that parks at 2 busy: no fdatasync parked", n)
			}
			if !tc.parks && parks != 0 {
				t.Fatalf("a group that parks at %d busy logs, with 3 replicas: %d fdatasyncs parked", tc.parkAt, parks)
			}
		})
	}
}
