package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/felix-broker/felix/ctl/ctlclient"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// moveFixture returns a state with members "1".."n" live (member "k"
// under session k), the stream orders of shards shards and 3 replicas,
// and the stream one of 2 shards and 1 replica; each member has reported
// its replicas of the map that holds them, all voters.
func moveFixture(t *testing.T, n, shards int) *state {
	t.Helper()
	s := newState(snapshot{}, nil)
	for i := 1; i <= n; i++ {
		if _, _, err := s.register(node(strconv.Itoa(i)), uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []shardmap.StreamConfig{{Name: "orders", Shards: shards, Replicas: 3}, {Name: "one", Shards: 2}} {
		if err := s.createStream(c); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range s.members {
		m.report = &transport.ReplicaReport{Applied: s.epoch}
	}
	return s
}

// down ends member id's registration, as moveFixture made it.
func down(t *testing.T, s *state, id string) {
	t.Helper()
	session, _ := strconv.Atoi(id)
	if !s.end(id, uint64(session)) {
		t.Fatalf("ending %s's registration changed nothing", id)
	}
}

// reported is a registration of n under session whose broker has
// reported its replicas of s's map, all voters.
func reported(s *state, n shardmap.Node, session uint64) liveEntry {
	return liveEntry{node: n, session: session, report: &transport.ReplicaReport{Applied: s.epoch}}
}

func placementOf(s *state, stream string) shardmap.Placement {
	st, _ := s.Map().Stream(stream)
	return st.Placement
}

// TestMoveReplicaRefused: every move that cannot be made is refused with
// an error saying why, and changes nothing.
func TestMoveReplicaRefused(t *testing.T) {
	// With four members, orders/0's replica set is three of them
	// (owner, r1, r2) and the fourth (out) holds none.
	s0 := moveFixture(t, 4, 4)
	set := placementOf(s0, "orders").Replicas(0)
	out := ""
	for _, n := range s0.Map().Nodes {
		if !slices.Contains(set, n.ID) {
			out = n.ID
		}
	}
	role := map[string]string{"owner": set[0], "r1": set[1], "r2": set[2], "out": out}
	name := func(r string) string {
		if id, ok := role[r]; ok {
			return id
		}
		return r
	}
	for _, tc := range []struct {
		name          string
		down          []string // roles taken down first
		stream        string
		shard         int
		from, to      string // roles, or ids
		want          []error
		says, alsoSay string
		// reports replaces the replica reports of roles; a nil one is
		// none received, an Applied of 1 one older than the stream.
		reports map[string]*transport.ReplicaReport
		earlier []string // roles whose brokers report nothing (an earlier version)
	}{
		{name: "unknown stream", stream: "nope", from: "owner", want: []error{ErrUnknownStream}, says: `stream "nope"`},
		{name: "shard past the last", down: []string{"owner"}, stream: "orders", shard: 4, from: "owner",
			want: []error{ErrInvalid, shardmap.ErrBadMove}, says: `stream "orders" has 4 shards, numbered from 0; there is no shard 4`},
		{name: "negative shard", down: []string{"owner"}, stream: "orders", shard: -1, from: "owner",
			want: []error{ErrInvalid, shardmap.ErrBadMove}, says: "there is no shard -1"},
		{name: "replication factor 1", stream: "one", from: "owner",
			want: []error{ErrInvalid, shardmap.ErrBadMove}, says: `stream "one" has replication factor 1`},
		{name: "no source", stream: "orders",
			want: []error{ErrInvalid}, says: "name the broker whose replica moves"},
		{name: "source without a replica", stream: "orders", from: "out",
			want: []error{ErrInvalid, shardmap.ErrBadMove}, says: "holds no replica of orders/0"},
		{name: "source live", stream: "orders", from: "owner", to: "out",
			want: []error{ErrInvalid}, says: "is live: stop it first"},
		{name: "target holds a replica", down: []string{"owner"}, stream: "orders", from: "owner", to: "r1",
			want: []error{ErrInvalid, shardmap.ErrBadMove}, says: "already holds a replica of shard 0"},
		{name: "target is the source", down: []string{"owner"}, stream: "orders", from: "owner", to: "owner",
			want: []error{ErrInvalid, shardmap.ErrBadMove}, says: "name another node to move to"},
		{name: "target not a member", down: []string{"owner"}, stream: "orders", from: "owner", to: "9",
			want: []error{ErrInvalid}, says: "9 is not a member of the cluster", alsoSay: "live broker without a replica of it ({out})"},
		{name: "target down", down: []string{"owner", "out"}, stream: "orders", from: "owner", to: "out",
			want: []error{ErrInvalid}, says: "{out} is down", alsoSay: "(none)"},
		{name: "another replica down", down: []string{"owner", "r2"}, stream: "orders", from: "owner", to: "out",
			want: []error{ErrInvalid}, says: "{r2}, another of its replicas, is down", alsoSay: "bring {r2} back first"},
		{name: "no target to pick", down: []string{"owner", "out"}, stream: "orders", from: "owner",
			want: []error{ErrInvalid}, says: "no live broker without a replica of orders/0", alsoSay: "live brokers: {r1}, {r2}"},
		{name: "another replica not a voter", down: []string{"owner"}, stream: "orders", from: "owner", to: "out",
			reports: map[string]*transport.ReplicaReport{"r2": {Applied: 99, Unready: []shardmap.ShardID{{Stream: "orders", Shard: 0}}}},
			want:    []error{ErrInvalid}, says: "{r2}, another of its replicas, holds a replica that is not a voter", alsoSay: "felixctl stream info orders"},
		{name: "another replica unreported", down: []string{"owner"}, stream: "orders", from: "owner", to: "out",
			reports: map[string]*transport.ReplicaReport{"r1": nil},
			want:    []error{ErrInvalid}, says: "{r1}, another of its replicas, has not yet said where its replicas stand"},
		{name: "another replica's report before the stream", down: []string{"owner"}, stream: "orders", from: "owner", to: "out",
			reports: map[string]*transport.ReplicaReport{"r1": {Applied: 1}},
			want:    []error{ErrInvalid}, says: "{r1}, another of its replicas, has not yet reported on the stream's replicas"},
		{name: "another replica's report truncated", down: []string{"owner"}, stream: "orders", from: "owner", to: "out",
			reports: map[string]*transport.ReplicaReport{"r2": {Applied: 99, Unready: []shardmap.ShardID{{Stream: "orders", Shard: 3}}, More: true}},
			want:    []error{ErrInvalid}, says: "{r2}, another of its replicas, reports more than"},
		{name: "an earlier replica unchecked, another not a voter", down: []string{"owner"}, stream: "orders", from: "owner", to: "out",
			earlier: []string{"r1"},
			reports: map[string]*transport.ReplicaReport{"r1": nil, "r2": {Applied: 99, Unready: []shardmap.ShardID{{Stream: "orders", Shard: 0}}}},
			want:    []error{ErrInvalid}, says: "{r2}, another of its replicas, holds a replica that is not a voter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := moveFixture(t, 4, 4)
			for _, r := range tc.down {
				down(t, s, name(r))
			}
			for r, rep := range tc.reports {
				s.members[name(r)].report = rep
			}
			for _, r := range tc.earlier {
				m := s.members[name(r)]
				m.node.Features = slices.DeleteFunc(slices.Clone(m.node.Features), func(f string) bool { return f == transport.FeatureReplicaReports })
			}
			before := s.Map()
			to, err := s.moveReplica(tc.stream, tc.shard, name(tc.from), name(tc.to))
			if err == nil {
				t.Fatalf("moved to %s", to)
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("error %q does not match %v", err, w)
				}
			}
			// The message names the brokers ({role} in the table).
			says, also := tc.says, tc.alsoSay
			for r, id := range role {
				says, also = strings.ReplaceAll(says, "{"+r+"}", id), strings.ReplaceAll(also, "{"+r+"}", id)
			}
			if !strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), also) {
				t.Errorf("error %q does not say %q and %q", err, says, also)
			}
			if we := wireError(err); we.Code != transport.CodeInvalid && we.Code != transport.CodeUnknownStream {
				t.Errorf("on the wire: %v", we)
			}
			if s.Map() != before {
				t.Errorf("a refused move changed the map (epoch %d to %d)", before.Epoch, s.Map().Epoch)
			}
		})
	}
}

// TestMoveReplica: a move gives the source's place in the replica set
// and in the raft slots to the target, marked joined, in a map of the
// next epoch; with no target named, the live member without a replica
// that rendezvous hashing ranks highest for the shard is chosen. The
// move stays when the source comes back, and when members join.
func TestMoveReplica(t *testing.T) {
	s := moveFixture(t, 5, 8)
	before := placementOf(s, "orders")
	set := before.Replicas(0)
	from := set[0] // the owner: its successor becomes the owner
	down(t, s, from)
	epoch := s.Map().Epoch

	var live []string
	for _, n := range s.Map().Nodes {
		if n.Live {
			live = append(live, n.ID)
		}
	}
	want := ""
	for _, n := range shardmap.Top("orders", 0, len(live), live) {
		if !slices.Contains(set, n) {
			want = n
			break
		}
	}
	to, err := s.moveReplica("orders", 0, from, "")
	if err != nil {
		t.Fatal(err)
	}
	if to != want {
		t.Fatalf("picked %s, want %s (first by rendezvous among the live members without a replica)", to, want)
	}
	after := placementOf(s, "orders")
	if got, wantSet := after.Replicas(0), []string{to, set[1], set[2]}; !slices.Equal(got, wantSet) {
		t.Errorf("replicas of orders/0 %v, want %v (the target in the source's place)", got, wantSet)
	}
	slots, oldSlots := after.Slots(0), before.Slots(0)
	i := slices.Index(oldSlots, from)
	if slots[i] != to || !slices.Equal(slices.Delete(slices.Clone(slots), i, i+1), slices.Delete(slices.Clone(oldSlots), i, i+1)) {
		t.Errorf("slots %v, were %v: want %s in slot %d, the others kept", slots, oldSlots, to, i)
	}
	if !after.Joined(0, to) || after.Joined(0, set[1]) || after.Joined(0, set[2]) {
		t.Errorf("joined: %s %v, %s %v, %s %v; want only the target", to, after.Joined(0, to), set[1], after.Joined(0, set[1]), set[2], after.Joined(0, set[2]))
	}
	for shard := 1; shard < 8; shard++ {
		if !slices.Equal(after.Replicas(shard), before.Replicas(shard)) || after.Joined(shard, to) {
			t.Errorf("orders/%d changed: %v, was %v", shard, after.Replicas(shard), before.Replicas(shard))
		}
	}
	if got := s.Map().Epoch; got != epoch+1 {
		t.Errorf("epoch %d after the move, want %d", got, epoch+1)
	}

	// A target named: another shard the source held, to a live member
	// without a replica of it.
	shard, target := -1, ""
	for sh := 1; sh < 8 && shard < 0; sh++ {
		if after.IsReplica(sh, from) {
			for _, n := range live {
				if !after.IsReplica(sh, n) {
					shard, target = sh, n
					break
				}
			}
		}
	}
	if shard < 0 {
		t.Fatalf("%s holds no other shard of orders: %v", from, after)
	}
	if got, err := s.moveReplica("orders", shard, from, target); err != nil || got != target {
		t.Fatalf("move orders/%d to %s: %s, %v", shard, target, got, err)
	}
	moved := placementOf(s, "orders")
	if !moved.IsReplica(shard, target) || moved.IsReplica(shard, from) || !moved.Joined(shard, target) || !moved.Joined(0, to) {
		t.Fatalf("after the second move: %v", moved)
	}

	// The source comes back, a member joins: the moves stay.
	if _, _, err := s.register(node(from), 100); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.register(node("6"), 101); err != nil {
		t.Fatal(err)
	}
	if got := placementOf(s, "orders"); !got.Equal(moved) {
		t.Fatalf("placement %v after the source came back and 6 joined, want %v", got, moved)
	}
}

// TestMovedPlacementPersists: a moved placement survives the etcd value
// of its stream, the state file, a restart and a follower's restore, its
// joined slots included; the store writes the moved stream's key, and
// only that one.
func TestMovedPlacementPersists(t *testing.T) {
	s := moveFixture(t, 4, 4)
	set := placementOf(s, "orders").Replicas(2)
	down(t, s, set[1])
	prev := s.snapshot()
	to, err := s.moveReplica("orders", 2, set[1], "")
	if err != nil {
		t.Fatal(err)
	}
	st, _ := s.Map().Stream("orders")
	check := func(what string, got shardmap.Stream) {
		t.Helper()
		if !sameStream(got, *st) || !got.Placement.Joined(2, to) || got.Created != st.Created {
			t.Errorf("%s: %+v, want %+v with %s joined", what, got, *st, to)
		}
	}

	// The etcd value of the stream.
	b, err := json.Marshal(toFileStream(*st))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"moves"`)) {
		t.Errorf("moved stream stored as %s, without its slots", b)
	}
	var fs fileStream
	if err := json.Unmarshal(b, &fs); err != nil {
		t.Fatal(err)
	}
	got, err := fs.stream()
	if err != nil {
		t.Fatal(err)
	}
	check("etcd value", got)
	// A stream no move changed is stored as before.
	one, _ := s.Map().Stream("one")
	if b, _ := json.Marshal(toFileStream(*one)); bytes.Contains(b, []byte(`"slots"`)) {
		t.Errorf("unmoved stream stored as %s", b)
	}

	// The store puts the moved stream, and no other.
	var puts []string
	for _, op := range newStore(nil, "test").diff(prev, s.snapshot()) {
		if op.IsPut() {
			puts = append(puts, string(op.KeyBytes()))
		}
	}
	if !slices.Contains(puts, "/felix/test/streams/orders") || slices.Contains(puts, "/felix/test/streams/one") {
		t.Errorf("the move's commit puts %v", puts)
	}

	// The state file, a restart, a follower's restore.
	dir := t.TempDir()
	if err := saveState(dir, s.snapshot()); err != nil {
		t.Fatal(err)
	}
	snap, err := loadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	restarted, _ := newState(snap, nil).Map().Stream("orders")
	check("restart from the state file", *restarted)
	restored, _ := restoreState(s.snapshot(), nil, stateLimits{}).Map().Stream("orders")
	check("follower's restore", *restored)
}

// TestMoveReplicaServer moves a replica with a real ctl: refused while
// its broker is live, and for a principal without cluster.admin; made
// once it is down, to the live broker without a replica, in the map
// pushed to every broker; kept across a restart of ctl.
func TestMoveReplicaServer(t *testing.T) {
	p, dataDir, srv, ids, members := ctlWithFour(t)
	addr := srv.Addr()
	st, _ := srv.Map().Stream("orders")
	set := st.Placement.Replicas(1)
	from, out := set[1], ""
	for _, id := range ids {
		if !slices.Contains(set, id) {
			out = id
		}
	}

	err := srv.MoveReplica("orders", 1, from, "")
	if !errors.Is(err, ErrInvalid) || !errors.Is(err, transport.ErrInvalid) || !strings.Contains(err.Error(), from+" is live: stop it first") {
		t.Fatalf("move of a live broker's replica: %v, want invalid: stop it first", err)
	}

	members[from].Close()
	for id, m := range members {
		if id != from {
			waitMap(t, m, from+" down", func(mp *shardmap.Map) bool { n, _ := mp.Node(from); return !n.Live })
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	// A broker relaying a principal without cluster.admin.
	relay, err := ctlclient.Dial(ctx, addr, p.clientTLS(t, out), transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	req := &transport.Request{Op: OpStreamMove, Stream: shardmap.StreamConfig{Name: "orders"}, Move: &transport.ReplicaMove{Shard: 1, From: from}}
	bob := *req
	bob.Principal = "bob"
	if _, err := relay.Request(ctx, &bob); !errors.Is(err, transport.ErrUnauthorized) || !strings.Contains(err.Error(), "cluster.admin") {
		t.Fatalf("bob moves a replica: %v, want unauthorized (cluster.admin)", err)
	}
	if _, err := relay.Request(ctx, &transport.Request{Op: OpStreamMove, Stream: shardmap.StreamConfig{Name: "orders"}, Principal: transport.DevAdminName}); !errors.Is(err, transport.ErrInvalid) {
		t.Fatalf("stream.move without a move: %v, want invalid", err)
	}

	admin, err := dialAs(ctx, t, p, addr, transport.DevAdminName)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()

	// A ctl of an earlier version running (its ctl/ entry advertises no
	// features): the move is refused, naming it, until it is gone.
	oldCtl := srv.store.ctlKey("ctl-old")
	if _, err := srv.store.cli.Put(ctx, oldCtl, `{"name":"ctl-old","id":"1","addr":"127.0.0.1:1"}`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Request(ctx, req); !errors.Is(err, transport.ErrInvalid) ||
		!strings.Contains(err.Error(), "control plane member ctl-old runs a version that cannot read a moved placement: upgrade it first") {
		t.Fatalf("move while a ctl of an earlier version runs: %v, want invalid naming ctl-old", err)
	}
	if _, err := srv.store.cli.Delete(ctx, oldCtl); err != nil {
		t.Fatal(err)
	}
	// A broker of an earlier version live (registered without features):
	// refused, naming it, until it registers again with the feature.
	other := set[2]
	rejoin := func(features []string, what string, ok func(shardmap.Node) bool) {
		t.Helper()
		members[other].Close()
		waitMap(t, members[out], other+" down", func(mp *shardmap.Map) bool { n, _ := mp.Node(other); return !n.Live })
		members[other] = joinWith(t, p, addr, other, features)
		waitMap(t, members[out], other+" "+what, func(mp *shardmap.Map) bool { n, _ := mp.Node(other); return n.Live && ok(n) })
	}
	rejoin([]string{}, "live without features", func(n shardmap.Node) bool { return n.Features == nil })
	if _, err := admin.Request(ctx, req); !errors.Is(err, transport.ErrInvalid) ||
		!strings.Contains(err.Error(), other+" runs a version that cannot read a moved placement: upgrade it first (it would drop out of the cluster") {
		t.Fatalf("move while %s is of an earlier version: %v, want invalid naming it", other, err)
	}
	if st, _ := srv.Map().Stream("orders"); !st.Placement.IsReplica(1, from) {
		t.Fatalf("a refused move changed the placement: %v", st.Placement)
	}
	rejoin(nil, "live with "+transport.FeatureReplicaMoves, func(n shardmap.Node) bool { return n.Supports(transport.FeatureReplicaMoves) })

	resp, err := admin.Request(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Moved == nil || *resp.Moved != (transport.ReplicaMove{Shard: 1, From: from, To: out}) {
		t.Fatalf("moved %+v, want orders/1 from %s to %s", resp.Moved, from, out)
	}
	if len(resp.Streams) != 1 || resp.Streams[0].Name != "orders" || resp.Map == nil || resp.Map.Epoch != srv.Map().Epoch {
		t.Fatalf("answer %+v at ctl epoch %d", resp, srv.Map().Epoch)
	}
	moved := func(mp *shardmap.Map) bool {
		st, ok := mp.Stream("orders")
		return ok && st.Placement.IsReplica(1, out) && !st.Placement.IsReplica(1, from) && st.Placement.Joined(1, out)
	}
	if !moved(resp.Map) {
		t.Fatalf("the answer's map does not hold the move: %+v", resp.Map)
	}
	for id, m := range members {
		if id != from {
			waitMap(t, m, "orders/1 moved to "+out, moved)
		}
	}
	// Moving it again is refused: from holds no replica now.
	if _, err := admin.Request(ctx, req); !errors.Is(err, transport.ErrInvalid) || !strings.Contains(err.Error(), "holds no replica") {
		t.Fatalf("the same move again: %v", err)
	}

	// The move is pending until its target says it is a voter; only the
	// target may say so.
	st, _ = srv.Map().Stream("orders")
	pendingNode, move := st.Placement.Pending(1)
	if pendingNode != out || move == 0 {
		t.Fatalf("pending move of orders/1: %q %d, want %s's", pendingNode, move, out)
	}
	settled := &transport.Request{Op: OpReplicaSettled, Stream: shardmap.StreamConfig{Name: "orders"}, Move: &transport.ReplicaMove{Shard: 1, To: out, ID: move}}
	if _, err := members[other].Request(ctx, settled); !errors.Is(err, transport.ErrUnauthorized) {
		t.Fatalf("%s settled %s's move: %v, want unauthorized", other, out, err)
	}
	if _, err := admin.Request(ctx, settled); !errors.Is(err, transport.ErrUnauthorized) {
		t.Fatalf("a client settled %s's move: %v, want unauthorized", out, err)
	}
	// Relayed by the target broker for a client (it carries the client's
	// principal): refused too. It once settled the move, and answered
	// with the whole map, ACL included.
	relayed := *settled
	relayed.Principal = "nobody"
	if _, err := members[out].Request(ctx, &relayed); !errors.Is(err, transport.ErrUnauthorized) {
		t.Fatalf("a client's settle relayed by %s: %v, want unauthorized", out, err)
	}
	if n, _ := srvPlacement(srv).Pending(1); n != out {
		t.Fatalf("a refused settle changed the pending move to %q", n)
	}
	if _, err := members[out].Request(ctx, settled); err != nil {
		t.Fatal(err)
	}
	if n, id := srvPlacement(srv).Pending(1); n != "" || id != 0 {
		t.Fatalf("after %s settled its move: pending %q %d", out, n, id)
	}

	before, _ := srv.Map().Stream("orders")
	srv.Close()
	srv2 := startCtl(t, p, dataDir, addr)
	after, _ := srv2.Map().Stream("orders")
	if !sameStream(*after, *before) || !after.Placement.Joined(1, out) {
		t.Fatalf("after a restart of ctl: %v, want %v", after.Placement, before.Placement)
	}
}

// TestMoveReplicaThroughFollower: a move asked of a follower is made by
// the leader, which chooses the target; the follower answers with it,
// holding the new map. So is the removal of the broker moved from.
func TestMoveReplicaThroughFollower(t *testing.T) {
	p := newPKI(t)
	srvs := startHA(t, p, 3)
	leader := waitLeader(t, srvs, nil)
	follower := srvs[0]
	if follower == leader {
		follower = srvs[1]
	}
	ids := []string{"b0", "b1", "b2", "b3"}
	members := map[string]*ctlclient.Member{}
	for _, id := range ids {
		members[id] = join(t, p, leader.Addr(), id)
	}
	for _, m := range members {
		waitMap(t, m, "4 live", func(mp *shardmap.Map) bool { return liveCount(mp) == 4 })
	}
	if err := follower.CreateStream(shardmap.StreamConfig{Name: "orders", Shards: 2, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	st, _ := follower.Map().Stream("orders")
	set := st.Placement.Replicas(0)
	from, out := set[0], ""
	for _, id := range ids {
		if !slices.Contains(set, id) {
			out = id
		}
	}
	members[from].Close()
	waitMap(t, members[out], from+" down", func(mp *shardmap.Map) bool { n, _ := mp.Node(from); return !n.Live })

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	admin, err := dialAs(ctx, t, p, follower.Addr(), transport.DevAdminName)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	resp, err := admin.Request(ctx, &transport.Request{Op: OpStreamMove, Stream: shardmap.StreamConfig{Name: "orders"}, Move: &transport.ReplicaMove{From: from}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Moved == nil || resp.Moved.To != out {
		t.Fatalf("the follower answered %+v, want the move to %s", resp.Moved, out)
	}
	if st, _ := follower.Map().Stream("orders"); !st.Placement.Joined(0, out) || st.Placement.IsReplica(0, from) {
		t.Fatalf("the follower's map (epoch %d) lacks the move right after it answered: %v", follower.Map().Epoch, st.Placement)
	}

	// Its other replicas moved too, and the moves settled (refused
	// before, as the leader says), the broker is removed through the
	// follower, which answers holding the map without it.
	for _, shard := range st.Placement.ReplicatedBy(from) {
		if shard != 0 {
			if err := follower.MoveReplica("orders", shard, from, ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := admin.Request(ctx, &transport.Request{Op: OpClusterRemove, NodeID: from}); !errors.Is(err, transport.ErrInvalid) || !strings.Contains(err.Error(), "not yet settled") {
		t.Fatalf("removing %s while the moves from it are pending: %v", from, err)
	}
	for _, shard := range st.Placement.ReplicatedBy(from) {
		to, move := srvPlacement(leader).Pending(shard)
		settled := &transport.Request{Op: OpReplicaSettled, Stream: shardmap.StreamConfig{Name: "orders"}, Move: &transport.ReplicaMove{Shard: shard, To: to, ID: move}}
		if _, err := members[to].Request(ctx, settled); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.Request(ctx, &transport.Request{Op: OpClusterRemove, NodeID: from}); err != nil {
		t.Fatal(err)
	}
	if _, ok := follower.Map().Node(from); ok {
		t.Fatalf("the follower's map (epoch %d) still lists %s right after it answered the removal", follower.Map().Epoch, from)
	}
	if _, ok := leader.Map().Node(from); ok {
		t.Fatalf("the leader's map (epoch %d) still lists %s", leader.Map().Epoch, from)
	}
}

func srvPlacement(srv *Server) shardmap.Placement {
	st, _ := srv.Map().Stream("orders")
	return st.Placement
}

func pendingNode(s *state) string {
	n, _ := placementOf(s, "orders").Pending(0)
	return n
}

// TestMoveOneAtATime: while a shard's move is pending (its target not yet
// a voter), no other replica of the shard moves, but the pending one may
// move again (its target lost too); the target's report settles it, and
// only a report of the pending move by its target does.
func TestMoveOneAtATime(t *testing.T) {
	s := moveFixture(t, 5, 2)
	set := placementOf(s, "orders").Replicas(0)
	var outs []string
	for _, n := range s.Map().Nodes {
		if !slices.Contains(set, n.ID) {
			outs = append(outs, n.ID)
		}
	}
	down(t, s, set[0])
	to, err := s.moveReplica("orders", 0, set[0], outs[0])
	if err != nil {
		t.Fatal(err)
	}
	pn, move := placementOf(s, "orders").Pending(0)
	if pn != to || move != s.Map().Epoch {
		t.Fatalf("pending %q %d, want %s at the move's map epoch %d", pn, move, to, s.Map().Epoch)
	}
	down(t, s, set[1])
	if _, err := s.moveReplica("orders", 0, set[1], outs[1]); !errors.Is(err, ErrInvalid) || !errors.Is(err, shardmap.ErrBadMove) ||
		!strings.Contains(err.Error(), "one move at a time") {
		t.Fatalf("a second replica of orders/0 moved while the first move was pending: %v", err)
	}
	register := func(id string) {
		t.Helper()
		if _, err := s.registerLive(reported(s, node(id), 100)); err != nil {
			t.Fatal(err)
		}
	}
	register(set[1])
	epoch := s.Map().Epoch
	for _, bad := range []struct {
		node string
		id   uint64
	}{{outs[1], move}, {to, move + 1}, {to, 0}} {
		if err := s.settleMove("orders", 0, bad.node, bad.id); err != nil || s.Map().Epoch != epoch {
			t.Fatalf("settle by %s of move %d: %v, epoch %d -> %d; want nothing changed", bad.node, bad.id, err, epoch, s.Map().Epoch)
		}
	}
	if err := s.settleMove("nope", 0, to, move); !errors.Is(err, ErrUnknownStream) {
		t.Fatalf("settle of an unknown stream: %v", err)
	}
	// The pending target lost too: its slot moves again.
	down(t, s, to)
	again, err := s.moveReplica("orders", 0, to, outs[1])
	if err != nil {
		t.Fatalf("moving the pending target's replica again: %v", err)
	}
	if n, id := placementOf(s, "orders").Pending(0); n != again || id != s.Map().Epoch {
		t.Fatalf("pending after moving again: %q %d", n, id)
	}
	if err := s.settleMove("orders", 0, to, move); err != nil || pendingNode(s) == "" {
		t.Fatalf("the first target's late report settled the second move (%v)", err)
	}
	_, second := placementOf(s, "orders").Pending(0)
	if err := s.settleMove("orders", 0, again, second); err != nil {
		t.Fatal(err)
	}
	if n, id := placementOf(s, "orders").Pending(0); n != "" || id != 0 || s.Map().Epoch != epoch+3 {
		t.Fatalf("after the report: pending %q %d at epoch %d", n, id, s.Map().Epoch)
	}
}

// TestMoveRefusedWhileEarlierVersionLive: while a live member has not
// registered with FeatureReplicaMoves (a broker of an earlier version,
// which cannot read the map a move makes), every move is refused, naming
// the members, and nothing changes; once they register again with the
// feature, the move is made. A down member's features are not checked.
func TestMoveRefusedWhileEarlierVersionLive(t *testing.T) {
	s := moveFixture(t, 4, 4)
	set := placementOf(s, "orders").Replicas(0)
	out := ""
	for _, n := range s.Map().Nodes {
		if !slices.Contains(set, n.ID) {
			out = n.ID
		}
	}
	earlier := func(id string) shardmap.Node {
		n := node(id)
		n.Features = nil
		return n
	}
	register := func(n shardmap.Node, session uint64) {
		t.Helper()
		if changed, err := s.registerLive(reported(s, n, session)); err != nil || !changed {
			t.Fatalf("register %s with features %q: changed %v, %v; want the map changed", n.ID, n.Features, changed, err)
		}
	}
	// The source registers again as of an earlier version, then goes
	// down: it is not checked.
	from := set[0]
	register(earlier(from), 50)
	if !s.end(from, 50) {
		t.Fatal("ending the source's registration changed nothing")
	}
	// Two live members of an earlier version: a replica of the shard and
	// the one a move would pick.
	register(earlier(set[2]), 51)
	register(earlier(out), 52)
	before := s.Map()
	olds := slices.Sorted(slices.Values([]string{set[2], out}))
	_, err := s.moveReplica("orders", 0, from, "")
	if want := strings.Join(olds, ", ") + " run a version that cannot read a moved placement: upgrade them first (they would drop out of the cluster"; !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Fatalf("move while %v are of an earlier version: %v, want invalid saying %q", olds, err, want)
	}
	if s.Map() != before {
		t.Fatalf("a refused move changed the map (epoch %d to %d)", before.Epoch, s.Map().Epoch)
	}
	register(node(out), 53)
	_, err = s.moveReplica("orders", 0, from, "")
	if want := set[2] + " runs a version that cannot read a moved placement: upgrade it first (it would drop out of the cluster, with all its shards)"; !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Fatalf("move while %s is of an earlier version: %v, want invalid saying %q", set[2], err, want)
	}
	if we := wireError(err); we.Code != transport.CodeInvalid {
		t.Fatalf("on the wire: %v", we)
	}
	register(node(set[2]), 54)
	to, err := s.moveReplica("orders", 0, from, "")
	if err != nil {
		t.Fatalf("move once every live member has the feature (the source, down, has not): %v", err)
	}
	if to != out || !placementOf(s, "orders").Joined(0, out) {
		t.Fatalf("moved to %s: %v", to, placementOf(s, "orders"))
	}
}

// ctlWithFour starts a ctl with four brokers, b0 to b3, registered and
// live, and creates on it the stream orders: 4 shards, replication
// factor 3.
func ctlWithFour(t *testing.T) (p *testPKI, dataDir string, srv *Server, ids []string, members map[string]*ctlclient.Member) {
	t.Helper()
	p = newPKI(t)
	dataDir = t.TempDir()
	srv = startCtl(t, p, dataDir, "127.0.0.1:0")
	ids = []string{"b0", "b1", "b2", "b3"}
	members = map[string]*ctlclient.Member{}
	for _, id := range ids {
		members[id] = join(t, p, srv.Addr(), id)
	}
	for _, m := range members {
		waitMap(t, m, "4 live", func(mp *shardmap.Map) bool { return liveCount(mp) == 4 })
	}
	if err := srv.CreateStream(shardmap.StreamConfig{Name: "orders", Shards: 4, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	return p, dataDir, srv, ids, members
}

// TestMoveTargetNotAnEarlierOne: with no target named, the control plane
// never picks a broker the pending move may not go to. A's replica moved
// to D (ranked first), D was lost too and the move went on to E, D came
// back and E was lost: D still ranks first, but the group may count its
// copy from the first move, so the move goes to the next one.
func TestMoveTargetNotAnEarlierOne(t *testing.T) {
	s := moveFixture(t, 6, 1)
	set := placementOf(s, "orders").Replicas(0)
	a := set[0]
	down(t, s, a)
	d, err := s.moveReplica("orders", 0, a, "")
	if err != nil {
		t.Fatal(err)
	}
	down(t, s, d)
	e, err := s.moveReplica("orders", 0, d, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.register(node(d), 100); err != nil {
		t.Fatal(err)
	}
	down(t, s, e)
	f, err := s.moveReplica("orders", 0, e, "")
	if err != nil {
		t.Fatalf("the pending move of orders/0 retargeted with no target named, %s back and ranked first: %v", d, err)
	}
	if f == d || f == a {
		t.Fatalf("the move went to %s; %s was its source and %s an earlier target", f, a, d)
	}
}

// TestMoveFromHeldLiveSaysSo: a source the ctl leader that took over
// holds live (no registration: its lease ran out while no ctl renewed it)
// is refused, as remove refuses it, with a message that says so, not
// "stop it first" to an operator who did.
func TestMoveFromHeldLiveSaysSo(t *testing.T) {
	s := moveFixture(t, 4, 4)
	from := placementOf(s, "orders").Replicas(0)[1]
	down(t, s, from)
	if !s.holdLive(from) {
		t.Fatal("holdLive changed nothing")
	}
	_, err := s.moveReplica("orders", 0, from, "")
	if err == nil {
		t.Fatal("moved a held-live replica")
	}
	if strings.Contains(err.Error(), "stop it first") || !strings.Contains(err.Error(), "took over") {
		t.Fatalf("error %q: want it to say the ctl leader that took over holds %s live until it registers or the grace ends", err, from)
	}
}
