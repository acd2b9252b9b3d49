package replica

import (
	"errors"
	"os"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
)

// TestLostLogStopsTheReplicaNotTheProcess: a replica whose directory was
// deleted comes back empty, and the leader's heartbeats carry a commit
// index beyond its log, which raft would meet with a panic: the replica
// drops them (step.go) and never acknowledges a record, the process goes
// on, and the other two go on committing. Rejoining with a lost log needs
// a membership change (a new replica id caught up as a learner), which
// this stage does not make.
func TestLostLogStopsTheReplicaNotTheProcess(t *testing.T) {
	c := newCluster(t, 3, 1, nil)
	leader := c.waitLeader()
	for i := range 5 {
		c.commit([]byte{byte(i)})
	}
	var lost uint64
	for _, id := range c.ids {
		if id != leader.ID() {
			lost = id
			break
		}
	}
	c.waitConverged(5)
	c.kill(lost)
	if err := os.RemoveAll(c.dirs[lost]); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(c.dirs[lost], 0o750); err != nil {
		t.Fatal(err)
	}
	g := c.start(lost)
	until := time.Now().Add(2 * time.Second)
	for time.Now().Before(until) {
		r := <-appendTo(g, []byte("x"))
		if r.err == nil {
			t.Fatalf("the replica with a lost log acked a record at offset %d", r.offset)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if g.IsLeader() {
		t.Fatal("the replica with a lost log leads")
	}
	if err := g.Lost(); !errors.Is(err, ErrLogLost) {
		t.Errorf("Lost() of the replica with a lost log = %v, want ErrLogLost (its readers would wait forever)", err)
	}
	c.mu.Lock()
	for id, other := range c.mu.groups {
		if err := other.Lost(); id != lost && err != nil {
			t.Errorf("replica %d, which kept its log, says %v", id, err)
		}
	}
	c.mu.Unlock()
	c.commit([]byte("after")) // the other two still make a majority

	// With the leader gone, the replica that kept its log needs the lost
	// one's vote, which it must not get: the lost replica forgot what it
	// acknowledged, so its vote could elect a replica lacking an entry it
	// helped commit. No leader, rather than a wrong one.
	c.kill(leader.ID())
	until = time.Now().Add(30 * 10 * tickEvery) // many election timeouts
	for time.Now().Before(until) {
		for _, g := range c.running() {
			if g.IsLeader() {
				t.Fatalf("replica %d was elected with the vote of the replica whose log was lost", g.ID())
			}
		}
		time.Sleep(tickEvery)
	}
}

// A heartbeat of an older term than the replica's, or of its term from a
// replica that is not the leader it knows, whatever its commit index,
// does not mark a replica's log lost: raft ignores the first, a term has
// one leader, and a replica found lost stops voting for good.
func TestStaleHeartbeatDoesNotMarkLost(t *testing.T) {
	c := newCluster(t, 3, 5, nil)
	first := c.waitLeader()
	c.commit([]byte("a"))
	c.kill(first.ID())
	c.waitLeader(first.ID()) // a later term
	c.start(first.ID())
	c.commit([]byte("b"))
	c.waitConverged(2)
	var f *Group
	for _, g := range c.running() {
		if !g.IsLeader() {
			f = g
			break
		}
	}
	_, term := f.Leader()
	if term < 2 {
		t.Fatalf("term %d after a failover", term)
	}
	leader, _ := f.Leader()
	other := c.peers[0] // the third replica: neither f nor its leader
	for _, id := range c.peers {
		if id != f.ID() && id != leader {
			other = id
		}
	}
	for _, hb := range []struct {
		from, term uint64
	}{{leader, term - 1}, {other, term}} {
		if err := f.Step(&pb.Message{Type: pb.MsgHeartbeat.Enum(), To: new(f.ID()), From: new(hb.from), Term: new(hb.term), Commit: new(uint64(1 << 30))}); err != nil {
			t.Fatal(err)
		}
		waitTaken(t, f)
		if err := f.Lost(); err != nil {
			t.Fatalf("a heartbeat from %d of term %d (the replica's is %d, its leader %d) marked its log lost: %v", hb.from, hb.term, term, leader, err)
		}
	}
	c.commit([]byte("c"))
}
