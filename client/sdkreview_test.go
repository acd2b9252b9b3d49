package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// recreate replaces stream name in the fake's map by a new incarnation
// (Created = the new epoch), as a delete then create does.
func (fc *fakeCluster) recreate(name string, shards int) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	old := fc.mu.m
	m := &shardmap.Map{Cluster: old.Cluster, Epoch: old.Epoch + 2, Nodes: old.Nodes}
	for _, st := range old.Streams {
		if st.Name != name {
			m.Streams = append(m.Streams, st)
		}
	}
	owners := make([]string, shards)
	for s := range shards {
		owners[s] = old.Nodes[s%len(old.Nodes)].ID
	}
	st := shardmap.Stream{StreamConfig: shardmap.StreamConfig{Name: name, Shards: shards}, Placement: shardmap.NewPlacement(owners...), Created: m.Epoch}
	m.Streams = append(m.Streams, st)
	fc.mu.m = m
	delete(fc.mu.logs, shardmap.ShardID{Stream: name, Shard: 0})
}

// TestSubscribeNegativeShard: Shard(-2) is refused as no shard of the
// stream (it once subscribed to every shard).
func TestSubscribeNegativeShard(t *testing.T) {
	fc := newFakeCluster(t, 1)
	if err := fc.createStream(shardmap.StreamConfig{Name: "m", Shards: 4}); err != nil {
		t.Fatal(err)
	}
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	for _, n := range []int{-2, -1, 4} {
		sub, err := c.Subscribe(ctx, "m", Earliest(), Shard(n))
		if err == nil {
			sub.Stop()
			t.Fatalf("Shard(%d) accepted: subscribes to %d shards", n, len(sub.shards))
		}
		if !errors.Is(err, shardmap.ErrNoShard) {
			t.Fatalf("Shard(%d): %v, want an error matching ErrNoShard", n, err)
		}
	}
}

// TestReplicaStatusBrokerSilent: a broker that does not answer is
// reported in its states' Err after the request timeout; the others are
// asked meanwhile (it once held the call as long as ctx lasted).
func TestReplicaStatusBrokerSilent(t *testing.T) {
	fc := newFakeCluster(t, 3)
	if err := fc.createStream(shardmap.StreamConfig{Name: "r", Shards: 1, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	c := connect(t, fc, 0, WithRequestTimeout(500*time.Millisecond))
	fc.brokers[2].hangRequests.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	start := time.Now()
	states, err := c.ReplicaStatus(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("ReplicaStatus waited %v for one broker that does not answer (request timeout 500ms)", took.Round(time.Millisecond))
	}
	silent := fc.brokers[2].id
	for _, s := range states {
		if (s.Err != "") != (s.Node == silent) {
			t.Fatalf("state %+v: want an Err for %s alone", s, silent)
		}
	}
}

// TestMoveReplicaOtherReplicaSilent: one of the other replicas' brokers
// does not answer: MoveReplica refuses (ErrReplicasNotReady, naming it)
// after the request timeout, not when ctx ends (it once waited for ctx,
// then said the replicas were not ready).
func TestMoveReplicaOtherReplicaSilent(t *testing.T) {
	fc := newFakeCluster(t, 3)
	if err := fc.createStream(shardmap.StreamConfig{Name: "r", Shards: 1, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	c := connect(t, fc, 0, WithRequestTimeout(500*time.Millisecond))
	fc.setLive("broker-1", false)
	fc.brokers[2].hangRequests.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	start := time.Now()
	_, err := c.MoveReplica(ctx, "r", 0, "broker-1", "")
	if took := time.Since(start); took > 3*time.Second || !errors.Is(err, ErrReplicasNotReady) || ctx.Err() != nil {
		t.Fatalf("MoveReplica took %v: %v; want ErrReplicasNotReady within the request timeout", took.Round(time.Millisecond), err)
	}
}

// TestSubscriptionEndsWithItsCluster: the cluster is built again (its
// control plane's state lost: a new cluster ID, epochs started over) and
// the stream made again there, at the same epoch number. The subscription
// ends, as it does for a stream created again (it once resumed the new
// cluster's log at the offset it had reached in the old one, skipping
// the new log's first records).
func TestSubscriptionEndsWithItsCluster(t *testing.T) {
	fc := newFakeCluster(t, 1)
	fc.recreate("x", 1)
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	id := shardmap.ShardID{Stream: "x", Shard: 0}
	for range 5 {
		fc.append(id, &transport.Publish{Value: []byte("old")})
	}
	sub, err := c.Subscribe(ctx, "x", Earliest())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	collect(t, sub, 5)

	// Rebuild: another cluster ID, epochs from scratch, "x" created at the
	// same epoch number as before, with a fresh log of 8 records.
	fc.mu.Lock()
	old := fc.mu.m
	st, _ := old.Stream("x")
	nst := *st
	fc.mu.m = &shardmap.Map{Cluster: "REBUILT", Epoch: st.Created, Nodes: old.Nodes, Streams: []shardmap.Stream{nst}}
	fc.mu.logs = map[shardmap.ShardID][]transport.Record{}
	fc.mu.Unlock()
	// The old cluster's brokers are gone (the fake's streams would serve
	// the new log's records on the old subscription stream).
	fc.brokers[0].restart(t)
	for range 8 {
		fc.append(id, &transport.Publish{Value: []byte("new")})
	}

	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for rec, err := range sub.Records(rctx) {
		if err != nil {
			if !errors.Is(err, ErrUnknownStream) {
				t.Fatalf("subscription ended with %v, want an error matching ErrUnknownStream", err)
			}
			return
		}
		t.Fatalf("after the rebuild the subscription delivered %s@%d of the new cluster's log (offsets 0..%d of it never delivered); map now %s/%d",
			rec.Value, rec.Offset, rec.Offset-1, c.cachedMap().Cluster, c.cachedMap().Epoch)
	}
}

// TestSubscribeAfterRecreateWithCachedMap: a client whose cached map
// predates a delete and create of a stream subscribes to it: the
// subscription, which has received nothing, reads the stream of that
// name now (it once ended with ErrUnknownStream, the broker refusing the
// incarnation of the stale map).
func TestSubscribeAfterRecreateWithCachedMap(t *testing.T) {
	fc := newFakeCluster(t, 1)
	fc.recreate("x", 1) // first incarnation, Created set
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	if _, err := c.Map(ctx); err != nil { // the client caches incarnation 1
		t.Fatal(err)
	}
	fc.recreate("x", 1) // someone else deletes and creates "x" again
	sub, err := c.Subscribe(ctx, "x", Earliest())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	fc.append(shardmap.ShardID{Stream: "x", Shard: 0}, &transport.Publish{Value: []byte("v")})
	if got := collect(t, sub, 1); string(got[0].Value) != "v" {
		t.Fatalf("got %q", got[0].Value)
	}
}

// TestSubscriptionEndsWhenRecreatedAfterARecord: once a record was
// received, a stream of the same name created again is another stream:
// the subscription ends with ErrUnknownStream rather than read it.
func TestSubscriptionEndsWhenRecreatedAfterARecord(t *testing.T) {
	fc := newFakeCluster(t, 1)
	fc.recreate("x", 1)
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	id := shardmap.ShardID{Stream: "x", Shard: 0}
	fc.append(id, &transport.Publish{Value: []byte("old")})
	sub, err := c.Subscribe(ctx, "x", Earliest())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	collect(t, sub, 1)
	fc.recreate("x", 1)
	fc.append(id, &transport.Publish{Value: []byte("new")})
	fc.brokers[0].restart(t)
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for rec, err := range sub.Records(rctx) {
		if err == nil {
			t.Fatalf("the subscription read %q of the stream created again", rec.Value)
		}
		if !errors.Is(err, ErrUnknownStream) {
			t.Fatalf("ended with %v, want ErrUnknownStream", err)
		}
		return
	}
}
