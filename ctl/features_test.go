package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

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
	if got := features(restoreState(s.snapshot(), nil, stateLimits{}), "restored by a follower"); !slices.Equal(got, want) {
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

// TestHeartbeatAnswers: ctl says with the maps of a registration that it
// answers heartbeats (transport.FeatureHeartbeatAcks), and answers each
// of a broker that advertises the feature with a Heartbeat; a broker of
// an earlier version, which does not, gets maps only (it would refuse
// any other frame).
func TestHeartbeatAnswers(t *testing.T) {
	p := newPKI(t)
	srv := startCtl(t, p, t.TempDir(), "127.0.0.1:0")
	for _, tc := range []struct {
		node     string
		features []string
	}{
		{"b0", []string{transport.FeatureHeartbeatAcks}},
		{"b1", nil},
	} {
		raw := dialRaw(t, p, srv.Addr(), tc.node)
		str, r := raw.send(&transport.Register{NodeID: tc.node, Addr: "127.0.0.1:74" + tc.node[1:], Features: tc.features})
		first, ok := readFrame(t, r).(*transport.MapUpdate)
		if !ok || !slices.Contains(first.Features, transport.FeatureHeartbeatAcks) {
			t.Fatalf("%s: first frame %+v, want a map saying ctl answers heartbeats", tc.node, first)
		}
		w := transport.NewWriter(str)
		answers := 0
		for range 3 {
			if err := w.Write(&transport.Heartbeat{NodeID: tc.node, Epoch: first.Map.Epoch}); err != nil {
				t.Fatal(err)
			}
			// Frames until this heartbeat's answer, or nothing more
			// within the deadline.
			str.SetReadDeadline(time.Now().Add(shortTTL))
			for answered := false; !answered; {
				f, err := r.Read()
				if err != nil {
					break
				}
				switch f := f.(type) {
				case *transport.MapUpdate:
				case *transport.Heartbeat:
					if f.NodeID != tc.node || f.Replicas != nil {
						t.Errorf("%s: answered with %+v", tc.node, f)
					}
					answers, answered = answers+1, true
				default:
					t.Fatalf("%s: registration stream sent a %T", tc.node, f)
				}
			}
		}
		if want := map[bool]int{true: 3, false: 0}[tc.features != nil]; answers != want {
			t.Errorf("%s (features %q): %d heartbeats answered of 3, want %d", tc.node, tc.features, answers, want)
		}
	}
}

// TestEarlierMemberRefreshAgainstThisCtl runs the Refresh loop of a
// member of an earlier version (ask map.get; on an answer, ask again at
// once; else wait for a push or LeaseTTL/3) against this ctl, waiting
// for an epoch ctl does not hold yet (a peer or a client named a newer
// one; a follower ctl lagging), as in a rolling upgrade that updates ctl
// first. Earlier ctls refused the member's map.get, so the loop waited
// its poll interval; answered, it asks again at once, about a thousand
// times a second. So this ctl answers a broker's own map.get only when
// its registration on that connection advertises
// transport.FeatureMemberMapGet (TestMemberMapGet), and refuses it, as
// before, to one that does not.
func TestEarlierMemberRefreshAgainstThisCtl(t *testing.T) {
	p := newPKI(t)
	srv := startCtl(t, p, t.TempDir(), "127.0.0.1:0")
	earlier := slices.DeleteFunc(transport.Features(), func(f string) bool { return f == transport.FeatureMemberMapGet })
	m := joinWith(t, p, srv.Addr(), "b0", earlier)
	want := m.Map().Epoch + 1000 // not coming
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	poll := shortTTL / 3
	asked := 0
	var lastErr error
	for ctx.Err() == nil {
		changed := m.Changed()
		if m.Map().Epoch >= want {
			break
		}
		asked++
		resp, err := m.Request(ctx, &transport.Request{Op: OpMapGet})
		if err == nil && resp.Map != nil {
			continue // the earlier member adopts it and asks again
		}
		lastErr = err
		select {
		case <-changed:
		case <-time.After(poll):
		case <-ctx.Done():
		}
	}
	t.Logf("an earlier member's Refresh asked map.get %d times in 1s (poll interval %v); last refusal: %v", asked, poll, lastErr)
	if limit := int(time.Second/poll) + 2; asked > limit {
		t.Fatalf("an earlier member's Refresh asked map.get %d times in 1s, more than once per poll interval (%d)", asked, limit)
	}
	if !errors.Is(lastErr, transport.ErrUnauthorized) {
		t.Errorf("an earlier member's own map.get: %v, want unauthorized, as earlier ctls answered it", lastErr)
	}
}
