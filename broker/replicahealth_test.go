package broker

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestReadinessWaitsForReplicasToCatchUp: a broker restarted while its
// groups went on without it is not ready (nor is its ReplicaHealth OK)
// while its replicas are behind their leaders, here held there by its
// fdatasyncs; once they may write, they catch up and it becomes ready,
// within a few entries of what the leaders had committed. A rollout that
// waits for readiness then stops the next broker only once this one
// counts towards its groups' quorums again.
func TestReadinessWaitsForReplicasToCatchUp(t *testing.T) {
	const shards = 3
	ip := startInprocWith(t, fastRaft, 3, shardmap.StreamConfig{Name: "r3", Shards: shards, Replicas: 3})
	victim := ip.brokers[2]
	for s := range shards {
		leaderOf(t, ip.brokers, shardmap.ShardID{Stream: "r3", Shard: s})
	}
	others := ip.closeBroker(t, victim)
	// One record per entry, so that "within catchUpSlack entries" is
	// within as many records.
	heads := make([]uint64, shards)
	for s := range shards {
		for i := range 40 {
			if a, ok := publishVia(t, ip, others[i%2], "r3", s, 1, fmt.Sprint(i)).(*transport.Ack); !ok {
				t.Fatalf("publish to shard %d without %s: not acked", s, victim.NodeID())
			} else {
				heads[s] = a.Offset + 1
			}
		}
	}

	// The restarted broker's replicas write nothing until release.
	hold, release := make(chan struct{}), make(chan struct{})
	ip.tweak = func(c *Config) {
		fastRaft(c)
		if c.NodeID != victim.NodeID() {
			return
		}
		c.Knobs.ReplicaBeforeSync = func(shardmap.ShardID, uint64) error {
			select {
			case <-hold:
			default:
				return nil // opening
			}
			<-release
			return nil
		}
	}
	restarted := ip.startBroker(2)
	ip.brokers = append(ip.brokers, restarted)
	close(hold)
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()

	// Held back, it hears its leaders and stays behind them.
	deadline := time.Now().Add(waitFor)
	for restarted.ReplicaHealth().Leaderless > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // a few heartbeat intervals of the fast raft
	err := restarted.Readiness()
	if !errors.Is(err, ErrNotReady) {
		t.Fatalf("restarted broker with replicas held behind: Readiness() = %v, want not ready", err)
	}
	h := restarted.ReplicaHealth()
	t.Logf("held back: Readiness() = %v; ReplicaHealth: %v", err, h)
	if h.Groups != shards || h.Leaderless != 0 || h.Behind != shards || h.OK() {
		t.Fatalf("held back: ReplicaHealth = %+v, want %d groups, all with a leader, all behind", h, shards)
	}

	close(release)
	released = true
	for restarted.Readiness() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("restarted broker not ready within %v after its replicas could write: %v", waitFor, restarted.Readiness())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for s := range shards {
		e := groupOf(restarted, shardmap.ShardID{Stream: "r3", Shard: s})
		if next := e.group.NextOffset(); next+catchUpSlackForTest < heads[s] {
			t.Errorf("ready with shard %d at offset %d, leaders at %d: more than %d behind", s, next, heads[s], catchUpSlackForTest)
		}
	}
	for !restarted.ReplicaHealth().OK() {
		if time.Now().After(deadline) {
			t.Fatalf("ReplicaHealth after catching up: %v", restarted.ReplicaHealth())
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("after release: ready; ReplicaHealth: %v", restarted.ReplicaHealth())
}

// catchUpSlackForTest is replica's catchUpSlack: one record per entry
// here, so as many records.
const catchUpSlackForTest = 8

// TestReadinessDoesNotWaitForGroupsWithoutQuorum: a broker that starts
// while the other two replicas' brokers are down cannot get its groups a
// leader; readiness does not wait for them (a whole cluster must not stay
// unready for a lost quorum), while ReplicaHealth shows them leaderless.
func TestReadinessDoesNotWaitForGroupsWithoutQuorum(t *testing.T) {
	ip := startInprocWith(t, fastRaft, 3, shardmap.StreamConfig{Name: "r3", Shards: 2, Replicas: 3})
	leaderOf(t, ip.brokers, shardmap.ShardID{Stream: "r3", Shard: 0})
	first := ip.brokers[0]
	ip.closeBroker(t, ip.brokers[2])
	ip.closeBroker(t, ip.brokers[1])
	ip.closeBroker(t, first)
	deadline := time.Now().Add(waitFor)
	for {
		m := ip.ctl.Map()
		if !live(m, "broker-1") && !live(m, "broker-2") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the control plane still shows broker-1 or broker-2 live")
		}
		time.Sleep(20 * time.Millisecond)
	}
	b := ip.startBroker(0)
	ip.brokers = append(ip.brokers, b)
	for b.Readiness() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("alone, with its groups' quorums down: Readiness() = %v, want ready", b.Readiness())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if h := b.ReplicaHealth(); h.Leaderless != 2 || h.OK() {
		t.Fatalf("alone: ReplicaHealth = %v, want both groups leaderless", h)
	}
}
