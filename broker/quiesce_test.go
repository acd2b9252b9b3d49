package broker

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// raftGroupGauge returns felix.raft.groups by state, and
// felix.raft.peer.silences as "silences".
func raftGroupGauge(t *testing.T, r *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	eachMetric(t, r, func(m metricdata.Metrics) {
		switch d := m.Data.(type) {
		case metricdata.Gauge[int64]:
			if m.Name == "felix.raft.groups" {
				for _, dp := range d.DataPoints {
					state, _ := dp.Attributes.Value("state")
					out[state.AsString()] = dp.Value
				}
			}
		case metricdata.Sum[int64]:
			if m.Name == "felix.raft.peer.silences" && len(d.DataPoints) == 1 {
				out["silences"] = d.DataPoints[0].Value
			}
		}
	})
	return out
}

// waitQuiet waits until every replica of every shard of stream on brokers
// is quiet.
func waitQuiet(t testing.TB, brokers []*Broker, stream string, shards int) {
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
	readers := map[string]*sdkmetric.ManualReader{}
	ip := startInprocWith(t, func(c *Config) {
		c.RaftTick, c.RaftElectionTicks = tick, electionTicks
		readers[c.NodeID] = sdkmetric.NewManualReader()
		c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(readers[c.NodeID]))
	}, 3, shardmap.StreamConfig{Name: "idle", Shards: shards, Replicas: 3})
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
	for _, b := range ip.brokers {
		if g := raftGroupGauge(t, readers[b.NodeID()]); g["quiet"] != shards || g["active"] != 0 {
			t.Fatalf("%s: felix.raft.groups %v, want %d quiet and none active", b.NodeID(), g, shards)
		}
	}

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
		// The closed broker handed its leaderships over as it closed
		// (Group.Resign), so the new leader may be there before the
		// others find it silent: that takes an election timeout.
		waitUntil(t, b.NodeID()+" to find the closed broker silent", func() bool { return b.raft.silences.Load() > 0 })
		if g := raftGroupGauge(t, readers[b.NodeID()]); g["silences"] == 0 {
			t.Fatalf("%s: felix.raft.peer.silences is 0 after the closed broker fell silent", b.NodeID())
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

// BenchmarkIdleReplicatedShards measures what idle replicated shards cost
// their brokers: 300 shards of replication factor 3 on three brokers in
// this process, settled (every shard led; with quiescence, every replica
// quiet, and 3 s more), then the process's CPU time over b.N × 10 ms of idling, as a
// percentage of one core: with quiescence and without (Knobs.NoQuiesce),
// in the same run.
func BenchmarkIdleReplicatedShards(b *testing.B) {
	const shards = 300
	for _, quiesce := range []bool{true, false} {
		b.Run(fmt.Sprintf("quiesce=%v", quiesce), func(b *testing.B) {
			ip := startInprocWith(b, func(c *Config) { c.Knobs.NoQuiesce = !quiesce }, 3,
				shardmap.StreamConfig{Name: "idle", Shards: shards, Replicas: 3})
			for sh := range shards {
				id := shardmap.ShardID{Stream: "idle", Shard: sh}
				for _, br := range ip.brokers {
					deadline := time.Now().Add(waitFor)
					for groupOf(br, id) == nil {
						if time.Now().After(deadline) {
							b.Fatalf("%s has no replica of %s after %v", br.NodeID(), id, waitFor)
						}
						time.Sleep(10 * time.Millisecond)
					}
				}
				leaderOf(b, ip.brokers, id)
			}
			if quiesce {
				waitQuiet(b, ip.brokers, "idle", shards)
			}
			time.Sleep(3 * time.Second) // the opening's own work (files, marks) done
			b.ResetTimer()
			start, began := processCPU(b), time.Now()
			for range b.N {
				time.Sleep(10 * time.Millisecond)
			}
			cpu := processCPU(b) - start
			b.ReportMetric(100*cpu.Seconds()/time.Since(began).Seconds(), "cpu-%")
		})
	}
}

// processCPU returns the CPU time (user and system) this process used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
