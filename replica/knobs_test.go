package replica

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
)

// The leader sends its appends before its own fdatasync: when it syncs
// entries, both followers have already been handed them.
func TestLeaderSyncsInParallelWithFollowers(t *testing.T) {
	var cl atomic.Pointer[cluster]
	var checking atomic.Bool
	var checked, early atomic.Int64
	c := newCluster(t, 3, 8, func(cfg *Config) {
		id := cfg.ID
		cfg.Knobs.BeforeSync = func(last uint64) error {
			c := cl.Load()
			if c == nil || !checking.Load() {
				return nil
			}
			if g := c.group(id); g == nil || !g.IsLeader() {
				return nil
			}
			checked.Add(1)
			for _, o := range c.ids {
				if o != id && c.net.Appended(o) < last {
					early.Add(1)
					t.Errorf("leader %d syncs entries up to %d before follower %d was sent them (it has %d)", id, last, o, c.net.Appended(o))
				}
			}
			return nil
		}
	})
	cl.Store(c)
	c.waitLeader()
	for i := range 5 {
		c.commit(fmt.Appendf(nil, "warm%d", i))
	}
	checking.Store(true)
	for i := range 30 {
		c.commit(fmt.Appendf(nil, "r%d", i))
	}
	checking.Store(false)
	if checked.Load() == 0 {
		t.Fatal("the leader's syncs were not observed")
	}
}

// A failed fdatasync stops the replica (fail-stop): what it proposed gets
// ErrUnknownOutcome, later appends ErrFailed; the others carry on, and the
// replica reopened from its directory catches up.
func TestSyncFailureStopsReplica(t *testing.T) {
	var failing atomic.Uint64 // id of the replica whose next sync fails
	c := newCluster(t, 3, 9, func(cfg *Config) {
		id := cfg.ID
		cfg.Knobs.BeforeSync = func(uint64) error {
			if failing.Load() == id {
				return errors.New("injected fdatasync failure")
			}
			return nil
		}
	})
	lead := c.waitLeader()
	for i := range 10 {
		c.commit(fmt.Appendf(nil, "a%d", i))
	}
	failing.Store(lead.ID())
	if r := <-appendTo(lead, []byte("lost?")); !errors.Is(r.err, ErrUnknownOutcome) {
		t.Fatalf("append whose sync failed: offset %d err %v, want ErrUnknownOutcome", r.offset, r.err)
	}
	if r := <-appendTo(lead, []byte("after")); !errors.Is(r.err, ErrFailed) {
		t.Fatalf("append after the failure: %v, want ErrFailed", r.err)
	}
	failing.Store(0)
	c.waitLeader(lead.ID())
	for i := range 10 {
		c.commit(fmt.Appendf(nil, "b%d", i))
	}
	c.kill(lead.ID())
	c.start(lead.ID())
	recs := c.checkSame(c.waitConverged(20))
	if len(recs) < 20 || len(recs) > 21 {
		t.Fatalf("%d records, want 20 (or 21 if the unknown outcome committed)", len(recs))
	}
}
