package broker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
	// The target tells the control plane it is a voter: the move settles.
	for deadline := time.Now().Add(waitFor); ; time.Sleep(10 * time.Millisecond) {
		st, _ := ip.ctl.Map().Stream("r3")
		if n, _ := st.Placement.Pending(0); n == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the move of %s to %s is still pending %v after the target became a voter", moved, target, waitFor)
		}
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

// moveFixture starts four brokers with the stream r3 of one shard of
// replication factor 3 and returns the shard, the broker without a
// replica of it (spare), its leader, and a follower (src).
func moveFixture(t *testing.T) (*inproc, shardmap.ShardID, string, *Broker, *Broker) {
	t.Helper()
	ip := startInprocWith(t, fastRaft, 4, shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	st, _ := ip.ctl.Map().Stream("r3")
	set := st.Placement.Replicas(0)
	var spare string
	for _, b := range ip.brokers {
		if !slices.Contains(set, b.NodeID()) {
			spare = b.NodeID()
		}
	}
	leader := leaderOf(t, ip.brokers, id)
	var src *Broker
	for _, b := range ip.brokers {
		if b != leader && slices.Contains(set, b.NodeID()) {
			src = b
		}
	}
	return ip, id, spare, leader, src
}

// TestMoveBackOverStaleData: a broker whose replica was moved away, and
// that still holds that replica's directory when the replica is moved
// back to it (a removal that failed, or a broker that missed the maps
// between), must not reopen the old replica: the group replaced its raft
// id. It removes the old data and joins under a new id, and the shard
// then commits with it.
func TestMoveBackOverStaleData(t *testing.T) {
	ip, id, spare, _, src := moveFixture(t)
	seq := uint64(0)
	publish := func(what string) {
		t.Helper()
		seq++
		via := leaderOf(t, ip.brokers, id)
		if f := publishVia(t, ip, via, "r3", 0, seq, fmt.Sprint(what, seq)); f.Type() != transport.FrameAck {
			t.Fatalf("publish %s: %T %+v", what, f, f)
		}
	}
	for range 3 {
		publish("before")
	}
	oldID := groupOf(src, id).group.ID()
	srcIdx := ip.brokerIndex(src.NodeID())
	srcDir := filepath.Join(ip.dir, src.NodeID(), "streams", "r3", "0")
	ip.closeBroker(t, src)
	stale := filepath.Join(t.TempDir(), "stale")
	if err := os.CopyFS(stale, os.DirFS(srcDir)); err != nil {
		t.Fatal(err)
	}
	ip.waitDown(src.NodeID())
	if err := ip.ctl.MoveReplica("r3", 0, src.NodeID(), spare); err != nil {
		t.Fatal(err)
	}
	sp := ip.brokers[ip.brokerIndex(spare)]
	waitVoter(t, sp, id, 3)
	publish("after the first move")

	// The source runs again (it removes its replica), then its old
	// directory is put back, as if that removal had failed.
	back := ip.startBroker(srcIdx)
	ip.brokers = append(ip.brokers, back)
	for deadline := time.Now().Add(waitFor); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(srcDir); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s kept %s", back.NodeID(), srcDir)
		}
	}
	if err := os.CopyFS(srcDir, os.DirFS(stale)); err != nil {
		t.Fatal(err)
	}
	// The replica moves back: from the spare, now down, to the source.
	ip.closeBroker(t, sp)
	ip.waitDown(spare)
	if err := ip.ctl.MoveReplica("r3", 0, spare, back.NodeID()); err != nil {
		t.Fatal(err)
	}
	waitVoter(t, back, id, 4)
	newID := groupOf(back, id).group.ID()
	if newID == oldID {
		t.Fatalf("%s reopened its old replica of %s under raft id %d, which the group had replaced", back.NodeID(), id, oldID)
	}
	l := leaderOf(t, ip.brokers, id)
	if voters, _ := groupOf(l, id).group.Members(); !slices.Contains(voters, newID) || len(voters) != 3 {
		t.Fatalf("leader %s's voters %v, want three with %d", l.NodeID(), voters, newID)
	}
	if got, want := readShard(t, groupOf(back, id)), readShard(t, groupOf(l, id)); !slices.Equal(got, want) {
		t.Fatalf("%s holds %q, the leader %q", back.NodeID(), got, want)
	}
}

// waitVoter waits until b's replica of id is a voter holding at least n
// records.
func waitVoter(t *testing.T, b *Broker, id shardmap.ShardID, n uint64) {
	t.Helper()
	for deadline := time.Now().Add(waitFor); ; time.Sleep(10 * time.Millisecond) {
		if e := groupOf(b, id); e != nil && membership(e.group) == replica.Voter && e.sl.NextOffset() >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's replica of %s is not a voter with %d records within %v", b.NodeID(), id, n, waitFor)
		}
	}
}

// TestMovedAwayCopyKeptUntilSettled: the broker moved from keeps its copy
// (closed, serving nothing) while the move is pending, since the group may
// still count it until the target replaces it; once the target is a voter
// and the move settles, the copy goes. The target's disk refuses its
// writes at first (a fault at the fdatasync seam), so that the move stays
// pending for as long as the test needs.
func TestMovedAwayCopyKeptUntilSettled(t *testing.T) {
	ip, id, spare, leader, src := moveFixture(t)
	if f := publishVia(t, ip, leader, "r3", 0, 1, "v"); f.Type() != transport.FrameAck {
		t.Fatalf("publish: %T %+v", f, f)
	}
	srcIdx, spareIdx := ip.brokerIndex(src.NodeID()), ip.brokerIndex(spare)
	srcDir := filepath.Join(ip.dir, src.NodeID(), "streams", "r3", "0")

	// The spare's replicas cannot write until it restarts.
	ip.closeBroker(t, ip.brokers[spareIdx])
	ip.tweak = func(c *Config) {
		fastRaft(c)
		c.Knobs.ReplicaBeforeSync = func(shardmap.ShardID, uint64) error { return errors.New("injected: the disk refuses writes") }
	}
	ip.brokers = append(ip.brokers, ip.startBroker(spareIdx))
	ip.tweak = fastRaft

	ip.closeBroker(t, src)
	ip.waitDown(src.NodeID())
	if err := ip.ctl.MoveReplica("r3", 0, src.NodeID(), spare); err != nil {
		t.Fatal(err)
	}
	back := ip.startBroker(srcIdx)
	ip.brokers = append(ip.brokers, back)
	ip.waitEpoch(ip.ctl.Map().Epoch)
	time.Sleep(500 * time.Millisecond) // applies, raft ticks, admission rounds
	if n, _ := func() (string, uint64) { st, _ := ip.ctl.Map().Stream("r3"); return st.Placement.Pending(0) }(); n != spare {
		t.Fatalf("the move is not pending (pending %q): the test did not hold it", n)
	}
	if _, err := os.Stat(srcDir); err != nil {
		t.Fatalf("%s removed its copy of %s while the move to %s was pending: %v", back.NodeID(), id, spare, err)
	}
	if groupOf(back, id) != nil {
		t.Fatalf("%s hosts a replica of %s, moved away", back.NodeID(), id)
	}

	// The target restarts with a disk that writes: it joins, the move
	// settles, and the copy goes.
	ip.closeBroker(t, ip.brokers[ip.brokerIndex(spare)])
	sp := ip.startBroker(spareIdx)
	ip.brokers = append(ip.brokers, sp)
	waitVoter(t, sp, id, 1)
	for deadline := time.Now().Add(waitFor); ; time.Sleep(10 * time.Millisecond) {
		_, err := os.Stat(srcDir)
		if os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			st, _ := ip.ctl.Map().Stream("r3")
			n, move := st.Placement.Pending(0)
			t.Fatalf("%s kept its copy of %s after the move settled (pending %q %d): %v", back.NodeID(), id, n, move, err)
		}
	}
}

// TestMoveRefusedWhileAnotherRejoins: a replica's broker is down, and
// another replica of the shard, lost with its broker's data directory,
// is rejoining (it needs the down one back to be admitted). Moving the
// down broker's replica then would leave the group with one working
// voter for good, so the control plane refuses it, however the move is
// asked for (here on the ctl itself, with no client check), once the
// rejoining broker has reported; when the group is whole again, the
// same move is made.
func TestMoveRefusedWhileAnotherRejoins(t *testing.T) {
	ip := startInprocWith(t, fastRaft, 4, shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	st, _ := ip.ctl.Map().Stream("r3")
	set := st.Placement.Replicas(0)
	leader := waitOwnerLeads(t, ip, ip.brokers, id)
	if f := publishVia(t, ip, leader, "r3", 0, 1, "acked"); f.Type() != transport.FrameAck {
		t.Fatalf("publish: %T %+v", f, f)
	}
	from, wiped := ip.brokerIndex(set[0]), ip.brokerIndex(set[1])
	target := ip.brokers[slices.IndexFunc(ip.brokers, func(b *Broker) bool { return !slices.Contains(set, b.NodeID()) })].NodeID()
	oldID := groupOf(ip.brokers[wiped], id).group.ID()

	if err := ip.brokers[from].Close(); err != nil {
		t.Fatal(err)
	}
	ip.waitDown(set[0])
	if err := ip.brokers[wiped].Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(ip.dir, set[1])); err != nil {
		t.Fatal(err)
	}
	ip.brokers[wiped] = ip.startBroker(wiped)

	// The wiped broker is live at once; its report that its replica is
	// not a voter follows the map it applies.
	for deadline := time.Now().Add(waitFor); ; time.Sleep(20 * time.Millisecond) {
		err := ip.ctl.MoveReplica("r3", 0, set[0], target)
		if err == nil {
			t.Fatalf("%s's replica moved while %s's was rejoining (a member %s)", set[0], set[1], membershipName(groupOf(ip.brokers[wiped], id).group))
		}
		if strings.Contains(err.Error(), set[1]+", another of its replicas, holds a replica that is not a voter") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("move still refused with %q after %v, want refused as %s's replica is not a voter", err, waitFor, set[1])
		}
	}

	ip.brokers[from] = ip.startBroker(from)
	waitRejoined(t, ip.brokers[wiped], id, oldID, 1)
	if err := ip.brokers[from].Close(); err != nil {
		t.Fatal(err)
	}
	ip.waitDown(set[0])
	moveAccepted(t, ip, set[0], target) // after the rejoined replica became a voter
}

// TestMoveRetargetedAfterTargetBecameVoter: the target of a move becomes a
// voter in the slot's place but its settle never reaches the control plane;
// it is then lost too, and the pending move is retargeted to a third
// broker. The third joins in place of the first target, every acked record
// is kept, the move settles, and the source and first target, back, remove
// their copies.
func TestMoveRetargetedAfterTargetBecameVoter(t *testing.T) {
	ip := startInprocWith(t, fastRaft, 5, shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	st, _ := ip.ctl.Map().Stream("r3")
	set := st.Placement.Replicas(0)
	var spares []string
	for _, b := range ip.brokers {
		if !slices.Contains(set, b.NodeID()) {
			spares = append(spares, b.NodeID())
		}
	}
	y, z := spares[0], spares[1]
	leader := leaderOf(t, ip.brokers, id)
	var src *Broker
	for _, b := range ip.brokers {
		if b != leader && slices.Contains(set, b.NodeID()) {
			src = b
		}
	}
	seq := uint64(0)
	publish := func(what string) {
		t.Helper()
		seq++
		via := leaderOf(t, ip.brokers, id)
		if f := publishVia(t, ip, via, "r3", 0, seq, fmt.Sprint(what, seq)); f.Type() != transport.FrameAck {
			t.Fatalf("publish %s: %T %+v", what, f, f)
		}
	}
	for range 3 {
		publish("before")
	}
	// y never manages to tell the control plane it is a voter. (Indexes
	// taken while all five run are broker numbers; closeBroker shifts
	// the slice.)
	yIdx, srcIdx := ip.brokerIndex(y), ip.brokerIndex(src.NodeID())
	ip.closeBroker(t, ip.brokers[yIdx])
	yb := ip.newBroker(yIdx)
	yb.raft.toCtl = func(context.Context, *transport.Request) (*transport.Response, error) {
		return nil, errors.New("injected: the control plane is unreachable")
	}
	if err := yb.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ip.brokers = append(ip.brokers, yb)

	ip.closeBroker(t, src)
	ip.waitDown(src.NodeID())
	if err := ip.ctl.MoveReplica("r3", 0, src.NodeID(), y); err != nil {
		t.Fatal(err)
	}
	waitVoter(t, yb, id, 3)
	publish("with y")
	publish("with y")
	yID := groupOf(yb, id).group.ID()
	if n, _ := func() (string, uint64) { st, _ := ip.ctl.Map().Stream("r3"); return st.Placement.Pending(0) }(); n != y {
		t.Fatalf("pending %q, want %s", n, y)
	}

	// y is lost too: the pending move goes on to z.
	ip.closeBroker(t, yb)
	ip.waitDown(y)
	moveAccepted(t, ip, y, z) // the retarget
	zb := ip.brokers[ip.brokerIndex(z)]
	waitVoter(t, zb, id, 5)
	waitSettled(t, ip)
	l := leaderOf(t, ip.brokers, id)
	zID := groupOf(zb, id).group.ID()
	voters, learners := groupOf(l, id).group.Members()
	if len(voters) != 3 || !slices.Contains(voters, zID) || slices.Contains(voters, yID) || len(learners) != 0 {
		t.Fatalf("voters %v learners %v; want three with %d, without %d", voters, learners, zID, yID)
	}
	if got, want := readShard(t, groupOf(zb, id)), readShard(t, groupOf(l, id)); !slices.Equal(got, want) || len(got) != 5 {
		t.Fatalf("z holds %q, leader %q", got, want)
	}
	publish("with z")

	ip.brokers = append(ip.brokers, ip.startBroker(srcIdx), ip.startBroker(yIdx))
	for _, n := range []string{src.NodeID(), y} {
		dir := filepath.Join(ip.dir, n, "streams", "r3", "0")
		for deadline := time.Now().Add(waitFor); ; time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(dir); os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s kept %s", n, dir)
			}
		}
	}
}

// settledMove moves from's replica of r3/0 to to and waits until to's
// replica is a voter and the move settled; it returns the move's id.
func settledMove(t *testing.T, ip *inproc, from, to string) uint64 {
	t.Helper()
	moveAccepted(t, ip, from, to)
	st, _ := ip.ctl.Map().Stream("r3")
	_, move := st.Placement.Pending(0)
	waitSettled(t, ip)
	return move
}

// moveAccepted moves from's replica of r3/0 to to, asking again until the
// control plane accepts (it refuses while it still holds from live, or
// while another replica is not yet a voter).
func moveAccepted(t *testing.T, ip *inproc, from, to string) {
	t.Helper()
	for deadline := time.Now().Add(waitFor); ; time.Sleep(20 * time.Millisecond) {
		err := ip.ctl.MoveReplica("r3", 0, from, to)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("move %s→%s refused for %v: %v", from, to, waitFor, err)
		}
	}
}

// waitSettled waits until r3/0 has no move pending.
func waitSettled(t *testing.T, ip *inproc) {
	t.Helper()
	for deadline := time.Now().Add(waitFor); ; time.Sleep(10 * time.Millisecond) {
		st, _ := ip.ctl.Map().Stream("r3")
		if n, _ := st.Placement.Pending(0); n == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the move of r3/0 to %s did not settle", func() string { n, _ := st.Placement.Pending(0); return n }())
		}
	}
}

// TestStaleMapKeepsANewerMovedInReplica: a broker whose replica of a
// shard was moved to it by a move newer than the map it is handed (it
// registered with a control plane that lags, as movedInAfter allows for)
// must not remove that replica, a voter of the group, on the older map's
// word: removeMoved refuses to, and so must openReplica.
func TestStaleMapKeepsANewerMovedInReplica(t *testing.T) {
	ip := startInprocWith(t, fastRaft, 4, shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	st, _ := ip.ctl.Map().Stream("r3")
	set := st.Placement.Replicas(0)
	var a, d string
	for _, b := range ip.brokers {
		if !slices.Contains(set, b.NodeID()) {
			d = b.NodeID()
		}
	}
	leader := leaderOf(t, ip.brokers, id)
	for _, n := range set {
		if n != leader.NodeID() {
			a = n
		}
	}
	if f := publishVia(t, ip, leader, "r3", 0, 1, "v1"); f.Type() != transport.FrameAck {
		t.Fatalf("publish: %T %+v", f, f)
	}
	aIdx, dIdx := ip.brokerIndex(a), ip.brokerIndex(d)

	// a → d (move m1), settled: the map of then holds d by m1.
	ip.closeBroker(t, ip.brokers[aIdx])
	ip.waitDown(a)
	m1 := settledMove(t, ip, a, d)
	stale := ip.ctl.Map()
	// d → a, settled; then a → d again (move m3), settled.
	ip.brokers = append(ip.brokers, ip.startBroker(aIdx))
	ip.closeBroker(t, ip.brokers[ip.brokerIndex(d)])
	ip.waitDown(d)
	settledMove(t, ip, d, a)
	ip.brokers = append(ip.brokers, ip.startBroker(dIdx))
	ip.closeBroker(t, ip.brokers[ip.brokerIndex(a)])
	ip.waitDown(a)
	m3 := settledMove(t, ip, a, d)
	db := ip.brokers[ip.brokerIndex(d)]
	waitVoter(t, db, id, 1)
	voterID := groupOf(db, id).group.ID()
	dir := filepath.Join(ip.dir, d, "streams", "r3", "0")
	ip.closeBroker(t, db)
	t.Logf("moves %d (in the stale map) and %d (the replica's); d's raft id %d", m1, m3, voterID)

	// d starts again and is handed the older map first.
	nb := ip.newBroker(dIdx)
	defer nb.Close()
	nb.shards.apply(stale)
	got, _, err := readMoveID(dir)
	rid, _, _ := readRaftID(dir)
	if err != nil || got != m3 || rid != voterID {
		t.Fatalf("on the map of epoch %d, %s replaced its replica of move %d (raft id %d, a voter) with move id %d, raft id %d (err %v)",
			stale.Epoch, d, m3, voterID, got, rid, err)
	}
}
