package broker

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// failingSyncs makes the fdatasyncs of the replicas on the nodes it holds
// fail (Knobs.ReplicaBeforeSync), from when fail names them.
type failingSyncs struct {
	mu    sync.Mutex
	nodes []string
}

func (f *failingSyncs) fail(nodes ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes = append(f.nodes, nodes...)
}

// tweak has c's replicas fail as f says, and never replaced while the
// test runs (RetentionCheck, the pass that replaces a failed replica, of
// an hour).
func (f *failingSyncs) tweak(c *Config) {
	fastRaft(c)
	c.RetentionCheck = time.Hour
	node := c.NodeID
	c.Knobs.ReplicaBeforeSync = func(shardmap.ShardID, uint64) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if slices.Contains(f.nodes, node) {
			return errors.New("injected fdatasync failure")
		}
		return nil
	}
}

// splitReplicas returns the brokers of ip holding a replica of shard 0 of
// stream, and the one that does not (ip has four brokers).
func splitReplicas(t *testing.T, ip *inproc, stream string) (replicas []*Broker, outside *Broker) {
	t.Helper()
	st, _ := ip.ctl.Map().Stream(stream)
	for _, b := range ip.brokers {
		if st.Placement.IsReplica(0, b.NodeID()) {
			replicas = append(replicas, b)
		} else {
			outside = b
		}
	}
	if outside == nil || len(replicas) != 3 {
		t.Fatalf("placement %v over %d brokers", st.Placement, len(ip.brokers))
	}
	return replicas, outside
}

// waitFailed waits until the replicas of id on brokers have failed.
func waitFailed(t *testing.T, id shardmap.ShardID, brokers ...*Broker) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for _, b := range brokers {
		for groupOf(b, id).group.Err() == nil {
			if time.Now().After(deadline) {
				t.Fatalf("%s's replica of %s did not fail", b.NodeID(), id)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestGuessLeaderPassesOverRefusingReplicas: where a publish of a
// replicated shard goes when this broker's replica (if any) knows no
// leader: the leader last heard of, else the first live replica, passing
// over this broker and the replicas that refused the record knowing no
// leader; once every live replica has, it starts over.
func TestGuessLeaderPassesOverRefusingReplicas(t *testing.T) {
	m := shardmap.Build(1, []shardmap.Node{{ID: "a", Live: true}, {ID: "b", Live: true}, {ID: "c", Live: true}, {ID: "d"}}, nil)
	id := shardmap.ShardID{Stream: "s", Shard: 0}
	for _, tc := range []struct {
		name       string
		set        []string
		cached     string // the leader last heard of
		not        string
		passed     replicaMask
		want       string
		wantPassed replicaMask
	}{
		{name: "owner first", set: []string{"a", "b", "c"}, want: "a"},
		{name: "leader heard of", set: []string{"a", "b", "c"}, cached: "c", want: "c"},
		{name: "leader heard of passed", set: []string{"a", "b", "c"}, cached: "c", passed: 0b100, want: "a", wantPassed: 0b100},
		{name: "owner passed", set: []string{"a", "b", "c"}, passed: 0b001, want: "b", wantPassed: 0b001},
		{name: "two passed", set: []string{"a", "b", "c"}, passed: 0b011, want: "c", wantPassed: 0b011},
		{name: "all passed: over again", set: []string{"a", "b", "c"}, passed: 0b111, want: "a"},
		{name: "not this broker", set: []string{"a", "b", "c"}, not: "a", passed: 0b010, want: "c", wantPassed: 0b010},
		{name: "not this broker, the others passed", set: []string{"a", "b", "c"}, not: "a", passed: 0b110, want: "b"},
		{name: "down owner", set: []string{"d", "b", "c"}, passed: 0b010, want: "c", wantPassed: 0b010},
		{name: "down owner, the others passed", set: []string{"d", "b", "c"}, passed: 0b110, want: "b"},
		{name: "none live", set: []string{"d"}, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &Broker{}
			b.noteLeader(id, tc.cached)
			passed := tc.passed
			if got := b.guessLeader(m, id, tc.set, tc.not, &passed); got != tc.want || passed != tc.wantPassed {
				t.Fatalf("guessLeader: %q, passed %03b; want %q, passed %03b", got, passed, tc.want, tc.wantPassed)
			}
		})
	}
}

// TestForwarderTriesOtherReplicasWhenOwnerKnowsNoLeader: on four
// brokers, the owner's replica of a shard fails (its fdatasync fails) and
// stays failed while its broker stays live; the two other replicas elect
// a leader. A publish through the broker outside the replica set reaches
// that leader, well within ForwardTimeout: the owner answers that it
// knows no leader (NotOwner with no Owner), and the forwarder tries the
// other replicas rather than the owner again. Without that it asked the
// owner until ForwardTimeout and then answered the client not_owner
// naming no owner.
func TestForwarderTriesOtherReplicasWhenOwnerKnowsNoLeader(t *testing.T) {
	const forwardTimeout = 4 * time.Second
	var f failingSyncs
	ip := startInprocWith(t, func(c *Config) {
		f.tweak(c)
		c.ForwardTimeout = forwardTimeout
	}, 4, shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	replicas, outside := splitReplicas(t, ip, "r3")
	owner := waitOwnerLeads(t, ip, replicas, id)
	wantAck(t, publishVia(t, ip, outside, "r3", 0, 1, "before"), 1)

	f.fail(owner.NodeID())
	_ = publishVia(t, ip, owner, "r3", 0, 2, "fails the owner's replica") // answered or not
	waitFailed(t, id, owner)
	rest := slices.DeleteFunc(slices.Clone(replicas), func(b *Broker) bool { return b == owner })
	leader := leaderOf(t, rest, id)
	wantAck(t, publishVia(t, ip, leader, "r3", 0, 3, "via the new leader"), 3)

	start := time.Now()
	for seq := uint64(4); seq <= 6; seq++ {
		a := wantAck(t, publishVia(t, ip, outside, "r3", 0, seq, "via the outside broker"), seq)
		if a.Owner != leader.NodeID() || !a.Forwarded {
			t.Fatalf("seq %d through %s acked by %s (forwarded %v), want by %s", seq, outside.NodeID(), a.Owner, a.Forwarded, leader.NodeID())
		}
	}
	if d := time.Since(start); d > forwardTimeout {
		t.Fatalf("three publishes through %s took %v, more than one ForwardTimeout, with %s leading all along", outside.NodeID(), d, leader.NodeID())
	}
}

// startLeaderless starts four brokers (ForwardTimeout 1s, and tweak if
// not nil) with stream r3 of one shard and three replicas, has a record
// published through the broker outside the replica set, then fails two
// of the replicas, so that the third cannot elect a leader. It returns
// the cluster and the outside broker; the next publish's Seq is 3.
func startLeaderless(t *testing.T, tweak func(*Config)) (*inproc, *Broker) {
	t.Helper()
	var f failingSyncs
	ip := startInprocWith(t, func(c *Config) {
		f.tweak(c)
		if tweak != nil {
			tweak(c)
		}
		c.ForwardTimeout = time.Second
	}, 4, shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	replicas, outside := splitReplicas(t, ip, "r3")
	owner := waitOwnerLeads(t, ip, replicas, id)
	wantAck(t, publishVia(t, ip, outside, "r3", 0, 1, "before"), 1)

	k := slices.IndexFunc(replicas, func(b *Broker) bool { return b != owner })
	f.fail(owner.NodeID(), replicas[k].NodeID())
	_ = publishVia(t, ip, owner, "r3", 0, 2, "fails two replicas") // answered or not
	waitFailed(t, id, owner, replicas[k])
	return ip, outside
}

// TestForwarderFailsUnavailableWhenNoReplicaKnowsALeader: on four
// brokers, two of a shard's three replicas fail, so the third cannot
// elect a leader. A publish through the broker outside the replica set,
// which every replica refuses knowing no leader, fails unavailable after
// ForwardTimeout, nothing written: never not_owner, which would name no
// owner for the client to go to.
func TestForwarderFailsUnavailableWhenNoReplicaKnowsALeader(t *testing.T) {
	ip, outside := startLeaderless(t, nil)
	start := time.Now()
	e := wantError(t, publishVia(t, ip, outside, "r3", 0, 3, "via the outside broker"), transport.ErrUnavailable)
	if d := time.Since(start); d < time.Second {
		t.Fatalf("failed after %v, before ForwardTimeout: %v", d, e)
	}
	t.Log(e)
}
