package replica

import (
	"testing"
	"time"
)

// TestTransferLeadership: the leader hands the leadership to the replica
// asked for, which then commits; a follower asked to transfer does
// nothing.
func TestTransferLeadership(t *testing.T) {
	c := newCluster(t, 3, 1, nil)
	leader := c.waitLeader()
	c.commit([]byte("before"))
	// A transfer goes only to a replica that has every committed entry:
	// wait until every replica holds "before" (under load a follower may
	// not have it yet when the leader commits).
	c.waitConverged(1)
	var to uint64
	for _, id := range c.ids {
		if id != leader.ID() {
			to = id
			break
		}
	}
	c.group(to).TransferLeadership(leader.ID()) // not the leader: ignored
	leader.TransferLeadership(to)
	deadline := time.Now().Add(10 * time.Second)
	for !c.group(to).IsLeader() {
		if time.Now().After(deadline) {
			t.Fatalf("replica %d did not take the leadership from %d", to, leader.ID())
		}
		time.Sleep(tickEvery)
	}
	c.commit([]byte("after"))
	c.checkSame(c.waitConverged(2))
}

// TestTransferToADeadReplicaIsSkipped: a transfer to a replica that does
// not answer is not started, so the leader keeps taking proposals.
func TestTransferToADeadReplicaIsSkipped(t *testing.T) {
	c := newCluster(t, 3, 1, nil)
	leader := c.waitLeader()
	var dead uint64
	for _, id := range c.ids {
		if id != leader.ID() {
			dead = id
			break
		}
	}
	c.kill(dead)
	// CheckQuorum marks it inactive after an election timeout.
	time.Sleep(3 * 10 * tickEvery)
	leader.TransferLeadership(dead)
	for i := range 5 {
		if r := <-appendTo(leader, []byte{byte(i)}); r.err != nil {
			t.Fatalf("append %d after a transfer to a dead replica: %v", i, r.err)
		}
	}
	if !leader.IsLeader() {
		t.Fatal("the leader gave up the leadership to a dead replica")
	}
}
