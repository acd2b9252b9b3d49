package replica

import (
	"testing"
	"time"
)

func quiescing(cfg *Config) { cfg.Quiesce = true }

// waitQuiet waits until every running replica is quiet.
func (c *cluster) waitQuiet() {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		quiet := true
		for _, g := range c.running() {
			quiet = quiet && g.Quiesced()
		}
		if quiet {
			return
		}
		time.Sleep(tickEvery)
	}
	for _, g := range c.running() {
		c.t.Logf("replica %d: quiesced %v, leader %v", g.ID(), g.Quiesced(), g.IsLeader())
	}
	c.t.Fatal("the group did not quiesce within 20s")
}

// An idle group stops sending anything at all, however long it is
// ticked, and a record wakes it, commits, and lets it quiesce again.
func TestIdleGroupQuiesces(t *testing.T) {
	c := newCluster(t, 3, 1, quiescing)
	leader := c.waitLeader()
	c.commit([]byte("a"))
	c.waitQuiet()

	sent := c.net.Sent()
	time.Sleep(3 * 10 * tickEvery) // three election timeouts of ticks
	if n := c.net.Sent() - sent; n != 0 {
		t.Fatalf("a quiet group sent %d messages over three election timeouts, want 0: %q", n, c.net.SentSince(sent))
	}
	for _, g := range c.running() {
		if !g.Quiesced() {
			t.Fatalf("replica %d woke with nothing to do", g.ID())
		}
	}

	if off := c.commit([]byte("b")); off != 1 {
		t.Fatalf("offset %d after waking, want 1", off)
	}
	if l := c.leader(); l != leader {
		t.Fatalf("the leadership moved while quiet")
	}
	c.waitConverged(2)
	c.waitQuiet()
	c.checkSame(2)
}

// Without its hosts' liveness, a quiet group never notices that its
// leader is gone; WakeSilent (what the owner calls once the leader's host
// has been silent for an election timeout) makes the others elect a new
// one, which commits.
func TestQuietGroupElectsOnceWoken(t *testing.T) {
	c := newCluster(t, 3, 2, quiescing)
	old := c.waitLeader()
	c.commit([]byte("a"))
	c.waitQuiet()

	c.kill(old.ID())
	time.Sleep(3 * 10 * tickEvery)
	if g := c.leader(); g != nil {
		t.Fatalf("replica %d was elected although nothing woke the quiet group", g.ID())
	}
	for _, g := range c.running() {
		g.WakeSilent(old.ID())
	}
	nl := c.waitLeader()
	if nl.ID() == old.ID() {
		t.Fatal("the dead leader leads")
	}
	if off := c.commit([]byte("b")); off != 1 {
		t.Fatalf("offset %d from the new leader, want 1", off)
	}
}

// quietByHand starts a group of three ticked by hand (tickAll ticks
// every running replica once), elects a leader, commits one record and
// ticks until every replica is quiet; it returns the leader.
func quietByHand(t *testing.T, seed uint64) (c *cluster, leader *Group, tickAll func()) {
	t.Helper()
	c = newClusterTickedByHand(t, 3, seed, quiescing)
	tickAll = func() {
		for _, g := range c.running() {
			g.Tick()
			waitTaken(t, g)
		}
	}
	for c.leader() == nil {
		tickAll()
	}
	leader = c.leader()
	res := appendTo(leader, []byte("a"))
	for len(res) == 0 {
		tickAll()
	}
	for range 100 {
		tickAll()
	}
	for _, g := range c.running() {
		if !g.Quiesced() {
			t.Fatalf("replica %d (leader %v) not quiet after 100 idle ticks", g.ID(), g.IsLeader())
		}
	}
	return c, leader, tickAll
}

// A follower woken for nothing (a false alarm about the leader's host)
// wakes the leader at once rather than campaigning against it after an
// election timeout. Ticked by hand: after the Wake no replica is ticked
// at all, so only the follower's own message can wake the leader.
func TestWokenFollowerWakesTheLeader(t *testing.T) {
	c, leader, tickAll := quietByHand(t, 3)
	_, term := leader.Leader()
	var follower *Group
	for _, g := range c.running() {
		if g != leader {
			follower = g
		}
	}

	follower.Wake()
	deadline := time.Now().Add(20 * time.Second)
	for leader.Quiesced() {
		if time.Now().After(deadline) {
			t.Fatal("the woken follower did not wake the leader")
		}
		time.Sleep(time.Millisecond)
	}
	for range 3 * follower.cfg.ElectionTicks {
		tickAll()
	}
	if l, tm := leader.Leader(); l != leader.ID() || tm != term {
		t.Fatalf("leader %d at term %d after the false alarm, want %d at term %d", l, tm, leader.ID(), term)
	}
}

// A quiet group whose leader's host fell silent fails over as fast as a
// busy one: woken with WakeSilent, the followers campaign within the
// randomized part of the election timeout (under ElectionTicks ticks),
// not after a whole timeout more. Ticked by hand.
func TestSilentLeaderFailsOverWithinATimeout(t *testing.T) {
	c, old, tickAll := quietByHand(t, 4)
	c.kill(old.ID())
	for _, g := range c.running() {
		g.WakeSilent(old.ID())
		waitTaken(t, g)
	}
	for range old.cfg.ElectionTicks - 1 {
		tickAll()
	}
	c.waitLeader()
}
