package ctl

import (
	"testing"

	"github.com/felix-broker/felix/shardmap"
)

// TestJoinDoesNotMoveShards: a member that joins after a stream was
// placed takes none of its shards (that would fork their logs); streams
// created afterwards are placed over every member.
func TestJoinDoesNotMoveShards(t *testing.T) {
	s := threeNodes(t)
	if err := s.createStream(shardmap.StreamConfig{Name: "orders", Shards: 64}); err != nil {
		t.Fatal(err)
	}
	before := s.Map()
	if _, joined, err := s.register(node("4"), 9); err != nil || !joined {
		t.Fatalf("register 4: joined=%v err=%v", joined, err)
	}
	after := s.Map()
	if moves := shardmap.Diff(before, after); len(moves) != 0 {
		t.Fatalf("a join moved placed shards: %v", moves)
	}
	if err := s.createStream(shardmap.StreamConfig{Name: "later", Shards: 64}); err != nil {
		t.Fatal(err)
	}
	st, _ := s.Map().Stream("later")
	for shard, owner := range st.Placement.All() {
		if want := shardmap.Owner("later", shard, []string{"1", "2", "3", "4"}); owner != want {
			t.Fatalf("later/%d placed on %s, want rendezvous owner %s over all four", shard, owner, want)
		}
	}
	if len(s.Map().OwnedBy("4")) == 0 {
		t.Fatal("the new member owns nothing of a stream created after it joined")
	}
}

// TestStreamBeforeAnyMember: shards of a stream created with no members are
// unplaced ("") until members join, then placed and pinned.
func TestStreamBeforeAnyMember(t *testing.T) {
	s := newState(snapshot{}, nil)
	if err := s.createStream(shardmap.StreamConfig{Name: "orders", Shards: 4}); err != nil {
		t.Fatal(err)
	}
	st, _ := s.Map().Stream("orders")
	for shard, o := range st.Placement.All() {
		if o != "" {
			t.Fatalf("orders/%d placed on %q with no members", shard, o)
		}
	}
	s.register(node("1"), 1)
	st, _ = s.Map().Stream("orders")
	for shard, o := range st.Placement.All() {
		if o != "1" {
			t.Fatalf("orders/%d on %q, want the only member", shard, o)
		}
	}
	s.register(node("2"), 2)
	st, _ = s.Map().Stream("orders")
	for shard, o := range st.Placement.All() {
		if o != "1" {
			t.Fatalf("orders/%d moved to %q when a second member joined", shard, o)
		}
	}
}

// TestPlacementSurvivesRestart: owners are persisted, not recomputed.
func TestPlacementSurvivesRestart(t *testing.T) {
	s := threeNodes(t)
	s.createStream(shardmap.StreamConfig{Name: "orders", Shards: 16})
	s.register(node("4"), 9)
	dir := t.TempDir()
	if err := saveState(dir, s.snapshot()); err != nil {
		t.Fatal(err)
	}
	snap, err := loadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := newState(snap, nil)
	if moves := shardmap.Diff(s.Map(), r.Map()); len(moves) != 0 {
		t.Fatalf("restart moved shards: %v", moves)
	}
}
