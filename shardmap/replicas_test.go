package shardmap

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func TestTopIsRendezvousOrder(t *testing.T) {
	nodes := []string{"a", "b", "c", "d", "e"}
	for shard := range 64 {
		top := Top("orders", shard, 3, nodes)
		if len(top) != 3 || top[0] != Owner("orders", shard, nodes) {
			t.Fatalf("Top(orders/%d) = %q, want 3 nodes, %q first", shard, top, Owner("orders", shard, nodes))
		}
		if top[0] == top[1] || top[1] == top[2] || top[0] == top[2] {
			t.Fatalf("Top(orders/%d) = %q repeats a node", shard, top)
		}
		// Removing a node outside the top keeps the top: rendezvous.
		rest := slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return !slices.Contains(top, n) && n == firstNotIn(nodes, top) })
		if got := Top("orders", shard, 3, rest); !slices.Equal(got, top) {
			t.Fatalf("Top(orders/%d) over %q = %q, want %q", shard, rest, got, top)
		}
	}
	if Top("orders", 0, 3, []string{"a", "b"}) != nil {
		t.Fatal("Top of 3 among 2 nodes must be nil")
	}
}

func firstNotIn(nodes, set []string) string {
	for _, n := range nodes {
		if !slices.Contains(set, n) {
			return n
		}
	}
	return ""
}

func TestPlaceReplicas(t *testing.T) {
	nodes := []string{"a", "b", "c", "d"}
	if p := PlaceReplicas("s", 4, 3, []string{"a", "b"}, Placement{}); p.Len() != 4 || len(p.Replicas(0)) != 0 {
		t.Fatalf("placed %v among 2 nodes, want 4 unplaced shards", p)
	}
	p := PlaceReplicas("s", 4, 3, nodes, Placement{})
	for shard := range 4 {
		if got, want := p.Replicas(shard), Top("s", shard, 3, nodes); !slices.Equal(got, want) {
			t.Fatalf("shard %d replicas %q, want %q", shard, got, want)
		}
		if p.Owner(shard) != p.Replicas(shard)[0] {
			t.Fatalf("shard %d owner %q is not its first replica", shard, p.Owner(shard))
		}
		for _, n := range p.Replicas(shard) {
			if !p.IsReplica(shard, n) || !slices.Contains(p.ReplicatedBy(n), shard) {
				t.Fatalf("shard %d: %q not seen as a replica", shard, n)
			}
		}
	}
	// Replica sets stay when members come and go: raft's voters are fixed.
	if q := PlaceReplicas("s", 4, 3, []string{"a", "b", "c", "d", "e", "f"}, p); !q.Equal(p) {
		t.Fatalf("replica sets moved on a join: %v -> %v", p, q)
	}
	if q := PlaceReplicas("s", 4, 3, []string{"a"}, p); !q.Equal(p) {
		t.Fatalf("replica sets moved on leaves: %v -> %v", p, q)
	}
	// R=1 is Place.
	if q := PlaceReplicas("s", 4, 1, nodes, Placement{}); !q.Equal(Assign("s", 4, nodes)) {
		t.Fatalf("R=1 placement %v, want %v", q, Assign("s", 4, nodes))
	}
}

func TestReplicatedPlacementEncoding(t *testing.T) {
	p := NewReplicatedPlacement([]string{"b", "a", "c"}, nil, []string{"c", "b", "a"})
	b, err := msgpack.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var q Placement
	if err := msgpack.Unmarshal(b, &q); err != nil || !q.Equal(p) {
		t.Fatalf("msgpack round trip: %v, %v; want %v", q, err, p)
	}
	j, err := json.Marshal(p)
	if err != nil || string(j) != `[["b","a","c"],null,["c","b","a"]]` {
		t.Fatalf("JSON %s, %v", j, err)
	}
	var r Placement
	if err := json.Unmarshal(j, &r); err != nil || !r.Equal(p) {
		t.Fatalf("JSON round trip: %v, %v; want %v", r, err, p)
	}
	// A placement of single owners encodes as before replication.
	one := NewReplicatedPlacement([]string{"a"}, nil, []string{"b"})
	if j, _ := json.Marshal(one); string(j) != `["a","","b"]` || !one.Equal(NewPlacement("a", "", "b")) {
		t.Fatalf("single-replica placement %s, want the owners array", j)
	}
	for _, bad := range []string{`[["a","a","b"]]`, `[["a","","b"]]`, `[1]`} {
		var x Placement
		if err := json.Unmarshal([]byte(bad), &x); err == nil {
			t.Errorf("decoded %s as %v, want an error", bad, x)
		}
	}
	bad, _ := msgpack.Marshal([][]string{{"a", "b", "a"}})
	if err := msgpack.Unmarshal(bad, &q); err == nil {
		t.Fatal("msgpack: a repeated replica must be refused")
	}
}

func TestStreamConfigReplicas(t *testing.T) {
	for r, ok := range map[int]bool{0: true, 1: true, 3: true, 2: false, 5: false, -1: false} {
		err := StreamConfig{Name: "s", Shards: 1, Replicas: r}.Validate()
		if (err == nil) != ok {
			t.Errorf("Replicas %d: Validate = %v", r, err)
		}
	}
	if (StreamConfig{}).Factor() != 1 || (StreamConfig{Replicas: 3}).Factor() != 3 {
		t.Fatal("Factor")
	}
	// A factor-1 stream encodes as before the field existed.
	a, _ := msgpack.Marshal(StreamConfig{Name: "s", Shards: 2})
	type old struct {
		Name   string `msgpack:"name"`
		Shards int    `msgpack:"shards"`
	}
	b, _ := msgpack.Marshal(old{"s", 2})
	if string(a) != string(b) {
		t.Fatalf("factor-1 config encodes as %x, earlier versions %x", a, b)
	}
}
