package replica

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"
)

// join starts replica id in a new directory as a joiner (Config.Join).
func (c *cluster) join(id uint64) *Group {
	c.t.Helper()
	c.ids = append(c.ids, id)
	c.dirs[id] = c.t.TempDir()
	c.joiners[id] = true
	return c.start(id)
}

// admit asks whichever replica leads to admit id in place of old until it
// is done.
func (c *cluster) admit(id, old uint64) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if g := c.leader(); g != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			a, err := g.Admit(ctx, id, func(m uint64) bool { return m == old })
			cancel()
			switch {
			case err == nil && a.Done():
				return
			case err != nil && !errors.Is(err, ErrNotLeader) && !errors.Is(err, context.DeadlineExceeded):
				c.t.Fatalf("admit %d: %v", id, err)
			}
		}
		time.Sleep(5 * tickEvery)
	}
	c.t.Fatalf("replica %d not admitted within 30s", id)
}

func sorted(ids ...uint64) []uint64 {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	return ids
}

// A replica lost with its directory comes back under a new id: it joins
// empty, learns the whole log from the leader, becomes a voter in place of
// the lost one, and counts for the quorum afterwards (with another
// original replica down, the group still commits). Every replica,
// restarted, replays the same configuration from its log.
func TestReplaceLostReplica(t *testing.T) {
	c := newCluster(t, 3, 31, nil)
	lead := c.waitLeader()
	for i := range 20 {
		c.commit(fmt.Appendf(nil, "before%d", i))
	}
	lost := lead.ID()%3 + 1
	c.kill(lost)
	if err := os.RemoveAll(c.dirs[lost]); err != nil {
		t.Fatal(err)
	}
	c.ids = slices.DeleteFunc(c.ids, func(id uint64) bool { return id == lost })
	for i := range 10 {
		c.commit(fmt.Appendf(nil, "without%d", i))
	}

	const joiner = 11
	j := c.join(joiner)
	if v, l := j.Members(); !slices.Equal(v, c.peers) || len(l) != 0 {
		t.Fatalf("joiner starts with voters %v learners %v, want the creation's %v", v, l, c.peers)
	}
	c.admit(joiner, lost)
	c.commit([]byte("admitted"))
	next := c.waitConverged(31)
	c.checkSame(next)
	want := sorted(append(slices.DeleteFunc(slices.Clone(c.peers), func(id uint64) bool { return id == lost }), joiner)...)
	for _, g := range c.running() {
		deadline := time.Now().Add(10 * time.Second)
		for {
			v, l := g.Members()
			if slices.Equal(v, want) && len(l) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d has voters %v learners %v, want voters %v", g.ID(), v, l, want)
			}
			time.Sleep(tickEvery)
		}
	}

	// The joiner is a voter that counts: with one more original down, the
	// two left (the joiner one of them) commit.
	other := c.waitLeader().ID()
	for _, id := range want {
		if id != joiner && id != other {
			other = id
			break
		}
	}
	c.kill(other)
	c.commit([]byte("with the joiner"))

	// Restarted, every replica replays the configuration from its log.
	c.start(other)
	for _, id := range want {
		c.kill(id)
		g := c.start(id)
		if v, l := g.Members(); !slices.Equal(v, want) || len(l) != 0 {
			t.Fatalf("replica %d reopened with voters %v learners %v, want %v", id, v, l, want)
		}
	}
	c.commit([]byte("after restarts"))
	c.checkSame(c.waitConverged(next + 2))
}

// Admit is the leader's: a follower answers with the leader it knows.
func TestAdmitOnFollower(t *testing.T) {
	c := newCluster(t, 3, 32, nil)
	lead := c.waitLeader()
	c.commit([]byte("x"))
	f := c.group(lead.ID()%3 + 1)
	_, err := f.Admit(context.Background(), 11, func(uint64) bool { return false })
	var nl *NotLeaderError
	if !errors.As(err, &nl) || nl.Leader != lead.ID() {
		t.Fatalf("Admit on a follower: %v, want a *NotLeaderError naming %d", err, lead.ID())
	}
}
