package ctl

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/felix-broker/felix/ctl/ctlclient"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// drained returns a member of s (built by moveFixture) that owns no
// shard of the stream "one" (replication factor 1), taken down and with
// its replicas of "orders" moved to other members, the moves settled.
func drained(t *testing.T, s *state) string {
	t.Helper()
	one, _ := s.Map().Stream("one")
	id := ""
	for _, n := range s.Map().Nodes {
		if len(one.Placement.OwnedBy(n.ID)) == 0 && len(placementOf(s, "orders").ReplicatedBy(n.ID)) > 0 {
			id = n.ID
			break
		}
	}
	if id == "" {
		t.Fatalf("no member holds replicas of orders and owns no shard of one: %v", s.Map())
	}
	down(t, s, id)
	for _, shard := range placementOf(s, "orders").ReplicatedBy(id) {
		to, err := s.moveReplica("orders", shard, id, "")
		if err != nil {
			t.Fatal(err)
		}
		_, move := placementOf(s, "orders").Pending(shard)
		if err := s.settleMove("orders", shard, to, move); err != nil {
			t.Fatal(err)
		}
	}
	return id
}

// TestRemoveMemberRefused: a member that is unknown, live, owns a shard
// of replication factor 1 or holds a replica is not removed, with an
// error saying why and what to do; nothing changes.
func TestRemoveMemberRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		// prepare returns the member to remove from a moveFixture of 5
		// members, orders (16 shards of 3 replicas) and one (2 shards
		// of 1).
		prepare func(t *testing.T, s *state) string
		says    []string
	}{
		{name: "no broker named", prepare: func(*testing.T, *state) string { return "" },
			says: []string{"name the broker to remove"}},
		{name: "not a member", prepare: func(*testing.T, *state) string { return "9" },
			says: []string{"remove 9: 9 is not a member of the cluster (members: 1, 2, 3, 4, 5)"}},
		{name: "live", prepare: func(_ *testing.T, s *state) string {
			one, _ := s.Map().Stream("one")
			return one.Placement.Owner(0)
		}, says: []string{"is live: stop it first (a live broker registers again at once)"}},
		{name: "held live after a takeover", prepare: func(t *testing.T, s *state) string {
			id := drained(t, s)
			if !s.holdLive(id) {
				t.Fatal("holdLive changed nothing")
			}
			return id
		}, says: []string{"is live: the ctl leader that took over holds it live until it registers again"}},
		{name: "owns a shard of replication factor 1", prepare: func(t *testing.T, s *state) string {
			one, _ := s.Map().Stream("one")
			id := one.Placement.Owner(1)
			down(t, s, id)
			for _, shard := range placementOf(s, "orders").ReplicatedBy(id) {
				if _, err := s.moveReplica("orders", shard, id, ""); err != nil {
					t.Fatal(err)
				}
			}
			return id
		}, says: []string{"of streams of replication factor 1 (one/", "placed anew on other brokers with empty logs, forking their offsets", "delete those streams first"}},
		{name: "holds replicas", prepare: func(t *testing.T, s *state) string {
			one, _ := s.Map().Stream("one")
			for _, n := range s.Map().Nodes {
				if len(one.Placement.OwnedBy(n.ID)) == 0 {
					down(t, s, n.ID)
					return n.ID
				}
			}
			t.Fatal("every member owns a shard of one")
			return ""
		}, says: []string{"holds replicas of", "shards of replicated streams (orders/", " more): move them first: felixctl cluster drain "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := moveFixture(t, 5, 16)
			id := tc.prepare(t, s)
			before, members := s.Map(), len(s.members)
			err := s.removeMember(id)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("removeMember(%q): %v, want ErrInvalid", id, err)
			}
			for _, w := range tc.says {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if we := wireError(err); we.Code != transport.CodeInvalid {
				t.Errorf("on the wire: %v", we)
			}
			if s.Map() != before || len(s.members) != members {
				t.Errorf("a refused removal changed the state (epoch %d to %d, %d members to %d)", before.Epoch, s.Map().Epoch, members, len(s.members))
			}
		})
	}
}

// TestRemoveMember: a member down and holding nothing is removed: the map
// of the next epoch no longer lists it, and places every shard as the
// last one did. Its liveness can end no more, nor be held; should it
// register again, it joins as a new member holding nothing.
func TestRemoveMember(t *testing.T) {
	s := moveFixture(t, 5, 16)
	id := drained(t, s)
	before := s.Map()
	prev := s.snapshot()
	if err := s.removeMember(id); err != nil {
		t.Fatal(err)
	}
	after := s.Map()
	if after.Epoch != before.Epoch+1 {
		t.Errorf("epoch %d after the removal, want %d", after.Epoch, before.Epoch+1)
	}
	if _, ok := after.Node(id); ok || len(after.Nodes) != len(before.Nodes)-1 {
		t.Fatalf("nodes after removing %s: %+v", id, after.Nodes)
	}
	for _, n := range before.Nodes {
		if got, ok := after.Node(n.ID); n.ID != id && (!ok || !reflect.DeepEqual(got, n)) {
			t.Errorf("node %s: %+v after the removal, was %+v", n.ID, got, n)
		}
	}
	samePlacements(t, "after the removal", after, before)

	// Persisted: the commit deletes the member's key and puts no stream;
	// a restart and a follower's restore hold the same map.
	var ops []string
	for _, op := range newStore(nil, "test").diff(prev, s.snapshot()) {
		switch {
		case op.IsDelete():
			ops = append(ops, "delete "+string(op.KeyBytes()))
		case op.IsPut() && string(op.KeyBytes()) != "/felix/test/epoch":
			ops = append(ops, "put "+string(op.KeyBytes()))
		}
	}
	if want := []string{"delete /felix/test/members/" + id}; !slices.Equal(ops, want) {
		t.Errorf("the removal's commit: %v, want %v", ops, want)
	}
	for what, st := range map[string]*state{"restart": newState(s.snapshot(), nil), "follower": restoreState(s.snapshot(), nil, stateLimits{})} {
		if _, ok := st.Map().Node(id); ok {
			t.Errorf("%s: %s is a member again", what, id)
		}
		samePlacements(t, what, st.Map(), before)
	}

	// The end of its last registration, a hold, the end of holds: nothing.
	session, _ := strconv.Atoi(id)
	if s.end(id, uint64(session)) || s.hold(id, uint64(session)) || s.holdLive(id) || len(s.endHeld()) != 0 || s.Map() != after {
		t.Fatalf("the liveness of a removed member changed the map: epoch %d, was %d", s.Map().Epoch, after.Epoch)
	}
	// Removing it again: not a member.
	if err := s.removeMember(id); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "is not a member") {
		t.Fatalf("removing %s again: %v", id, err)
	}

	// It comes back: a new member, holding nothing; the placements stay.
	changed, joined, err := s.register(node(id), 100)
	if err != nil || !changed || !joined {
		t.Fatalf("register %s after its removal: changed %v, joined %v, %v", id, changed, joined, err)
	}
	if n, ok := s.Map().Node(id); !ok || !n.Live {
		t.Fatalf("%s after registering again: %+v", id, n)
	}
	if held := s.Map().ReplicatedBy(id); len(held) != 0 {
		t.Errorf("%s holds %v after registering again, want nothing", id, held)
	}
	samePlacements(t, "after it registered again", s.Map(), before)
}

// TestRemoveMemberRollback: a removal that could not be persisted is
// undone, member included.
func TestRemoveMemberRollback(t *testing.T) {
	s := moveFixture(t, 4, 4)
	id := drained(t, s)
	before := s.Map()
	cp := s.checkpoint()
	if err := s.removeMember(id); err != nil {
		t.Fatal(err)
	}
	s.rollback(cp)
	if s.Map() != before || s.members[id] == nil || s.epoch != before.Epoch {
		t.Fatalf("rollback: epoch %d (was %d), member %s %v", s.epoch, before.Epoch, id, s.members[id])
	}
	// The next change builds on the state as it was.
	if err := s.removeMember(id); err != nil {
		t.Fatal(err)
	}
	if s.Map().Epoch != before.Epoch+1 {
		t.Fatalf("epoch %d, want %d", s.Map().Epoch, before.Epoch+1)
	}
}

// samePlacements fails t unless got places every stream of want as it
// does, in the same raft slots, with the same config.
func samePlacements(t *testing.T, what string, got, want *shardmap.Map) {
	t.Helper()
	if len(got.Streams) != len(want.Streams) {
		t.Fatalf("%s: %d streams, want %d", what, len(got.Streams), len(want.Streams))
	}
	for i, st := range want.Streams {
		if g := got.Streams[i]; !sameStream(g, st) || g.Created != st.Created {
			t.Errorf("%s: stream %s placed %v, was %v", what, st.Name, g.Placement, st.Placement)
		}
	}
}

// TestRemoveBrokerServer removes a broker with a real ctl: refused while
// it is live, while it holds replicas, and for a principal without
// cluster.admin; made once its replicas moved away, in the map pushed to
// every broker, and kept across a restart of ctl. The broker then starts
// again and joins as a new member holding nothing.
func TestRemoveBrokerServer(t *testing.T) {
	p, dataDir, srv, ids, members := ctlWithFour(t)
	addr := srv.Addr()
	st, _ := srv.Map().Stream("orders")
	from := st.Placement.Replicas(0)[1]

	if err := srv.RemoveBroker(from); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), from+" is live: stop it first") {
		t.Fatalf("removing a live broker: %v, want invalid: stop it first", err)
	}
	members[from].Close()
	for id, m := range members {
		if id != from {
			waitMap(t, m, from+" down", func(mp *shardmap.Map) bool { n, _ := mp.Node(from); return !n.Live })
		}
	}
	if err := srv.RemoveBroker(from); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "move them first: felixctl cluster drain "+from) {
		t.Fatalf("removing a broker holding replicas: %v", err)
	}
	for _, shard := range st.Placement.ReplicatedBy(from) {
		if err := srv.MoveReplica("orders", shard, from, ""); err != nil {
			t.Fatal(err)
		}
	}
	// Refused until each move settles, as its target says (no broker
	// here to say it: the test does).
	if err := srv.RemoveBroker(from); !errors.As(err, new(*MovesPendingError)) || !strings.Contains(err.Error(), "not yet settled") {
		t.Fatalf("removing a broker whose moves are pending: %v", err)
	}
	for _, shard := range st.Placement.ReplicatedBy(from) {
		to, move := srvPlacement(srv).Pending(shard)
		if err := srv.settleMove("orders", shard, to, move); err != nil {
			t.Fatal(err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	relay, err := ctlclient.Dial(ctx, addr, p.clientTLS(t, ids[(slices.Index(ids, from)+1)%4]), transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	req := &transport.Request{Op: OpClusterRemove, NodeID: from, Principal: "bob"}
	if _, err := relay.Request(ctx, req); !errors.Is(err, transport.ErrUnauthorized) || !strings.Contains(err.Error(), "cluster.admin") {
		t.Fatalf("bob removes a broker: %v, want unauthorized (cluster.admin)", err)
	}
	if _, err := relay.Request(ctx, &transport.Request{Op: OpClusterRemove, Principal: transport.DevAdminName}); !errors.Is(err, transport.ErrInvalid) || !strings.Contains(err.Error(), "name the broker to remove") {
		t.Fatalf("cluster.remove naming no broker: %v, want invalid", err)
	}

	admin, err := dialAs(ctx, t, p, addr, transport.DevAdminName)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	before := srv.Map()
	resp, err := admin.Request(ctx, &transport.Request{Op: OpClusterRemove, NodeID: from})
	if err != nil {
		t.Fatal(err)
	}
	gone := func(mp *shardmap.Map) bool { _, ok := mp.Node(from); return !ok && len(mp.Nodes) == 3 }
	if resp.Map == nil || resp.Map.Epoch != srv.Map().Epoch || !gone(resp.Map) {
		t.Fatalf("answer %+v at ctl epoch %d", resp.Map, srv.Map().Epoch)
	}
	samePlacements(t, "after the removal", srv.Map(), before)
	for id, m := range members {
		if id != from {
			waitMap(t, m, from+" removed", gone)
		}
	}
	if _, err := admin.Request(ctx, &transport.Request{Op: OpClusterRemove, NodeID: from}); !errors.Is(err, transport.ErrInvalid) || !strings.Contains(err.Error(), "is not a member") {
		t.Fatalf("removing it again: %v", err)
	}

	srv.Close()
	srv2 := startCtl(t, p, dataDir, addr)
	if !gone(srv2.Map()) {
		t.Fatalf("after a restart of ctl: nodes %+v", srv2.Map().Nodes)
	}
	samePlacements(t, "after a restart of ctl", srv2.Map(), before)

	// The broker starts again: a new member, holding nothing.
	back := join(t, p, addr, from)
	mp := waitMap(t, back, from+" live again", func(mp *shardmap.Map) bool { n, _ := mp.Node(from); return n.Live })
	if held := mp.ReplicatedBy(from); len(held) != 0 {
		t.Errorf("%s holds %v after joining again, want nothing", from, held)
	}
	samePlacements(t, "after it joined again", mp, before)
}

// TestRemoveMemberWhileAMoveFromItIsPending: a member whose replica of a
// shard moved away is not removed while that move is pending (its target
// not yet a voter in its place): the shard's raft group may still count
// its copy, which its broker keeps until the move settles. Nor is an
// earlier target of the pending move (lost too, the slot moved on from
// it), for the same reason. The refusal names the moves and says what to
// do; once the move settles, both are removed.
func TestRemoveMemberWhileAMoveFromItIsPending(t *testing.T) {
	s := moveFixture(t, 5, 1)
	if err := s.deleteStream("one"); err != nil { // nothing of factor 1 to refuse the removal for
		t.Fatal(err)
	}
	a := placementOf(s, "orders").Replicas(0)[1]
	down(t, s, a)
	d, err := s.moveReplica("orders", 0, a, "")
	if err != nil {
		t.Fatal(err)
	}
	down(t, s, d) // lost too: the move goes on to e
	e, err := s.moveReplica("orders", 0, d, "")
	if err != nil {
		t.Fatal(err)
	}
	to, move := placementOf(s, "orders").Pending(0)
	if to != e {
		t.Fatalf("orders/0's pending move goes to %q, want %s", to, e)
	}

	for _, id := range []string{a, d} {
		before, members := s.Map(), len(s.members)
		err := s.removeMember(id)
		if err == nil {
			_, listed := s.Map().Node(id)
			pn, _ := placementOf(s, "orders").Pending(0)
			t.Fatalf("removed %s while orders/0's move from it was pending: the map of epoch %d lists %s: %v, yet holds the move to %q pending, "+
				"and the shard's raft group may count %s's copy until that move settles", id, s.Map().Epoch, id, listed, pn, id)
		}
		var pe *MovesPendingError
		if !errors.Is(err, ErrInvalid) || !errors.As(wireError(err), &pe) {
			t.Fatalf("removing %s: %v, want ErrInvalid, a *MovesPendingError", id, err)
		}
		if want := []PendingMove{{Shard: shardmap.ShardID{Stream: "orders", Shard: 0}, To: e, ID: move}}; pe.Node != id || !slices.Equal(pe.Moves, want) {
			t.Errorf("removing %s: refused for %s's moves %v, want %v", id, pe.Node, pe.Moves, want)
		}
		for _, w := range []string{"remove " + id + ": ", "orders/0 to " + e, "not yet a voter",
			"felixctl stream info orders", "felixctl stream move orders --shard 0 --from " + e} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("removing %s: error %q does not say %q", id, err, w)
			}
		}
		if we := wireError(err); we.Code != transport.CodeInvalid {
			t.Errorf("on the wire: %v", we)
		}
		if s.Map() != before || len(s.members) != members {
			t.Errorf("a refused removal changed the state (epoch %d to %d)", before.Epoch, s.Map().Epoch)
		}
	}

	if err := s.settleMove("orders", 0, e, move); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{a, d} {
		if err := s.removeMember(id); err != nil {
			t.Fatalf("removing %s once the move settled: %v", id, err)
		}
	}
}
