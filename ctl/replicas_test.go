package ctl

import (
	"errors"
	"slices"
	"testing"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestReplicatedStreamPlacement: a stream of replication factor 3 is
// refused with fewer than three members, and placed on the top three
// members by rendezvous otherwise; its replica sets survive the etcd store's encoding, and a member that joins later moves none of them.
func TestReplicatedStreamPlacement(t *testing.T) {
	s := newState(snapshot{}, nil)
	s.register(node("1"), 1)
	s.register(node("2"), 2)
	err := s.createStream(shardmap.StreamConfig{Name: "orders", Shards: 4, Replicas: 3})
	if !errors.Is(err, ErrTooFewMembers) || !errors.Is(err, shardmap.ErrTooFewMembers) ||
		!errors.Is(wireError(err), transport.ErrReplicationFactor) {
		t.Fatalf("R=3 with 2 members: %v, want ErrTooFewMembers (replication_factor on the wire)", err)
	}
	s.register(node("3"), 3)
	if err := s.createStream(shardmap.StreamConfig{Name: "orders", Shards: 4, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	if err := s.createStream(shardmap.StreamConfig{Name: "one", Shards: 2, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	st, _ := s.Map().Stream("orders")
	ids := []string{"1", "2", "3"}
	for shard := range 4 {
		if got, want := st.Placement.Replicas(shard), shardmap.Top("orders", shard, 3, ids); !slices.Equal(got, want) {
			t.Fatalf("orders/%d replicas %q, want %q", shard, got, want)
		}
	}
	if one, _ := s.Map().Stream("one"); one.Replicas != 0 || len(one.Placement.Replicas(0)) != 1 {
		t.Fatalf("R=1 stream stored as %+v", one)
	}
	s.register(node("4"), 4)
	after, _ := s.Map().Stream("orders")
	if !after.Placement.Equal(st.Placement) {
		t.Fatalf("a join moved replica sets: %v -> %v", st.Placement, after.Placement)
	}

	// The etcd store's value keeps the factor and the replica sets.
	fs, err := toFileStream(*st).stream()
	if err != nil || !sameStream(fs, *st) {
		t.Fatalf("etcd value round trip: %+v, %v", fs, err)
	}
}
