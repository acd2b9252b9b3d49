package broker

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/felix-broker/felix/replica"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// waitDown waits until the control plane no longer counts node live.
func (ip *inproc) waitDown(node string) {
	ip.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		if n, ok := ip.ctl.Map().Node(node); ok && !n.Live {
			return
		}
		if time.Now().After(deadline) {
			ip.t.Fatalf("the control plane still counts %s live after %v", node, waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// brokerIndex returns the index in ip.brokers of the broker named node.
func (ip *inproc) brokerIndex(node string) int {
	i := slices.IndexFunc(ip.brokers, func(b *Broker) bool { return b.NodeID() == node })
	if i < 0 {
		ip.t.Fatalf("no broker %s", node)
	}
	return i
}

// TestMoveReplica: the leader of a replicated shard goes down for good
// and its replica is moved to the fourth broker, which held none. The
// moved replica joins under a new raft id in the old one's slot, catches
// up with every acked record (those acked while it was away included),
// and counts: with another original replica closed, the shard still
// commits. The other shard keeps its replicas and raft ids. The broker
// moved from, started again, removes its replica of the moved shard and
// hosts no group for it, and keeps its other replicas.
func TestMoveReplica(t *testing.T) {
	ip := startInprocWith(t, fastRaft, 4, shardmap.StreamConfig{Name: "r3", Shards: 2, Replicas: 3})
	moved := shardmap.ShardID{Stream: "r3", Shard: 0}
	st, _ := ip.ctl.Map().Stream("r3")
	set := st.Placement.Replicas(0)
	var target string
	for _, b := range ip.brokers {
		if !slices.Contains(set, b.NodeID()) {
			target = b.NodeID()
		}
	}
	src := waitOwnerLeads(t, ip, ip.brokers, moved)
	seq := uint64(0)
	publish := func(via *Broker, what string) {
		t.Helper()
		seq++
		if f := publishVia(t, ip, via, "r3", 0, seq, fmt.Sprint(what, seq)); f.Type() != transport.FrameAck {
			t.Fatalf("publish %s via %s: %T %+v", what, via.NodeID(), f, f)
		}
	}
	for range 5 {
		publish(src, "before")
	}
	oldID := groupOf(src, moved).group.ID()
	srcIdx := ip.brokerIndex(src.NodeID()) // all four run: index = broker number
	otherShard := shardmap.ShardID{Stream: "r3", Shard: 1}
	srcHasOther := st.Placement.IsReplica(1, src.NodeID())

	ip.closeBroker(t, src)
	ip.waitDown(src.NodeID())
	stay := slices.DeleteFunc(slices.Clone(set), func(n string) bool { return n == src.NodeID() })
	via := ip.brokers[ip.brokerIndex(stay[0])]
	for range 3 {
		publish(via, "while down")
	}
	if err := ip.ctl.MoveReplica("r3", 0, src.NodeID(), target); err != nil {
		t.Fatal(err)
	}
	ip.waitEpoch(ip.ctl.Map().Epoch)
	tb := ip.brokers[ip.brokerIndex(target)]

	deadline := time.Now().Add(waitFor)
	for {
		if e := groupOf(tb, moved); e != nil && membership(e.group) == replica.Voter && e.sl.NextOffset() >= 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's moved replica of %s did not become a caught-up voter within %v", target, moved, waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
	newID := groupOf(tb, moved).group.ID()
	if slotOf(newID) != slotOf(oldID) || newID == oldID {
		t.Fatalf("moved replica has raft id %d (slot %d); the one moved from had %d (slot %d)", newID, slotOf(newID), oldID, slotOf(oldID))
	}
	leader := leaderOf(t, ip.brokers, moved)
	voters, learners := groupOf(leader, moved).group.Members()
	if len(voters) != 3 || !slices.Contains(voters, newID) || slices.Contains(voters, oldID) || len(learners) != 0 {
		t.Fatalf("leader %s's configuration: voters %v learners %v; want three voters, %d in place of %d", leader.NodeID(), voters, learners, newID, oldID)
	}
	if got, want := readShard(t, groupOf(tb, moved)), readShard(t, groupOf(leader, moved)); !slices.Equal(got, want) || len(got) != 8 {
		t.Fatalf("the moved replica holds %q, the leader %q", got, want)
	}

	// It counts: with the other original replica that is not the leader
	// closed, the leader and the moved replica commit.
	closeIdx := -1
	for _, n := range stay {
		if n != leader.NodeID() {
			closeIdx = ip.brokerIndex(n)
		}
	}
	if closeIdx < 0 {
		t.Fatalf("leader %s is not among the replicas %v that stayed", leader.NodeID(), stay)
	}
	if tb == leader {
		t.Logf("the moved replica leads")
	}
	ip.closeBroker(t, ip.brokers[closeIdx])
	publish(leader, "with the moved replica")

	// The broker moved from comes back: it removes its replica of the
	// moved shard, and keeps the other.
	back := ip.startBroker(srcIdx) // broker i is cluster.BrokerID(i)
	ip.brokers = append(ip.brokers, back)
	dir := filepath.Join(ip.dir, back.NodeID(), "streams", "r3", "0")
	deadline = time.Now().Add(waitFor)
	for {
		_, err := os.Stat(dir)
		if os.IsNotExist(err) && groupOf(back, moved) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still holds %s (stat: %v) after its replica moved to %s", back.NodeID(), dir, err, target)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if back.shards.marks.has(moved) {
		t.Errorf("%s still marks %s as its replica", back.NodeID(), moved)
	}
	if srcHasOther {
		deadline = time.Now().Add(waitFor)
		for groupOf(back, otherShard) == nil {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not reopen its replica of %s", back.NodeID(), otherShard)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if e := groupOf(back, otherShard); e.group.ID() != e.slots.idOf(back.NodeID()) {
			t.Errorf("%s's replica of %s has raft id %d, want its first", back.NodeID(), otherShard, e.group.ID())
		}
	}
}
