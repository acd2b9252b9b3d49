package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/internal/clustertest"
	"github.com/felix-broker/felix/shardmap"
)

// TestReplicatedRetentionKills runs a stream of replication factor 3 with
// a size limit on three real broker processes (64 KiB segments, a
// retention pass every 100 ms). A follower is killed -9 and stays down
// while the others' retention drops the entries it lacks; restarted, it
// can only catch up by the leader's snapshot. Then the leader is killed
// -9, a new one takes publishes, and the old one is restarted. Every
// replica must then hold, from its own first offset, dense offsets whose
// records are the ones acknowledged there, and the replicas agree where
// they overlap.
func TestReplicatedRetentionKills(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts real brokers")
	}
	const stream, limit = "rr", 256 << 10
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := clustertest.Start(t, 3, func(o *cluster.Options) {
		o.BrokerEnv = append(o.BrokerEnv, "FELIX_SEGMENT_SIZE=65536", "FELIX_RETENTION_CHECK=100ms")
	})
	admin := clustertest.Connect(t, c, "broker-0")
	createStream(t, ctx, admin, shardmap.StreamConfig{Name: stream, Shards: 1, Replicas: 3, RetentionBytes: limit})

	acked := map[uint64]string{} // offset → value
	n := 0
	// publish sends count records of 1 KiB through broker via, one at a
	// time, retrying a refusal (an election) until one is acked, and
	// returns the leader of the last ack.
	publish := func(via string, count int) (leader string) {
		t.Helper()
		cl := clustertest.Connect(t, c, via)
		defer cl.Close()
		for range count {
			n++
			v := fmt.Sprintf("%05d-%s", n, strings.Repeat("x", 1018))
			for deadline := time.Now().Add(failoverBound); ; {
				ack, err := cl.Publish(ctx, stream, nil, []byte(v), client.WithShard(0))
				if err == nil {
					acked[ack.Offset], leader = v, ack.Owner
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("publish %d through %s: %v", n, via, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		return leader
	}
	status := func(via string) map[string]client.ReplicaState {
		t.Helper()
		cl := clustertest.Connect(t, c, via)
		defer cl.Close()
		sts, err := cl.ReplicaStatus(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]client.ReplicaState{}
		for _, st := range sts {
			if st.Err == "" {
				out[st.Node] = st
			}
		}
		return out
	}
	waitFor := func(what string, via string, ok func(map[string]client.ReplicaState) bool) map[string]client.ReplicaState {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			if st := status(via); ok(st) {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within a minute: %+v", what, status(via))
			}
		}
	}

	leader := publish("broker-0", 100)
	var follower string
	for _, b := range c.Brokers() {
		if b.ID != leader {
			follower = b.ID
			break
		}
	}
	if err := c.Kill(follower); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond) // past an election timeout: the leader no longer keeps what it lacks
	leader = publish(leader, 1500)
	waitFor("the leader's retention passes offset 100", leader, func(st map[string]client.ReplicaState) bool {
		return st[leader].First > 100
	})
	if err := c.Restart(ctx, follower); err != nil {
		t.Fatal(err)
	}
	st := waitFor("the restarted follower catches up", leader, func(st map[string]client.ReplicaState) bool {
		f, l := st[follower], st[leader]
		return f.Node != "" && f.Next == l.Next && f.Next > 0
	})
	if st[follower].First <= 100 {
		t.Fatalf("%s's replica starts at offset %d: it held [0, 100) and the leader had dropped past 100, so only a snapshot could catch it up", follower, st[follower].First)
	}
	t.Logf("%s caught up by snapshot: its replica holds [%d, %d), the leader's [%d, %d)", follower, st[follower].First, st[follower].Next, st[leader].First, st[leader].Next)

	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	newLeader := publish(follower, 50)
	t.Logf("killed leader %s; %s acknowledged %v later", leader, newLeader, time.Since(killed).Round(time.Millisecond))
	if err := c.Restart(ctx, leader); err != nil {
		t.Fatal(err)
	}
	st = waitFor("every replica holds every acked record", follower, func(st map[string]client.ReplicaState) bool {
		if len(st) != 3 {
			return false
		}
		var next uint64
		for _, r := range st {
			if next == 0 {
				next = r.Next
			}
			if r.Next != next {
				return false
			}
		}
		return true
	})

	// Retention goes on while the replicas are read (a pass every 100
	// ms), so a replica's first offset may have moved on since st: the
	// records read are dense from the first one read, which is at or
	// after the first offset st reported.
	at := map[uint64]string{} // what the replicas hold, for agreement
	held := uint64(0)         // the highest first offset read: every replica holds what follows
	for _, b := range c.Brokers() {
		r := st[b.ID]
		got := readReplicaAt(t, ctx, c, b, stream, 0, r.Next-1)
		if len(got) == 0 {
			t.Fatalf("%s's replica: nothing read, it reports [%d, %d)", b.ID, r.First, r.Next)
		}
		first := got[0].Offset
		if first < r.First {
			t.Fatalf("%s's replica: first record read at offset %d, before the first offset %d it reported", b.ID, first, r.First)
		}
		held = max(held, first)
		for k, e := range got {
			if want := first + uint64(k); e.Offset != want {
				t.Fatalf("%s's replica: record %d has offset %d, want %d (dense from its first offset)", b.ID, k, e.Offset, want)
			}
			if v, ok := acked[e.Offset]; ok && v != e.Value {
				t.Fatalf("%s's replica holds %.5q at offset %d, %.5q was acked there", b.ID, e.Value, e.Offset, v)
			}
			if v, ok := at[e.Offset]; ok && v != e.Value {
				t.Fatalf("%s's replica holds %.5q at offset %d, another replica %.5q", b.ID, e.Value, e.Offset, v)
			}
			at[e.Offset] = e.Value
		}
		if last := got[len(got)-1].Offset; last+1 != r.Next {
			t.Fatalf("%s's replica: records read end at offset %d, it reports [%d, %d)", b.ID, last, r.First, r.Next)
		}
	}
	for off, v := range acked {
		if _, ok := at[off]; !ok && off >= held {
			t.Fatalf("acked record %.5q at offset %d is on no replica that should hold it", v, off)
		}
	}
}
