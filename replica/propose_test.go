package replica

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Once raft drops an entry of a round (here over MaxUncommittedBytes), the
// entries after it are not proposed either, though raft would take a
// smaller one: a later record never gets in ahead of an earlier one.
func TestDropStopsTheRound(t *testing.T) {
	var leaderID atomic.Uint64
	var holdLeader, holdFollowers atomic.Bool
	leaderGate, followerGate := make(chan struct{}), make(chan struct{})
	var once1, once2 sync.Once
	openLeader := func() { once1.Do(func() { close(leaderGate) }) }
	openFollowers := func() { once2.Do(func() { close(followerGate) }) }
	c := newCluster(t, 3, 23, func(cfg *Config) {
		id := cfg.ID
		cfg.ElectionTicks = 100 // the followers stall for a while: no election meanwhile
		cfg.MaxEntryBytes = 1300
		cfg.MaxUncommittedBytes = 3000
		cfg.Knobs.BeforeSync = func(uint64) error {
			if id == leaderID.Load() {
				if holdLeader.CompareAndSwap(true, false) {
					<-leaderGate
				}
			} else if holdFollowers.Load() {
				<-followerGate
			}
			return nil
		}
	})
	t.Cleanup(openLeader)
	t.Cleanup(openFollowers)
	lead := c.waitLeader()
	leaderID.Store(lead.ID())
	c.commit([]byte("warm"))
	c.waitConverged(1)

	// Nothing commits from here on, and the leader's goroutine is held in
	// the write of a first small entry while the next records queue up.
	holdFollowers.Store(true)
	holdLeader.Store(true)
	first := appendTo(lead, []byte("small"))
	deadline := time.Now().Add(5 * time.Second)
	for holdLeader.Load() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if holdLeader.Load() {
		t.Fatal("the leader did not write the first entry")
	}
	// Entries of 1200, 1200, 1200 and 200 bytes of records: the third
	// passes MaxUncommittedBytes, the fourth alone would not.
	sizes := []int{1200, 1200, 1200, 200}
	var results []<-chan result
	for i, n := range sizes {
		results = append(results, appendTo(lead, bytes.Repeat([]byte{byte('a' + i)}, n)))
	}
	openLeader()
	got := make([]result, len(sizes))
	for i := range 2 {
		select {
		case got[i] = <-results[i]:
			t.Fatalf("record %d completed (%v) while nothing can commit", i, got[i].err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	for i := 2; i < len(sizes); i++ {
		select {
		case got[i] = <-results[i]:
		case <-time.After(5 * time.Second):
			t.Fatalf("record %d: no outcome, want ErrDropped", i)
		}
		if !errors.Is(got[i].err, ErrDropped) {
			t.Fatalf("record %d (%d bytes): offset %d err %v, want ErrDropped", i, sizes[i], got[i].offset, got[i].err)
		}
	}
	openFollowers()
	if r := <-first; r.err != nil || r.offset != 1 {
		t.Fatalf("first: offset %d err %v", r.offset, r.err)
	}
	for i := range 2 {
		if r := <-results[i]; r.err != nil || r.offset != uint64(2+i) {
			t.Fatalf("record %d: offset %d err %v, want offset %d", i, r.offset, r.err, 2+i)
		}
	}
	c.checkSame(c.waitConverged(4))
}
