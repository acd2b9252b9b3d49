package shardmap

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func TestPlacementMethods(t *testing.T) {
	owners := []string{"b", "", "a", "b"}
	p := NewPlacement(owners...)
	owners[0] = "changed" // NewPlacement copies
	if p.Len() != 4 {
		t.Fatalf("Len = %d, want 4", p.Len())
	}
	for _, tc := range []struct {
		shard    int
		owner    string
		replicas []string
	}{
		{0, "b", []string{"b"}},
		{1, "", nil},
		{2, "a", []string{"a"}},
		{3, "b", []string{"b"}},
		{4, "", nil},
		{-1, "", nil},
	} {
		if got := p.Owner(tc.shard); got != tc.owner {
			t.Errorf("Owner(%d) = %q, want %q", tc.shard, got, tc.owner)
		}
		if got := p.Replicas(tc.shard); !slices.Equal(got, tc.replicas) {
			t.Errorf("Replicas(%d) = %q, want %q", tc.shard, got, tc.replicas)
		}
	}
	if r := p.Replicas(0); cap(r) != len(r) {
		t.Fatalf("Replicas has room to append into p: len %d cap %d", len(r), cap(r))
	}
	if got := p.OwnedBy("b"); !slices.Equal(got, []int{0, 3}) {
		t.Fatalf("OwnedBy(b) = %v, want [0 3]", got)
	}
	if got := p.OwnedBy("c"); len(got) != 0 {
		t.Fatalf("OwnedBy(c) = %v, want none", got)
	}
	var all []string
	for shard, owner := range p.All() {
		if shard != len(all) {
			t.Fatalf("All yielded shard %d after %d shards", shard, len(all))
		}
		all = append(all, owner)
	}
	if !slices.Equal(all, []string{"b", "", "a", "b"}) {
		t.Fatalf("All = %q", all)
	}
	if !p.Equal(NewPlacement("b", "", "a", "b")) || p.Equal(NewPlacement("b", "", "a")) || p.Equal(NewPlacement("b", "a", "a", "b")) {
		t.Fatal("Equal must compare every shard's owner")
	}
	if !(Placement{}).Equal(NewPlacement()) || !(Placement{}).IsZero() || p.IsZero() {
		t.Fatal("an empty placement must equal the zero one and be zero")
	}
	if p.String() != "[b  a b]" {
		t.Fatalf("String = %q", p.String())
	}
}

func TestPlace(t *testing.T) {
	ids := []string{"broker-0", "broker-1", "broker-2"}
	fresh := Place("orders", 16, ids, Placement{})
	if !fresh.Equal(Assign("orders", 16, ids)) {
		t.Fatalf("Place of nothing = %v, want Assign's %v", fresh, Assign("orders", 16, ids))
	}
	// Owners already placed stay, even where rendezvous would now pick a
	// newer member; a shard with none, or with an owner that left, is
	// placed.
	prev := NewPlacement("broker-2", "", "gone", "broker-0")
	got := Place("orders", 5, ids, prev)
	want := []string{"broker-2", Owner("orders", 1, ids), Owner("orders", 2, ids), "broker-0", Owner("orders", 4, ids)}
	if !got.Equal(NewPlacement(want...)) {
		t.Fatalf("Place = %v, want %v", got, want)
	}
	if !prev.Equal(NewPlacement("broker-2", "", "gone", "broker-0")) {
		t.Fatalf("Place modified its input: %v", prev)
	}
	if again := Place("orders", 5, ids, got); !again.Equal(got) {
		t.Fatalf("Place of a complete placement changed it: %v → %v", got, again)
	}
	// No members: unplaced shards, unless every shard has an entry.
	if got := Place("orders", 3, nil, NewPlacement("a")); !got.Equal(NewPlacement("", "", "")) {
		t.Fatalf("Place with no members = %v, want 3 unplaced shards", got)
	}
	if got := Place("orders", 2, nil, NewPlacement("a", "b")); !got.Equal(NewPlacement("a", "b")) {
		t.Fatalf("Place with no members changed a complete placement: %v", got)
	}
}

// oldStream is shardmap.Stream as versions before Placement declared it.
type oldStream struct {
	StreamConfig `msgpack:",inline"`
	Owners       []string `msgpack:"owners"`
}

// TestPlacementWireCompatible: a stream encodes exactly as it did when
// its placement was an owners slice, both ways.
func TestPlacementWireCompatible(t *testing.T) {
	cfg := StreamConfig{Name: "orders", Shards: 3}
	for _, owners := range [][]string{{"a", "", "b"}, nil, {}} {
		old, err := msgpack.Marshal(oldStream{StreamConfig: cfg, Owners: owners})
		if err != nil {
			t.Fatal(err)
		}
		cur, err := msgpack.Marshal(Stream{StreamConfig: cfg, Placement: Placement{owners: owners}})
		if err != nil {
			t.Fatal(err)
		}
		if string(old) != string(cur) {
			t.Fatalf("owners %q: encoding changed:\n old %x\n new %x", owners, old, cur)
		}
		var got Stream
		if err := msgpack.Unmarshal(old, &got); err != nil {
			t.Fatal(err)
		}
		if got.StreamConfig != cfg || !got.Placement.Equal(NewPlacement(owners...)) {
			t.Fatalf("owners %q: decoded %+v", owners, got)
		}
		var back oldStream
		if err := msgpack.Unmarshal(cur, &back); err != nil || !slices.Equal(back.Owners, owners) {
			t.Fatalf("owners %q: an old reader decodes %q, %v", owners, back.Owners, err)
		}
	}
	var bad Stream
	if err := msgpack.Unmarshal([]byte{0x81, 0xa6, 'o', 'w', 'n', 'e', 'r', 's', 0x01}, &bad); err == nil {
		t.Fatal("owners that are not an array must fail to decode")
	}
}

func TestPlacementJSON(t *testing.T) {
	type doc struct {
		Owners Placement `json:"owners,omitzero"`
	}
	b, err := json.Marshal(doc{Owners: NewPlacement("a", "", "b")})
	if err != nil || string(b) != `{"owners":["a","","b"]}` {
		t.Fatalf("marshal = %s, %v", b, err)
	}
	if b, _ := json.Marshal(doc{}); string(b) != `{}` {
		t.Fatalf("an empty placement is written as %s, want it omitted", b)
	}
	for in, want := range map[string]Placement{
		`{"owners":["a","","b"]}`: NewPlacement("a", "", "b"),
		`{"owners":null}`:         {},
		`{}`:                      {},
	} {
		var d doc
		if err := json.Unmarshal([]byte(in), &d); err != nil || !d.Owners.Equal(want) {
			t.Errorf("unmarshal %s = %v, %v; want %v", in, d.Owners, err, want)
		}
	}
	var d doc
	if err := json.Unmarshal([]byte(`{"owners":"a"}`), &d); err == nil {
		t.Fatal("owners that are not an array must fail to decode")
	}
}
