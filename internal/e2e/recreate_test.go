package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/clustertest"
	"github.com/felix-broker/felix/shardmap"
)

// TestStreamCreatedAgainWhileKilled runs on three real broker processes:
// a follower of a replicated stream is killed -9, the stream is deleted
// and created again under the same name, the new stream takes records,
// and the killed broker is restarted. Its data of the old stream (log
// and raft state) must not enter the new stream's group: every replica,
// the restarted one included, holds the new stream's records and no
// other, at their acked offsets, also after the new group's leader is
// killed and the restarted replica's vote is needed.
func TestStreamCreatedAgainWhileKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts real brokers")
	}
	const stream = "again"
	cfg := shardmap.StreamConfig{Name: stream, Shards: 1, Replicas: 3}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := clustertest.Start(t, 3)
	createStream(t, ctx, clustertest.Connect(t, c, "broker-0"), cfg)

	// publish sends values through broker via, retrying a refusal (an
	// election) until each is acked, and returns their offsets and the
	// leader of the last ack.
	publish := func(via string, values ...string) (offsets []uint64, leader string) {
		t.Helper()
		cl := clustertest.Connect(t, c, via)
		defer cl.Close()
		for _, v := range values {
			for deadline := time.Now().Add(failoverBound); ; time.Sleep(50 * time.Millisecond) {
				ack, err := cl.Publish(ctx, stream, nil, []byte(v), client.WithShard(0))
				if err == nil {
					offsets, leader = append(offsets, ack.Offset), ack.Owner
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("publish %s through %s: %v", v, via, err)
				}
			}
		}
		return offsets, leader
	}
	values := func(prefix string, n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("%s-%d", prefix, i))
		}
		return out
	}

	_, leader := publish("broker-0", values("old", 30)...)
	var victim, via string // a follower, and a broker that stays up to talk through
	for _, b := range c.Brokers() {
		switch {
		case b.ID == leader:
			via = b.ID
		case victim == "":
			victim = b.ID
		}
	}
	if err := c.Kill(victim); err != nil {
		t.Fatal(err)
	}
	admin := clustertest.Connect(t, c, via)
	if err := admin.DeleteStream(ctx, stream); err != nil {
		t.Fatal(err)
	}
	if err := admin.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	want := values("new", 6)
	if offs, _ := publish(via, want[:5]...); !slices.Equal(offs, []uint64{0, 1, 2, 3, 4}) {
		t.Fatalf("the new stream acked its first records at offsets %v, want 0..4", offs)
	}

	if err := c.Restart(ctx, victim); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		sts, err := admin.ReplicaStatus(ctx, stream)
		if err == nil && slices.ContainsFunc(sts, func(st client.ReplicaState) bool { return st.Node == victim && st.Err == "" && st.Next == 5 }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's replica of the new stream did not catch up: %+v, %v", victim, sts, err)
		}
	}
	// The new group's leader goes: the restarted replica's vote is needed.
	_, leader = publish(via, want[5])
	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	var up string
	for _, b := range c.Brokers() {
		if b.ID != leader {
			up = b.ID
		}
	}
	if offs, _ := publish(up, "after-kill"); offs[0] != 6 {
		t.Fatalf("after killing the new stream's leader %s, a record was acked at offset %d, want 6", leader, offs[0])
	}
	want = append(want, "after-kill")
	for _, b := range c.Brokers() {
		if b.ID == leader {
			continue
		}
		var got []string
		for k, e := range readReplicaAt(t, ctx, c, b, stream, 0, 6) {
			if e.Offset != uint64(k) {
				t.Fatalf("%s's replica: record %d at offset %d", b.ID, k, e.Offset)
			}
			got = append(got, e.Value)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s's replica holds %q, want the new stream's %q", b.ID, got, want)
		}
	}
}
