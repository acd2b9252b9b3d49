package client

import (
	"testing"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// rebuild makes the fake cluster a new one at the same addresses, as a
// control plane that lost its state makes it: another cluster ID, epochs
// from 1 again, the streams given (each at a new epoch) and no records.
// The brokers restart, as they do with new data directories: the
// client's connections end.
func (fc *fakeCluster) rebuild(t *testing.T, id string, streams ...shardmap.StreamConfig) {
	t.Helper()
	fc.mu.Lock()
	fc.mu.m = &shardmap.Map{Epoch: 1, Nodes: fc.mu.m.Nodes, Cluster: id}
	fc.mu.logs = map[shardmap.ShardID][]transport.Record{}
	fc.mu.Unlock()
	for _, st := range streams {
		if err := fc.createStream(st); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range fc.brokers {
		b.restart(t)
	}
}

// TestRebuiltClusterMap: a long-lived client whose cluster is rebuilt
// (its control plane's state lost: a new cluster ID, epochs starting
// over) takes the new cluster's map, though its epoch is lower than the
// cached one's. It is not rolled back by a replayed older map of the new
// cluster, nor taken back by a broker still serving the old cluster's
// maps, of higher epochs.
func TestRebuiltClusterMap(t *testing.T) {
	fc := newFakeCluster(t, 1)
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	for _, name := range []string{"a", "b", "c", "s"} {
		if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: name, Shards: 4}); err != nil {
			t.Fatal(err)
		}
	}
	before, err := c.Map(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if before.Epoch != 5 || before.Cluster != fakeClusterID {
		t.Fatalf("map before the rebuild: epoch %d of cluster %s", before.Epoch, before.Cluster)
	}

	fc.rebuild(t, "REBUILT", shardmap.StreamConfig{Name: "s", Shards: 1})
	var m *shardmap.Map
	until(t, func() bool {
		m, err = c.Map(ctx) // the first may meet the connection the restart closed
		return err == nil
	}, "a map from the rebuilt cluster's broker")
	if m.Cluster != "REBUILT" || m.Epoch != 2 || len(m.Streams) != 1 || m.Streams[0].Shards != 1 {
		t.Fatalf("the client's map after the rebuild: epoch %d of cluster %s, %d streams; want epoch 2 of REBUILT, whose one stream has 1 shard", m.Epoch, m.Cluster, len(m.Streams))
	}

	// A replayed map of the new cluster, older than the cached one: kept out.
	older := fc.currentMap()
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "t", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	mapWith := func(stale *shardmap.Map) *shardmap.Map {
		t.Helper()
		fc.stale.Store(stale)
		fc.staleGets.Store(1)
		defer fc.staleGets.Store(0)
		m, err := c.Map(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := mapWith(older); m.Cluster != "REBUILT" || m.Epoch != 3 {
		t.Fatalf("after a replay of epoch %d of the cluster: the client has epoch %d of %s, want 3 of REBUILT", older.Epoch, m.Epoch, m.Cluster)
	}
	// A map of the cluster the client left, of a higher epoch: kept out.
	if m := mapWith(before); m.Cluster != "REBUILT" || m.Epoch != 3 {
		t.Fatalf("after a map of the cluster left (epoch %d of %s): the client has epoch %d of %s, want 3 of REBUILT", before.Epoch, before.Cluster, m.Epoch, m.Cluster)
	}
}

// TestRebuiltClusterKeylessPublish: a long-lived client's record with no
// key, whose shard the client picks by its map, is published by the
// rebuilt cluster's map: the client fetches the map again once its
// connection to the broker ended, before it next picks a shard.
func TestRebuiltClusterKeylessPublish(t *testing.T) {
	fc := newFakeCluster(t, 1)
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	for _, name := range []string{"a", "b", "s"} {
		if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: name, Shards: 4}); err != nil {
			t.Fatal(err)
		}
	}
	c.pub.sticky = 3 // the client's keyless records go to shard 3 of 4
	if ack, err := c.Publish(ctx, "s", nil, []byte("before")); err != nil || ack.Shard != 3 {
		t.Fatalf("publish before the rebuild: %+v, %v", ack, err)
	}
	fc.rebuild(t, "REBUILT", shardmap.StreamConfig{Name: "s", Shards: 1})
	// The client counts a connection's end from the connection's context
	// (watchEnd, a context.AfterFunc: its own goroutine), a moment after
	// the context is done; ConnStats.Connected reads the context itself,
	// so it can turn false first. Wait for the count the client acts on.
	until(t, func() bool { return c.connsEnded.Load() > 0 }, "the client to count its connection closed by the restart")
	ack, err := c.Publish(ctx, "s", nil, []byte("after"))
	if err != nil || ack.Shard != 0 {
		m, _ := c.Map(ctx)
		t.Fatalf("keyless publish after the rebuild: %+v, %v; want shard 0, the rebuilt stream's one (the client's map: epoch %d of %s)", ack, err, m.Epoch, m.Cluster)
	}
}

// TestSupersedes: which map the client takes in place of its cached one.
func TestSupersedes(t *testing.T) {
	m := func(cluster string, epoch uint64) *shardmap.Map {
		return &shardmap.Map{Cluster: cluster, Epoch: epoch}
	}
	left := map[string]bool{"OLD": true} // the client followed a rebuild away from OLD
	for _, tc := range []struct {
		name    string
		m, old  *shardmap.Map
		takesIt bool
	}{
		{"the first map", m("A", 1), nil, true},
		{"newer, same cluster", m("A", 6), m("A", 5), true},
		{"same epoch, same cluster", m("A", 5), m("A", 5), false},
		{"older, same cluster (replayed, or a lagging broker's)", m("A", 4), m("A", 5), false},
		{"another cluster, lower epoch (rebuilt)", m("B", 1), m("A", 5), true},
		{"another cluster, higher epoch", m("B", 9), m("A", 5), true},
		{"a cluster left, higher epoch", m("OLD", 9), m("A", 5), false},
		{"a cluster left, over a map naming none", m("OLD", 9), m("", 5), false},
		{"naming none, older", m("", 4), m("A", 5), false},
		{"naming none, newer", m("", 6), m("A", 5), true},
		{"naming one over one naming none, older", m("A", 4), m("", 5), false},
		{"naming one over one naming none, newer", m("A", 6), m("", 5), true},
	} {
		if got := supersedes(tc.m, tc.old, left); got != tc.takesIt {
			t.Errorf("%s: supersedes(%+v, %+v) = %v", tc.name, tc.m, tc.old, got)
		}
	}
}
