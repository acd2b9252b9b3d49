package broker

import (
	"fmt"
	"time"

	"github.com/felix-broker/felix/replica"
	"github.com/felix-broker/felix/shardmap"
)

// # Replica health
//
// A broker that restarts rejoins the raft groups of its replicated shards
// behind: each of its replicas knows no leader until one is heard, and
// holds the log as it was when the broker stopped. Until it has caught
// up, its group's quorum is the other two replicas, and stopping one of
// them (the next broker of a rolling restart) stalls the group. Two
// signals say where the hosted replicas stand (replica.Group.CatchUp):
//
//   - Readiness waits, after Start, until every hosted replica has been a
//     voter caught up with a known leader at least once (a start-up
//     condition: once met it is not checked again, so a group that loses
//     its leader later, or a stream created later, never makes a serving
//     broker unready). A group is not waited for when fewer than a
//     quorum of its replicas' brokers are live in the map (it cannot
//     elect a leader until they are back: two brokers down must not keep
//     the third unready), and nothing is waited for past
//     Config.ReadyReplicaWait after Start. This is the gate a rolling
//     restart needs: the next broker is stopped only once this one counts
//     towards its groups' quorums again.
//   - ReplicaHealth, at any time (the admin listener's /readyz/replicas,
//     the felix.replica.leaderless and felix.replica.behind gauges):
//     hosted groups with no known leader, and groups where this replica
//     is not a caught-up voter (a follower trailing its leader's commit,
//     a learner or a replica still joining, a failed replica). It is the
//     under-replicated count of Kafka's operators: zero on every broker
//     means every replica of every group counts towards its quorum.

// ReplicaHealth is where the replicas a broker hosts stand.
type ReplicaHealth struct {
	// Groups is the hosted raft groups (replicas of replicated shards).
	Groups int
	// Leaderless is the groups whose replica here knows no leader.
	Leaderless int
	// Behind is the groups where this replica is not a caught-up voter:
	// a follower more than a few entries behind its leader's commit, a
	// learner, a replica not yet admitted, or one that failed. A group
	// with no leader is Behind too (no leader, nothing to be caught up
	// with).
	Behind int
	// LeaderlessShards and BehindShards name the first few of each.
	LeaderlessShards, BehindShards []shardmap.ShardID
}

// OK reports whether every hosted group has a leader and a caught-up
// voter here.
func (h ReplicaHealth) OK() bool { return h.Leaderless == 0 && h.Behind == 0 }

func (h ReplicaHealth) String() string {
	return fmt.Sprintf("%d hosted raft groups: %d leaderless%s, %d with this replica behind%s",
		h.Groups, h.Leaderless, listed(h.LeaderlessShards, h.Leaderless), h.Behind, listed(h.BehindShards, h.Behind))
}

// listed formats the first few of n shard ids.
func listed(ids []shardmap.ShardID, n int) string {
	if len(ids) == 0 {
		return ""
	}
	names := make([]string, len(ids))
	for i, id := range ids {
		names[i] = fmt.Sprintf("%s/%d", id.Stream, id.Shard)
	}
	if n > len(ids) {
		return fmt.Sprintf(" (%s and %d more)", firstFew(names), n-len(ids))
	}
	return " (" + firstFew(names) + ")"
}

// ReplicaHealth returns where the replicas this broker hosts stand now
// (see "Replica health"). Safe to call from any goroutine.
func (b *Broker) ReplicaHealth() ReplicaHealth {
	var h ReplicaHealth
	if b.raft == nil {
		return h
	}
	for _, gm := range b.raft.members(nil) {
		h.Groups++
		c := gm.g.CatchUp()
		if c.Leader == 0 {
			h.Leaderless++
			if len(h.LeaderlessShards) < maxListed {
				h.LeaderlessShards = append(h.LeaderlessShards, gm.id)
			}
		}
		if !caughtUpVoter(gm.g, c.CaughtUp) {
			h.Behind++
			if len(h.BehindShards) < maxListed {
				h.BehindShards = append(h.BehindShards, gm.id)
			}
		}
	}
	return h
}

// caughtUpVoter reports whether g is a working voter of its group in its
// own slot and caught is set.
func caughtUpVoter(g *replica.Group, caught bool) bool {
	return caught && g.Err() == nil && g.Lost() == nil && membership(g) == replica.Voter
}

// DefaultReadyReplicaWait is Config.ReadyReplicaWait's default.
const DefaultReadyReplicaWait = 2 * time.Minute

// replicasCaughtUp is Readiness's start-up condition on the hosted
// replicas (see "Replica health"): nil once every hosted group's replica
// here has been a caught-up voter, or could not be, or ReadyReplicaWait
// has passed since Start; then nil for good.
func (b *Broker) replicasCaughtUp() error {
	if b.replicasSettled.Load() || b.raft == nil {
		return nil
	}
	m := b.currentMap()
	waiting, groups := 0, 0
	var first []shardmap.ShardID
	for _, gm := range b.raft.members(nil) {
		groups++
		c := gm.g.CatchUp()
		if caughtUpVoter(gm.g, c.WasCaughtUp) || !quorumLive(m, gm.slots.nodes(), b.cfg.NodeID) {
			continue
		}
		waiting++
		if len(first) < maxListed {
			first = append(first, gm.id)
		}
	}
	waited := time.Since(b.started)
	switch {
	case waiting == 0:
		if b.replicasSettled.CompareAndSwap(false, true) && groups > 0 {
			b.log.Info("hosted replicas caught up with their leaders since start", "groups", groups, "after", waited.Round(time.Millisecond))
		}
		return nil
	case waited > b.cfg.ReadyReplicaWait:
		if b.replicasSettled.CompareAndSwap(false, true) {
			b.log.Warn("readiness stops waiting for hosted replicas to catch up (ready-replica-wait passed); /readyz/replicas and felix.replica.behind still show them",
				"waiting", waiting, "groups", groups, "waited", waited.Round(time.Millisecond), "shards", listed(first, waiting))
		}
		return nil
	}
	return fmt.Errorf("%w: %d of %d hosted replicas catching up since start (no leader heard yet, or behind its commit)%s",
		ErrNotReady, waiting, groups, listed(first, waiting))
}

// quorumLive reports whether a majority of nodes (a group's replicas'
// brokers) are live in m, self counted live.
func quorumLive(m *shardmap.Map, nodes []string, self string) bool {
	n := 0
	for _, node := range nodes {
		if node == self || m != nil && live(m, node) {
			n++
		}
	}
	return n > len(nodes)/2
}
