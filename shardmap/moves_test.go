package shardmap

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func TestMoveKeepsOtherSlots(t *testing.T) {
	p := NewReplicatedPlacement([]string{"c", "a", "b"}, []string{"b", "d", "c"})
	if got := p.Slots(0); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("slots before any move %v, want the set sorted", got)
	}
	q, err := p.Move(0, "c", "e", 7)
	if err != nil {
		t.Fatal(err)
	}
	if got := q.Replicas(0); !slices.Equal(got, []string{"e", "a", "b"}) {
		t.Errorf("replicas after move %v, want e in c's place", got)
	}
	if q.Owner(0) != "e" {
		t.Errorf("owner %q, want the node moved to (it took the owner's place)", q.Owner(0))
	}
	if got := q.Slots(0); !slices.Equal(got, []string{"a", "b", "e"}) {
		t.Errorf("slots after move %v, want e in c's slot, a and b kept", got)
	}
	if q.MoveID(0, "e") != 7 || q.Joined(0, "a") || q.Joined(0, "c") || q.Joined(1, "b") {
		t.Errorf("joined: e %v a %v c %v; shard 1 b %v", q.Joined(0, "e"), q.Joined(0, "a"), q.Joined(0, "c"), q.Joined(1, "b"))
	}
	if !slices.Equal(q.Replicas(1), p.Replicas(1)) || !slices.Equal(q.Slots(1), p.Slots(1)) {
		t.Errorf("shard 1 changed: %v %v", q.Replicas(1), q.Slots(1))
	}
	if !slices.Equal(p.Replicas(0), []string{"c", "a", "b"}) || p.Joined(0, "e") {
		t.Errorf("Move modified its receiver: %v", p)
	}
	// While the first is pending, another slot of the shard does not
	// move; the pending slot itself may move again (its node lost too).
	if n, id := q.Pending(0); n != "e" || id != 7 {
		t.Errorf("pending %q %d, want e 7", n, id)
	}
	if _, err := q.Move(0, "a", "f", 9); !errors.Is(err, ErrBadMove) {
		t.Errorf("a second slot moved while a move was pending: %v", err)
	}
	if _, err := q.Move(0, "e", "c", 8); !errors.Is(err, ErrBadMove) || !strings.Contains(err.Error(), "where the move under way came from") {
		t.Errorf("the pending slot moved back to its source before the move settled: %v", err)
	}
	if again, err := q.Move(0, "e", "g", 8); err != nil || again.MoveID(0, "g") != 8 || again.Joined(0, "e") {
		t.Errorf("the pending slot moved again: %v, %v", err, again.movedWire())
	} else if n, id := again.Pending(0); n != "g" || id != 8 {
		t.Errorf("pending after the pending slot moved again: %q %d, want g 8", n, id)
	} else if _, err := again.Move(0, "g", "c", 10); !errors.Is(err, ErrBadMove) {
		t.Errorf("after a retarget, the slot moved back to the first move's source before it settled: %v", err)
	} else if _, err := again.Move(0, "g", "e", 10); !errors.Is(err, ErrBadMove) || !strings.Contains(err.Error(), "earlier target") {
		// e may have become a voter before it was lost: the group may
		// count its copy, which its broker would drop to join anew.
		t.Errorf("after a retarget, the slot moved back to the earlier target before it settled: %v", err)
	} else if third, err := again.Move(0, "g", "h", 10); err != nil {
		t.Errorf("a second retarget to a new node: %v", err)
	} else if w := third.movedWire(); !slices.Equal(w.PendingAlso[0], []string{"e", "g"}) || w.PendingFrom[0] != "c" {
		t.Errorf("after two retargets: source %q, earlier targets %q; want c, [e g]", w.PendingFrom[0], w.PendingAlso[0])
	} else if from := func(p Placement) (out []string) {
		for _, n := range []string{"a", "b", "c", "d", "e", "f", "g", "h", ""} {
			if p.PendingFrom(0, n) || p.PendingFrom(1, n) {
				out = append(out, n)
			}
		}
		return out
	}; !slices.Equal(from(third), []string{"c", "e", "g"}) {
		t.Errorf("the pending move is from %q, want its source and earlier targets, [c e g]", from(third))
	} else if done := third.Settle(0, 10); done.movedWire().PendingAlso != nil || from(done) != nil {
		t.Errorf("settled, earlier targets kept: %v; the move still from %q", done.movedWire().PendingAlso, from(done))
	} else if _, err := done.Move(0, "h", "e", 11); err != nil {
		t.Errorf("settled, the slot may move to an earlier target: %v", err)
	}
	retargeted, err := q.Move(0, "e", "g", 8)
	if err != nil {
		t.Fatal(err)
	}
	for _, codec := range []struct {
		name      string
		marshal   func(any) ([]byte, error)
		unmarshal func([]byte, any) error
	}{{"json", json.Marshal, json.Unmarshal}, {"msgpack", msgpack.Marshal, msgpack.Unmarshal}} {
		b, err := codec.marshal(retargeted)
		if err != nil {
			t.Fatal(err)
		}
		var back Placement
		if err := codec.unmarshal(b, &back); err != nil || !back.Equal(retargeted) {
			t.Errorf("earlier targets through %s: %v, %v; want %v", codec.name, back.movedWire(), err, retargeted.movedWire())
		}
	}
	if q.Settle(0, 6).Equal(q) != true || q.Settle(1, 7).Equal(q) != true {
		t.Error("settling another move id or shard changed the placement")
	}
	settled := q.Settle(0, 7)
	if n, id := settled.Pending(0); n != "" || id != 0 || settled.MoveID(0, "e") != 7 {
		t.Errorf("after Settle: pending %q %d, move id of e %d", n, id, settled.MoveID(0, "e"))
	}
	if n, _ := q.Pending(0); n != "e" {
		t.Error("Settle modified its receiver")
	}
	// A second move, once the first settled, keeps its slot and mark.
	r, err := settled.Move(0, "a", "f", 9)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Slots(0); !slices.Equal(got, []string{"f", "b", "e"}) || r.MoveID(0, "e") != 7 || r.MoveID(0, "f") != 9 || r.Joined(0, "b") {
		t.Errorf("after two moves: slots %v, joined e %v f %v b %v", got, r.Joined(0, "e"), r.Joined(0, "f"), r.Joined(0, "b"))
	}
	// PlaceReplicas keeps moved slots (replica sets are never changed there).
	if got := PlaceReplicas("s", 2, 3, []string{"a", "b", "c", "d", "e", "f"}, r); !got.Equal(r) {
		t.Errorf("PlaceReplicas changed a moved placement: %v -> %v", r, got)
	}
	if got := PlaceReplicas("s", 3, 3, []string{"a", "b", "c", "d", "e", "f"}, r); !slices.Equal(got.Slots(0), r.Slots(0)) || !got.Joined(0, "f") || len(got.Replicas(2)) != 3 {
		t.Errorf("PlaceReplicas with a new shard lost the moved slots: %v", got.movedWire())
	}
}

func TestMoveRefused(t *testing.T) {
	p := NewReplicatedPlacement([]string{"a", "b", "c"})
	one := NewPlacement("a", "b")
	for name, try := range map[string]func() error{
		"factor 1":       func() error { _, err := one.Move(0, "a", "b", 5); return err },
		"no such shard":  func() error { _, err := p.Move(3, "a", "d", 5); return err },
		"from not there": func() error { _, err := p.Move(0, "d", "e", 5); return err },
		"to there":       func() error { _, err := p.Move(0, "a", "b", 5); return err },
		"to empty":       func() error { _, err := p.Move(0, "a", "", 5); return err },
		"to self":        func() error { _, err := p.Move(0, "a", "a", 5); return err },
		"id 0":           func() error { _, err := p.Move(0, "a", "d", 0); return err },
	} {
		if err := try(); !errors.Is(err, ErrBadMove) {
			t.Errorf("%s: err %v, want ErrBadMove", name, err)
		}
	}
}

func TestMovedPlacementEncoding(t *testing.T) {
	p, err := NewReplicatedPlacement([]string{"c", "a", "b"}, nil, []string{"b", "d", "c"}).Move(2, "d", "e", 12)
	if err != nil {
		t.Fatal(err)
	}
	b, err := msgpack.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var q Placement
	if err := msgpack.Unmarshal(b, &q); err != nil || !q.Equal(p) || !q.Joined(2, "e") {
		t.Fatalf("msgpack round trip: %v, %v; want %v", q.movedWire(), err, p.movedWire())
	}
	j, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"sets":[["c","a","b"],null,["b","e","c"]],"slots":[null,null,["b","c","e"]],"moves":[null,null,[0,0,12]],"pending":[0,0,12],"pending_from":["","","d"]}`; string(j) != want {
		t.Fatalf("JSON %s, want %s", j, want)
	}
	var r Placement
	if err := json.Unmarshal(j, &r); err != nil || !r.Equal(p) {
		t.Fatalf("JSON round trip: %v, %v", r, err)
	}
	// The unmoved placement still differs from the moved one.
	if r.Equal(NewReplicatedPlacement(p.Replicas(0), nil, p.Replicas(2))) {
		t.Error("a moved placement equals one with the same sets and no move")
	}
	for _, bad := range []string{
		`{"sets":[["a","b","c"]],"slots":[["a","b","d"]],"moves":[[1,0,0]],"pending":[0],"pending_from":[""]}`,  // a slot node outside the set
		`{"sets":[["a","b","c"]],"slots":[["a","a","b"]],"moves":[[1,0,0]],"pending":[0],"pending_from":[""]}`,  // repeated
		`{"sets":[["a","b","c"]],"slots":[["a","b"]],"moves":[[1,0]],"pending":[0],"pending_from":[""]}`,        // too few
		`{"sets":[["a","b","c"]],"slots":[["a","b","c"]],"moves":[[1,0]],"pending":[0],"pending_from":[""]}`,    // move ids do not fit the slots
		`{"sets":[["a","b","c"]],"slots":[null],"moves":[[1]],"pending":[0],"pending_from":[""]}`,               // move ids without slots
		`{"sets":[["a","b","c"]],"slots":[],"moves":[],"pending":[],"pending_from":[]}`,                         // lengths differ
		`{"sets":[["a","b","c"]],"slots":[["a","b","c"]],"moves":[[1,0,0]],"pending":[2],"pending_from":["d"]}`, // pending none of the moves
		`{"sets":[["a","b","c"]],"slots":[["a","b","c"]],"moves":[[1,0,0]],"pending":[1],"pending_from":[""]}`,  // pending with no source
		`{"sets":[["a","b","c"]],"slots":[["a","b","c"]],"moves":[[1,0,0]],"pending":[0],"pending_from":["d"]}`, // a source with no pending move
		`{"sets":[["a","b","c"]],"slots":[["a","b","c"]],"moves":[[1,0,0]]}`,                                    // no pending list
	} {
		var x Placement
		if err := json.Unmarshal([]byte(bad), &x); err == nil {
			t.Errorf("decoded %s as %v, want an error", bad, x.movedWire())
		}
		var w movedPlacement
		_ = json.Unmarshal([]byte(bad), &w)
		mb, _ := msgpack.Marshal(w)
		if err := msgpack.Unmarshal(mb, &x); err == nil {
			t.Errorf("msgpack decoded %s, want an error", bad)
		}
	}
}
