package replica

import (
	"errors"
	"fmt"
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
// not answer is not started, so the leader keeps taking proposals. The
// replicas are ticked by hand: a transfer wrongly started would drop the
// proposals until an election timeout of ticks that never comes.
func TestTransferToADeadReplicaIsSkipped(t *testing.T) {
	c := newClusterTickedByHand(t, 3, 1, nil)
	leader := c.electByHand()
	var dead uint64
	for _, id := range c.ids {
		if id != leader.ID() {
			dead = id
			break
		}
	}
	c.kill(dead)
	// Two election timeouts of the leader's own ticks: it has heard
	// nothing from the dead replica for a whole one, however it counts.
	for range 2 * leader.cfg.ElectionTicks {
		tickLeader(t, leader)
	}
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

// TestTransferOnTheQuorumCheckTick: a transfer asked for in the round of
// the tick on which the leader checks its quorum is started. That check
// (every ElectionTicks ticks) marks every peer inactive in raft's
// progress until it answers again; the broker asks for transfers every 50
// ticks, so once in phase with the check it would never hand a leadership
// back to the shard's owner (TestLeadershipReturnsToOwner failed so).
func TestTransferOnTheQuorumCheckTick(t *testing.T) {
	c := newClusterTickedByHand(t, 3, 1, nil)
	a := c.electByHand()
	var b *Group
	for _, g := range c.running() {
		if g != a {
			b = g
			break
		}
	}
	commitOn(t, c, a, "before")
	// Hand over with no tick: b leads at tick 0 of its term, and its
	// clock moves only here from now on.
	a.TransferLeadership(b.ID())
	waitLeads(t, b, "the first transfer")
	commitOn(t, c, b, "led by b")
	for range b.cfg.ElectionTicks - 1 {
		tickLeader(t, b)
	}
	// The next tick is the quorum check. Cut the answers to b first, so
	// none arrives in the round of that tick to make a peer active again.
	for _, id := range c.ids {
		if id != b.ID() {
			c.net.Cut(id, b.ID())
		}
	}
	waitTaken(t, b) // the answers that came before the cut are stepped
	b.in.Lock()
	b.in.ticks++
	b.in.transfer = a.ID()
	b.in.Unlock()
	b.signal()
	waitLeads(t, a, "a transfer asked for on the tick of the quorum check")
}

// electByHand ticks every replica of c (a cluster ticked by hand) until
// one leads, and returns it.
func (c *cluster) electByHand() *Group {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for c.leader() == nil {
		if time.Now().After(deadline) {
			c.t.Fatal("no leader elected within 20s")
		}
		for _, g := range c.running() {
			g.Tick()
		}
		time.Sleep(tickEvery)
	}
	return c.leader()
}

// tickLeader ticks g once and waits until g has handled the tick.
func tickLeader(t *testing.T, g *Group) {
	t.Helper()
	g.Tick()
	waitTaken(t, g)
}

// commitOn commits value through g, the leader, and waits until every
// replica holds it (so that g knows every replica has every committed
// entry: a transfer needs that).
func commitOn(t *testing.T, c *cluster, g *Group, value string) {
	t.Helper()
	select {
	case r := <-appendTo(g, []byte(value)):
		if r.err != nil {
			t.Fatalf("append %q to %d: %v", value, g.ID(), r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("append %q to %d: no outcome within 20s", value, g.ID())
	}
	c.waitConverged(g.NextOffset())
}

// waitLeads waits until g leads.
func waitLeads(t *testing.T, g *Group, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !g.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: replica %d does not lead within 10s", what, g.ID())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestResignHandsOverAndKeepsOutcomes: a leader that resigns hands the
// leadership to a caught-up voter and its channel closes; every record
// appended to it meanwhile gets a true outcome (acked at the offset the
// group holds it at, or refused as never committed), and a leadership
// handed back to it is handed on again.
func TestResignHandsOverAndKeepsOutcomes(t *testing.T) {
	c := newCluster(t, 3, 1, nil)
	leader := c.waitLeader()
	commitOn(t, c, leader, "before")
	var results []<-chan result
	for i := range 50 {
		results = append(results, appendTo(leader, fmt.Appendf(nil, "r%d", i)))
	}
	select {
	case <-leader.Resign():
	case <-time.After(10 * time.Second):
		t.Fatal("the resigning leader's channel did not close within 10s")
	}
	if leader.IsLeader() {
		t.Fatal("the channel closed while the replica still leads")
	}
	acked := map[uint64]string{}
	for i, ch := range results {
		r := <-ch
		switch {
		case r.err == nil:
			acked[r.offset] = fmt.Sprintf("r%d", i)
		case errors.Is(r.err, ErrNotLeader), errors.Is(r.err, ErrDropped):
		default:
			t.Fatalf("record %d: %v, want an ack or a refusal that says it was never committed", i, r.err)
		}
	}
	next := c.waitConverged(1)
	recs := c.checkSame(next)
	for off, v := range acked {
		if string(recs[off].Value) != v {
			t.Fatalf("acked %q at offset %d, which holds %q", v, off, recs[off].Value)
		}
	}
	// Handed back, the leadership is handed on again.
	now := c.waitLeader(leader.ID())
	commitOn(t, c, now, "after")
	term := now.term.Load()
	now.TransferLeadership(leader.ID())
	// Its term: term+1 once it takes it, term+2 once another took it from it.
	deadline := time.Now().Add(10 * time.Second)
	for l := c.leader(); l == nil || l == leader || l.term.Load() < term+2; l = c.leader() {
		if time.Now().After(deadline) {
			t.Fatalf("a resigning replica kept the leadership handed back to it (leader %v, term %d then)", l, term)
		}
		time.Sleep(tickEvery)
	}
	t.Logf("%d of %d records acked through the transfer", len(acked), len(results))
}
