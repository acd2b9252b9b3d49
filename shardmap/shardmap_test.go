package shardmap

import (
	"fmt"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func nodes(n int) []Node {
	out := make([]Node, n)
	for i := range out {
		out[i] = Node{ID: fmt.Sprintf("broker-%d", i), Addr: fmt.Sprintf("127.0.0.1:%d", 7100+i), Live: true}
	}
	return out
}

func ids(ns []Node) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = n.ID
	}
	return out
}

func TestOwnerDeterministicAndOrderIndependent(t *testing.T) {
	ns := ids(nodes(5))
	rev := slices.Clone(ns)
	slices.Reverse(rev)
	for shard := range 200 {
		a := Owner("orders", shard, ns)
		if b := Owner("orders", shard, rev); a != b {
			t.Fatalf("shard %d: owner depends on node order: %s vs %s", shard, a, b)
		}
		if b := Owner("orders", shard, ns); a != b {
			t.Fatalf("shard %d: owner not deterministic", shard)
		}
	}
	if got := Owner("orders", 0, nil); got != "" {
		t.Fatalf("owner with no nodes = %q, want empty", got)
	}
}

// TestOwnerGolden pins the hash so a change to it (which would move every
// shard of every running cluster on upgrade) cannot go unnoticed.
func TestOwnerGolden(t *testing.T) {
	ns := ids(nodes(3))
	want := []string{}
	for shard := range 8 {
		want = append(want, Owner("orders", shard, ns))
	}
	got := fmt.Sprint(want)
	const golden = "[broker-2 broker-1 broker-0 broker-1 broker-0 broker-2 broker-1 broker-1]"
	if got != golden {
		t.Fatalf("owners of orders/0..7 over 3 nodes = %s, want %s", got, golden)
	}
}

func TestBalance(t *testing.T) {
	for _, n := range []int{3, 5, 10} {
		ns := ids(nodes(n))
		count := map[string]int{}
		const shards = 1000
		for shard := range shards {
			count[Owner("events", shard, ns)]++
		}
		even := float64(shards) / float64(n)
		for _, id := range ns {
			c := float64(count[id])
			if c < 0.75*even || c > 1.25*even {
				t.Errorf("%d nodes: %s owns %v shards, want within ±25%% of %.0f", n, id, c, even)
			}
		}
	}
}

func TestMinimalMovement(t *testing.T) {
	streams := []StreamConfig{{Name: "orders", Shards: 1000}}
	before := Build(1, nodes(4), streams)

	grown := Build(2, nodes(5), streams)
	moves := Diff(before, grown)
	if len(moves) == 0 {
		t.Fatal("adding a node moved no shard")
	}
	for _, m := range moves {
		if m.To != "broker-4" {
			t.Fatalf("adding broker-4 moved %s from %s to %s", m.ShardID, m.From, m.To)
		}
	}

	shrunk := Build(3, nodes(3), streams)
	moves = Diff(before, shrunk)
	if len(moves) == 0 {
		t.Fatal("removing a node moved no shard")
	}
	for _, m := range moves {
		if m.From != "broker-3" {
			t.Fatalf("removing broker-3 moved %s from %s to %s", m.ShardID, m.From, m.To)
		}
	}
	if got, want := len(moves), len(before.OwnedBy("broker-3")); got != want {
		t.Fatalf("removing broker-3 moved %d shards, it owned %d", got, want)
	}
}

func TestLivenessDoesNotMoveShards(t *testing.T) {
	streams := []StreamConfig{{Name: "orders", Shards: 64}}
	ns := nodes(3)
	a := Build(1, ns, streams)
	ns[1].Live = false
	b := Build(2, ns, streams)
	if moves := Diff(a, b); len(moves) != 0 {
		t.Fatalf("a node going down moved shards: %v", moves)
	}
	n, _ := b.Node("broker-1")
	if n.Live {
		t.Fatal("broker-1 should be marked not live")
	}
}

func TestDiffStreams(t *testing.T) {
	a := Build(1, nodes(3), []StreamConfig{{Name: "a", Shards: 2}})
	b := Build(2, nodes(3), []StreamConfig{{Name: "b", Shards: 1}})
	moves := Diff(a, b)
	if len(moves) != 3 {
		t.Fatalf("moves = %v, want 2 removed + 1 added", moves)
	}
	if moves[0].Stream != "a" || moves[0].To != "" || moves[2].Stream != "b" || moves[2].From != "" {
		t.Fatalf("unexpected moves %v", moves)
	}
	if len(Diff(nil, b)) != 1 {
		t.Fatal("diff from nil map should list every shard as added")
	}
}

func TestEpochOrdering(t *testing.T) {
	a := Build(4, nodes(3), nil)
	b := Build(5, nodes(3), nil)
	if !b.NewerThan(a) || a.NewerThan(b) || a.NewerThan(a) {
		t.Fatal("NewerThan must order by epoch, strictly")
	}
	if !a.NewerThan(nil) {
		t.Fatal("any map is newer than none")
	}
}

func TestRouteAndLookups(t *testing.T) {
	m := Build(1, nodes(3), []StreamConfig{{Name: "orders", Shards: 8}})
	shard, owner, err := m.Route("orders", []byte("customer-42"))
	if err != nil {
		t.Fatal(err)
	}
	if shard != ShardFor([]byte("customer-42"), 8) {
		t.Fatalf("route shard %d disagrees with ShardFor", shard)
	}
	if want := Owner("orders", shard, ids(nodes(3))); owner.ID != want {
		t.Fatalf("route owner %s, want %s", owner.ID, want)
	}
	if owner.Addr == "" {
		t.Fatal("route owner has no address")
	}
	if _, _, err := m.Route("nope", nil); err == nil {
		t.Fatal("route of an unknown stream should fail")
	}
	if _, err := m.Owner("orders", 8); err == nil {
		t.Fatal("owner of shard 8 of an 8-shard stream should fail")
	}
	total := 0
	for _, n := range m.Nodes {
		total += len(m.OwnedBy(n.ID))
	}
	if total != 8 {
		t.Fatalf("OwnedBy over all nodes covers %d shards, want 8", total)
	}
}

func TestStreamConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		c  StreamConfig
		ok bool
	}{
		{StreamConfig{Name: "orders", Shards: 1}, true},
		{StreamConfig{Name: "a.b-c_d", Shards: MaxShards}, true},
		{StreamConfig{Name: "", Shards: 1}, false},
		{StreamConfig{Name: "has space", Shards: 1}, false},
		{StreamConfig{Name: "orders", Shards: 0}, false},
		{StreamConfig{Name: "orders", Shards: MaxShards + 1}, false},
		{StreamConfig{Name: "orders", Shards: 1, RetentionBytes: -1}, false},
	} {
		if err := tc.c.Validate(); (err == nil) != tc.ok {
			t.Errorf("Validate(%+v) = %v, want ok=%v", tc.c, err, tc.ok)
		}
	}
}

func TestMsgpackRoundTrip(t *testing.T) {
	m := Build(9, nodes(3), []StreamConfig{{Name: "orders", Shards: 4, RetentionBytes: 1 << 20}})
	b, err := msgpack.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var got Map
	if err := msgpack.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(*m) {
		t.Fatalf("round trip changed the map:\n got %+v\nwant %+v", got, *m)
	}
}

// TestNodeFeaturesReadByEarlierVersions: a node's features ride in the
// map as a key earlier versions do not know, which msgpack skips when it
// decodes into their Node (unknown keys of a struct are ignored); a node
// without features encodes as earlier versions encoded it.
func TestNodeFeaturesReadByEarlierVersions(t *testing.T) {
	// Node as versions before features had it.
	type earlierNode struct {
		ID    string `msgpack:"id"`
		Addr  string `msgpack:"addr"`
		Admin string `msgpack:"admin,omitempty"`
		Live  bool   `msgpack:"live"`
	}
	type earlierMap struct {
		Epoch   uint64        `msgpack:"epoch"`
		Nodes   []earlierNode `msgpack:"nodes"`
		Streams []Stream      `msgpack:"streams"`
	}
	ns := nodes(3)
	ns[0].Features = []string{"replica-moves", "some-later-feature"}
	ns[1].Features = []string{"replica-moves"}
	m := Build(9, ns, []StreamConfig{{Name: "orders", Shards: 4, Replicas: 3}})
	b, err := msgpack.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}

	var old earlierMap
	if err := msgpack.Unmarshal(b, &old); err != nil {
		t.Fatalf("an earlier version decoding a map with node features: %v", err)
	}
	if old.Epoch != 9 || len(old.Nodes) != 3 || len(old.Streams) != 1 {
		t.Fatalf("an earlier version decoded %+v", old)
	}
	for i, n := range old.Nodes {
		if want := (earlierNode{ID: ns[i].ID, Addr: ns[i].Addr, Admin: ns[i].Admin, Live: ns[i].Live}); n != want {
			t.Errorf("node %d decoded by an earlier version as %+v, want %+v", i, n, want)
		}
	}

	var got Map
	if err := msgpack.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	for i, n := range got.Nodes {
		if !slices.Equal(n.Features, ns[i].Features) {
			t.Errorf("node %s: features %q after a round trip, want %q", n.ID, n.Features, ns[i].Features)
		}
	}
	if !got.Nodes[0].Supports("replica-moves") || got.Nodes[2].Supports("replica-moves") {
		t.Errorf("Supports: %+v", got.Nodes)
	}

	// Without features, the bytes of earlier versions.
	plain, err := msgpack.Marshal(Node{ID: "n1", Addr: "a:1", Live: true})
	if err != nil {
		t.Fatal(err)
	}
	earlier, err := msgpack.Marshal(earlierNode{ID: "n1", Addr: "a:1", Live: true})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(plain, earlier) {
		t.Errorf("a node without features encodes as % x, earlier versions as % x", plain, earlier)
	}
}

func BenchmarkRoute(b *testing.B) {
	m := Build(1, nodes(5), []StreamConfig{{Name: "orders", Shards: 64}})
	key := []byte("customer-42")
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := m.Route("orders", key); err != nil {
			b.Fatal(err)
		}
	}
}

// Diff sees a replica moved with the owner kept, and a stream deleted and
// created again with the same placement; it saw neither.
func TestDiffSeesReplicasAndIncarnations(t *testing.T) {
	ns := []Node{{ID: "a"}, {ID: "b"}, {ID: "c"}, {ID: "d"}}
	cfg := StreamConfig{Name: "r", Shards: 1, Replicas: 3}
	old := Build(1, ns, []StreamConfig{cfg})
	st, _ := old.Stream("r")
	set := st.Placement.Replicas(0)
	var spare string
	for _, n := range ns {
		if !st.Placement.IsReplica(0, n.ID) {
			spare = n.ID
		}
	}
	moved, err := st.Placement.Move(0, set[2], spare, 2)
	if err != nil {
		t.Fatal(err)
	}
	next := Assemble(2, ns, []Stream{{StreamConfig: cfg, Placement: moved, Created: st.Created}})
	d := Diff(old, next)
	if len(d) != 1 || d[0].From != d[0].To || !slices.Equal(d[0].FromReplicas, set) || !slices.Equal(d[0].ToReplicas, moved.Replicas(0)) {
		t.Errorf("Diff of %s's replica of r/0 moved to %s: %+v", set[2], spare, d)
	}
	again := Assemble(3, ns, []Stream{{StreamConfig: cfg, Placement: st.Placement, Created: 3}})
	if d := Diff(old, again); len(d) != 1 || !d[0].Recreated {
		t.Errorf("Diff of r deleted and created again: %+v", d)
	}
	if d := Diff(old, old); len(d) != 0 {
		t.Errorf("Diff of a map with itself: %+v", d)
	}
}
