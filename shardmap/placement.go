package shardmap

import (
	"bytes"
	"encoding/json"
	"fmt"
	"iter"
	"slices"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Placement says where the shards of one stream live: for each shard, its
// replica set, owner first. For a stream of replication factor 1 the
// replica set is the owner alone, the node that takes the shard's writes
// and answers for it. For replication factor 3 it is the three nodes that
// hold a replica of the shard's raft group (see package replica), the
// owner being the preferred leader: the node tried first, until a replica
// names another leader.
//
// Callers read a Placement only through its methods, so that what a shard's
// placement holds can grow (a replica set per shard, placed by rendezvous
// hashing) without changing them. A shard that has no owner yet (placed
// while the cluster had no member) has owner "" and no replicas.
//
// A Placement is immutable: no method modifies it, and [NewPlacement]
// copies what it is given, so values may be copied and shared freely. The
// zero Placement places no shard.
//
// On the wire (msgpack) and in JSON a Placement whose shards have one
// replica each is the list of the owners of shards 0, 1, …, as the owners
// field of earlier versions was, so maps and stored state of those
// versions read as they were, and are written byte for byte the same.
// A Placement with a larger replica set is the list of the shards' replica
// sets, each a list, owner first (an unplaced shard's is empty): a version
// that predates replication cannot read it (see [Placement.DecodeMsgpack]).
type Placement struct {
	// owners[s] is the node owning shard s, "" while it has none.
	owners []string
	// sets[s] is the replica set of shard s, owners[s] first (nil while
	// it has none); sets is nil when every replica set is its owner
	// alone.
	sets [][]string
	// moved holds the raft slots of the shards a move changed (moves.go):
	// nil when none did, else moved[s] is zero for a shard never moved.
	moved []slotMap
}

// NewPlacement returns the placement that gives shard s to owners[s] ("" for
// none), each shard's replica set being its owner alone. It copies owners.
func NewPlacement(owners ...string) Placement {
	return Placement{owners: slices.Clone(owners)}
}

// Len returns the number of shards p has an entry for, placed or not.
func (p Placement) Len() int { return len(p.owners) }

// Owner returns the node owning shard, or "" when the shard has no owner
// or p has no such shard.
func (p Placement) Owner(shard int) string {
	if shard < 0 || shard >= len(p.owners) {
		return ""
	}
	return p.owners[shard]
}

// NewReplicatedPlacement returns the placement that gives shard s the
// replica set sets[s], owner first (empty for none). It copies sets, and
// returns the same Placement as [NewPlacement] when no set has more than
// one node.
func NewReplicatedPlacement(sets ...[]string) Placement {
	owners := make([]string, len(sets))
	multi := false
	for s, set := range sets {
		if len(set) > 0 {
			owners[s] = set[0]
		}
		multi = multi || len(set) > 1
	}
	if !multi {
		return Placement{owners: owners}
	}
	cp := make([][]string, len(sets))
	for s, set := range sets {
		if len(set) > 0 && set[0] != "" {
			cp[s] = slices.Clone(set)
		}
	}
	return Placement{owners: owners, sets: cp}
}

// Replicas returns the replica set of shard, owner (the preferred leader)
// first: the owner alone for replication factor 1. It is empty when the
// shard has no owner or p has no such shard. The slice is p's own: read
// it, never modify it.
func (p Placement) Replicas(shard int) []string {
	if p.Owner(shard) == "" {
		return nil
	}
	if p.sets != nil {
		return slices.Clip(p.sets[shard])
	}
	return p.owners[shard : shard+1 : shard+1]
}

// IsReplica reports whether node holds a replica of shard.
func (p Placement) IsReplica(shard int, node string) bool {
	return node != "" && slices.Contains(p.Replicas(shard), node)
}

// ReplicatedBy returns the shards of which node holds a replica, owner or
// not, in order.
func (p Placement) ReplicatedBy(node string) []int {
	if p.sets == nil {
		return p.OwnedBy(node)
	}
	var out []int
	for shard, set := range p.sets {
		if slices.Contains(set, node) {
			out = append(out, shard)
		}
	}
	return out
}

// All yields each shard of p, in order, with its owner ("" for none).
func (p Placement) All() iter.Seq2[int, string] {
	return func(yield func(int, string) bool) {
		for shard, owner := range p.owners {
			if !yield(shard, owner) {
				return
			}
		}
	}
}

// OwnedBy returns the shards node owns, in order.
func (p Placement) OwnedBy(node string) []int {
	var out []int
	for shard, owner := range p.owners {
		if owner == node {
			out = append(out, shard)
		}
	}
	return out
}

// Equal reports whether p and q place every shard on the same nodes, in
// the same raft slots.
func (p Placement) Equal(q Placement) bool {
	return slices.Equal(p.owners, q.owners) && slices.EqualFunc(p.sets, q.sets, slices.Equal) &&
		slices.EqualFunc(p.moved, q.moved, slotMap.equal)
}

// IsZero reports whether p places no shard (for the omitzero JSON option).
func (p Placement) IsZero() bool { return len(p.owners) == 0 }

// String formats p as the list of owners of its shards, in shard order, or
// of their replica sets when they have more than one node.
func (p Placement) String() string {
	if p.sets != nil {
		return fmt.Sprint(p.sets)
	}
	return fmt.Sprint(p.owners)
}

// Assign returns the rendezvous placement of the shards of stream among
// nodeIDs: each shard's owner is [Owner]; every owner is "" when nodeIDs is
// empty.
func Assign(stream string, shards int, nodeIDs []string) Placement {
	owners := make([]string, shards)
	for shard := range shards {
		owners[shard] = Owner(stream, shard, nodeIDs)
	}
	return Placement{owners: owners}
}

// Place returns prev completed for the shards of stream among nodeIDs,
// which must be sorted: a shard whose owner in prev is among nodeIDs keeps
// it, and any other shard (no owner yet, or an owner no longer a member)
// is placed as [Assign] would. With no nodeIDs, every shard has owner ""
// unless prev already has an entry for each shard, which it then keeps.
// Place returns prev itself when it changes nothing, and never modifies it.
//
// This is the control plane's rule (see package ctl): a shard is placed
// once, and a node that joins later takes no shard that has an owner.
func Place(stream string, shards int, nodeIDs []string, prev Placement) Placement {
	if len(nodeIDs) == 0 {
		if prev.Len() != shards {
			return Placement{owners: make([]string, shards)}
		}
		return prev
	}
	var owners []string
	for shard := range shards {
		if o := prev.Owner(shard); o != "" {
			if _, member := slices.BinarySearch(nodeIDs, o); member {
				continue
			}
		}
		if owners == nil {
			owners = make([]string, shards)
			copy(owners, prev.owners)
		}
		owners[shard] = Owner(stream, shard, nodeIDs)
	}
	if owners == nil {
		return prev
	}
	return Placement{owners: owners}
}

// Top returns the r nodes among nodeIDs with the highest rendezvous
// weights for shard of stream, highest first (the first is [Owner]), or
// nil when nodeIDs has fewer than r nodes.
func Top(stream string, shard, r int, nodeIDs []string) []string {
	if r < 1 || len(nodeIDs) < r {
		return nil
	}
	type weighted struct {
		id string
		w  uint64
	}
	ws := make([]weighted, len(nodeIDs))
	for i, id := range nodeIDs {
		ws[i] = weighted{id, weight(stream, shard, id)}
	}
	slices.SortFunc(ws, func(a, b weighted) int {
		switch {
		case a.w > b.w:
			return -1
		case a.w < b.w:
			return 1
		}
		return compareStrings(a.id, b.id)
	})
	out := make([]string, r)
	for i := range out {
		out[i] = ws[i].id
	}
	return out
}

// PlaceReplicas is [Place] for a stream of replication factor r: with r
// <= 1 it is Place; otherwise a shard that has a replica set in prev keeps
// it (the voters of a raft group are fixed at its creation: a replica set
// is never changed here, even when a member leaves), and any other shard
// gets the top r nodes of nodeIDs ([Top]), or stays unplaced while there
// are fewer than r. nodeIDs must be sorted. It returns prev itself when it
// changes nothing, and never modifies it.
func PlaceReplicas(stream string, shards, r int, nodeIDs []string, prev Placement) Placement {
	if r <= 1 {
		return Place(stream, shards, nodeIDs, prev)
	}
	var sets [][]string
	for shard := range shards {
		if len(prev.Replicas(shard)) > 0 {
			continue
		}
		top := Top(stream, shard, r, nodeIDs)
		if top == nil && prev.Len() == shards {
			continue
		}
		if sets == nil {
			sets = make([][]string, shards)
			for s := range min(shards, prev.Len()) {
				sets[s] = prev.Replicas(s)
			}
		}
		sets[shard] = top
	}
	if sets == nil {
		return prev
	}
	q := NewReplicatedPlacement(sets...)
	if prev.moved != nil {
		q.moved = prev.moved[:min(shards, prev.Len())]
		q.moved = append(slices.Clone(q.moved), make([]slotMap, shards-len(q.moved))...)
	}
	return q
}

// EncodeMsgpack writes p as the array of its shards' owners, or of their
// replica sets when one has more than one node, or, once a move changed a
// shard's raft slots, as a map of the replica sets and the slots
// (encodeMoved).
func (p Placement) EncodeMsgpack(enc *msgpack.Encoder) error {
	if p.moved != nil {
		return enc.Encode(p.movedWire())
	}
	if p.sets != nil {
		return enc.Encode(p.sets)
	}
	return enc.Encode(p.owners)
}

// DecodeMsgpack reads the array EncodeMsgpack writes: each element the
// owner of a shard (a string), or its replica set (an array of strings).
// A replica set with an empty or repeated node is refused.
func (p *Placement) DecodeMsgpack(dec *msgpack.Decoder) error {
	if c, err := dec.PeekCode(); err == nil && (msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32) {
		var w movedPlacement
		if err := dec.Decode(&w); err != nil {
			return fmt.Errorf("shardmap: decode placement: %w", err)
		}
		return p.setMoved(w)
	}
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return fmt.Errorf("shardmap: decode placement: %w", err)
	}
	if n < 0 {
		*p = Placement{}
		return nil
	}
	sets := make([][]string, 0, min(n, MaxShards))
	multi := false
	for range n {
		c, err := dec.PeekCode()
		if err != nil {
			return fmt.Errorf("shardmap: decode placement: %w", err)
		}
		if msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32 {
			var set []string
			if err := dec.Decode(&set); err != nil {
				return fmt.Errorf("shardmap: decode placement: %w", err)
			}
			multi = true
			sets = append(sets, set)
			continue
		}
		owner, err := dec.DecodeString()
		if err != nil {
			return fmt.Errorf("shardmap: decode placement: %w", err)
		}
		sets = append(sets, oneSet(owner))
	}
	return p.setFrom(sets, multi)
}

func oneSet(owner string) []string {
	if owner == "" {
		return nil
	}
	return []string{owner}
}

// setFrom makes p the placement of sets after checking them; multi says
// they were encoded as replica sets, which keeps an owner-only encoding
// and a replica-set one apart.
func (p *Placement) setFrom(sets [][]string, multi bool) error {
	for s, set := range sets {
		for i, n := range set {
			if n == "" || slices.Contains(set[:i], n) {
				return fmt.Errorf("shardmap: decode placement: shard %d: replica set %q has an empty or repeated node", s, set)
			}
		}
	}
	q := NewReplicatedPlacement(sets...)
	if multi && q.sets == nil && len(sets) > 0 {
		q.sets = sets // replica sets of one node each, as encoded
	}
	*p = q
	return nil
}

// MarshalJSON writes p as the JSON array of its shards' owners, or of
// their replica sets when one has more than one node.
func (p Placement) MarshalJSON() ([]byte, error) {
	if p.moved != nil {
		return json.Marshal(p.movedWire())
	}
	if p.sets != nil {
		return json.Marshal(p.sets)
	}
	return json.Marshal(p.owners)
}

// UnmarshalJSON reads the array MarshalJSON writes (null is the zero
// Placement).
func (p *Placement) UnmarshalJSON(b []byte) error {
	if t := bytes.TrimSpace(b); len(t) > 0 && t[0] == '{' {
		var w movedPlacement
		if err := json.Unmarshal(t, &w); err != nil {
			return fmt.Errorf("shardmap: decode placement: %w", err)
		}
		return p.setMoved(w)
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(b, &elems); err != nil {
		return fmt.Errorf("shardmap: decode placement: %w", err)
	}
	if elems == nil {
		*p = Placement{}
		return nil
	}
	sets := make([][]string, 0, len(elems))
	multi := false
	for _, e := range elems {
		if t := bytes.TrimSpace(e); len(t) > 0 && t[0] == '[' {
			var set []string
			if err := json.Unmarshal(t, &set); err != nil {
				return fmt.Errorf("shardmap: decode placement: %w", err)
			}
			multi = true
			sets = append(sets, set)
			continue
		}
		var owner string
		if err := json.Unmarshal(e, &owner); err != nil {
			return fmt.Errorf("shardmap: decode placement: %w", err)
		}
		sets = append(sets, oneSet(owner))
	}
	return p.setFrom(sets, multi)
}
