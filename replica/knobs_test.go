package replica

import (
	"bytes"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
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

// Every replica reports each fdatasync of appended entries to OnSync
// (the leader's own and the followers'), with its duration, the records
// of its entries' batches and the bytes it made durable, and only after
// the sync succeeded: a failed one is not reported.
func TestOnSyncReportsEveryReplicasSyncs(t *testing.T) {
	type syncs struct{ n, records, bytes, zero atomic.Int64 }
	var got [4]syncs // by replica id, 1..3
	var failing atomic.Uint64
	c := newCluster(t, 3, 10, func(cfg *Config) {
		id := cfg.ID
		cfg.OnSync = func(d time.Duration, records int, bytes int64) {
			s := &got[id]
			s.n.Add(1)
			s.records.Add(int64(records))
			s.bytes.Add(bytes)
			if d <= 0 || bytes <= 0 {
				s.zero.Add(1)
			}
		}
		cfg.Knobs.BeforeSync = func(uint64) error {
			if failing.Load() == id {
				return errors.New("injected fdatasync failure")
			}
			return nil
		}
	})
	c.waitLeader()
	const records, size = 20, 100
	value := bytes.Repeat([]byte{'v'}, size)
	for range records {
		c.commit(value)
	}
	// Every replica writes every record, each in some sync: the records
	// reported reach the records committed (a follower's last one
	// perhaps a moment after the leader's commit returned).
	for _, id := range c.ids {
		deadline := time.Now().Add(5 * time.Second)
		for got[id].records.Load() < records && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := got[id].records.Load(); n < records {
			t.Errorf("replica %d: syncs reported %d records, of %d committed", id, n, records)
		}
	}
	for _, id := range c.ids {
		s := &got[id]
		// A follower may not have synced the last entry yet when the
		// leader's commit returns: it has synced at least the ones
		// before, each record an entry of its own.
		if n := s.n.Load(); n < records/2 {
			t.Errorf("replica %d: %d syncs reported for %d records committed one at a time", id, n, records)
		}
		if b := s.bytes.Load(); b < int64(records/2*size) {
			t.Errorf("replica %d: %d bytes reported durable, fewer than the records' %d", id, b, records/2*size)
		}
		if z := s.zero.Load(); z > 0 {
			t.Errorf("replica %d: %d syncs reported with no duration or no bytes", id, z)
		}
	}

	// A failing sync is not reported: the replica stops.
	f := c.ids[0]
	if g := c.group(f); g != nil && g.IsLeader() {
		f = c.ids[1]
	}
	// Let its syncs of what was committed settle first: a follower may
	// still be syncing the last entry when the leader's commit returns.
	before := got[f].n.Load()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		n := got[f].n.Load()
		if n == before {
			break
		}
		before = n
	}
	failing.Store(f)
	c.commit(value) // the others carry it
	time.Sleep(100 * time.Millisecond)
	if n := got[f].n.Load(); n != before {
		t.Errorf("replica %d: %d syncs reported after its fdatasyncs began to fail (%d before)", f, n, before)
	}
}
