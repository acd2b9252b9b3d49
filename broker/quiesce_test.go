package broker

import (
	"fmt"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// waitQuiet waits until every replica of every shard of stream on brokers
// is quiet.
func waitQuiet(t *testing.T, brokers []*Broker, stream string, shards int) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		quiet := 0
		for _, b := range brokers {
			for sh := range shards {
				if e := groupOf(b, shardmap.ShardID{Stream: stream, Shard: sh}); e != nil && e.group.Quiesced() {
					quiet++
				}
			}
		}
		if quiet == len(brokers)*shards {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d replicas quiet after %v", quiet, len(brokers)*shards, waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestQuietShardsFailOver: idle replicated shards go quiet on every
// replica and stay quiet (the brokers' keep-alives stand in for the
// groups' heartbeats); when the broker leading one of them is closed, the
// others notice its silence, wake the shard's replicas, elect a leader
// and take publishes, with every acked record kept.
func TestQuietShardsFailOver(t *testing.T) {
	const shards = 4
	// Ticks of 20 ms, and a 1 s election timeout: a peer is found silent
	// only if its keep-alives stall for a whole second.
	const tick, electionTicks = 20 * time.Millisecond, 50
	ip := startInprocWith(t, func(c *Config) { c.RaftTick, c.RaftElectionTicks = tick, electionTicks }, 3,
		shardmap.StreamConfig{Name: "idle", Shards: shards, Replicas: 3})
	acked := map[int]string{}
	for sh := range shards {
		id := shardmap.ShardID{Stream: "idle", Shard: sh}
		l := waitOwnerLeads(t, ip, ip.brokers, id)
		v := fmt.Sprintf("r%d", sh)
		if f, ok := publishVia(t, ip, l, "idle", sh, 1, v).(*transport.Ack); !ok || f.Offset != 0 {
			t.Fatalf("publish to %s: %+v", id, f)
		}
		acked[sh] = v
	}
	waitQuiet(t, ip.brokers, "idle", shards)

	// Two election timeouts later, nothing woke them, and no broker found
	// another silent.
	time.Sleep(2 * electionTicks * tick)
	for _, b := range ip.brokers {
		if n := b.raft.silences.Load(); n != 0 {
			t.Fatalf("%s found a peer silent %d times while every broker ran", b.NodeID(), n)
		}
	}
	for _, b := range ip.brokers {
		for sh := range shards {
			if e := groupOf(b, shardmap.ShardID{Stream: "idle", Shard: sh}); !e.group.Quiesced() {
				t.Fatalf("%s's replica of shard %d woke with nothing to do", b.NodeID(), sh)
			}
		}
	}

	id := shardmap.ShardID{Stream: "idle", Shard: 0}
	rest := ip.closeBroker(t, leaderOf(t, ip.brokers, id))
	nl := leaderOf(t, rest, id)
	for _, b := range rest {
		if b.raft.silences.Load() == 0 {
			t.Fatalf("%s did not find the closed broker silent", b.NodeID())
		}
	}
	f := publishVia(t, ip, nl, "idle", 0, 2, "after")
	if ack, ok := f.(*transport.Ack); !ok || ack.Offset != 1 {
		t.Fatalf("publish after the failover: %T %+v, want an ack at offset 1", f, f)
	}
	for _, b := range rest {
		recs := readReplica(t, groupOf(b, id))
		if len(recs) < 1 || string(recs[0].Value) != acked[0] {
			t.Fatalf("%s lost the acked record: %v", b.NodeID(), recs)
		}
	}
}
