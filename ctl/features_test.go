package ctl

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestMemberFeatures: a member's features are kept as it registers them
// (sorted, each once), in the map, in its etcd value and its live/ value;
// they survive a restart of ctl and a follower's restore while it is
// down; the same features in another order change nothing, and a member
// that registers again replaces them, with none if it sends none.
func TestMemberFeatures(t *testing.T) {
	s := newState(snapshot{}, nil)
	n := node("1")
	n.Features = []string{"z-later", transport.FeatureReplicaMoves, "z-later"}
	if _, _, err := s.register(n, 1); err != nil {
		t.Fatal(err)
	}
	want := []string{transport.FeatureReplicaMoves, "z-later"}
	features := func(s *state, what string) []string {
		t.Helper()
		got, ok := s.Map().Node("1")
		if !ok {
			t.Fatalf("%s: member 1 not in the map", what)
		}
		return got.Features
	}
	if got := features(s, "registered"); !slices.Equal(got, want) {
		t.Fatalf("features %q in the map, want %q", got, want)
	}
	n.Features = []string{"z-later", transport.FeatureReplicaMoves}
	if changed, _, err := s.register(n, 2); err != nil || changed {
		t.Fatalf("the same features in another order: changed %v, %v; want nothing changed", changed, err)
	}

	// The etcd value of the member, put because its features changed.
	prev := s.snapshot()
	var fm fileMember
	for _, op := range newStore(nil, "test").diff(snapshot{}, prev) {
		if string(op.KeyBytes()) == "/felix/test/members/1" {
			if err := json.Unmarshal(op.ValueBytes(), &fm); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := fm.node(); !slices.Equal(got.Features, want) || got.ID != "1" || !got.Live {
		t.Fatalf("member stored as %+v, read back as %+v", fm, got)
	}

	// Down, restarted, restored: the features stay.
	s.end("1", 2)
	if got := features(newState(s.snapshot(), nil), "after a restart"); !slices.Equal(got, want) {
		t.Errorf("features %q after a restart of ctl, want %q", got, want)
	}
	if got := features(restoreState(s.snapshot(), nil, 0), "restored by a follower"); !slices.Equal(got, want) {
		t.Errorf("features %q restored by a follower, want %q", got, want)
	}

	// Registered again by an earlier version: none.
	before := s.snapshot()
	n.Features = nil
	if changed, _, err := s.register(n, 3); err != nil || !changed {
		t.Fatalf("registered again without features: changed %v, %v", changed, err)
	}
	if got := features(s, "registered without"); got != nil {
		t.Fatalf("features %q after registering without, want none", got)
	}
	put := false
	for _, op := range newStore(nil, "test").diff(before, s.snapshot()) {
		if string(op.KeyBytes()) == "/felix/test/members/1" {
			put = true
			var fm fileMember
			if err := json.Unmarshal(op.ValueBytes(), &fm); err != nil || fm.Features != nil {
				t.Errorf("member stored as %s (%v), want no features", op.ValueBytes(), err)
			}
		}
	}
	if !put {
		t.Error("the member's key was not put when its features changed")
	}
}

// TestLiveValueFeatures: a registration's live/ value carries the
// broker's features, so that the leader learns them from a registration
// another ctl holds; one a ctl of an earlier version wrote has none.
func TestLiveValueFeatures(t *testing.T) {
	st := newStore(nil, "test")
	b, err := json.Marshal(liveValue{ID: "b1", Addr: "a:1", Features: transport.Features(), Lease: 7, By: "ctl", Reg: "r"})
	if err != nil {
		t.Fatal(err)
	}
	e, ok := parseLive(st, []byte(st.liveKey("b1")), b, 5)
	if !ok || !e.node.Supports(transport.FeatureReplicaMoves) || e.node.Addr != "a:1" || e.session != 5 {
		t.Fatalf("live value %s parsed as %+v, %v", b, e, ok)
	}
	earlier := []byte(`{"id":"b1","addr":"a:1","lease":7,"by":"ctl","reg":"r"}`)
	if e, ok := parseLive(st, []byte(st.liveKey("b1")), earlier, 5); !ok || e.node.Features != nil {
		t.Fatalf("an earlier ctl's live value parsed as %+v, %v", e, ok)
	}
	var n shardmap.Node // the zero node supports nothing
	if n.Supports(transport.FeatureReplicaMoves) {
		t.Fatal("a node without features supports replica moves")
	}
}
