package shardmap

import (
	"encoding/json"
	"fmt"
	"iter"
	"slices"

	"github.com/vmihailenco/msgpack/v5"
)

// Placement says where the shards of one stream live: for each shard, its
// replica set, owner first. The owner is the node that takes the shard's
// writes and answers for it; the other replicas, once streams are
// replicated, follow it. Today every stream has one replica per shard, so
// a shard's replica set is its owner alone.
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
// On the wire (msgpack) and in JSON a Placement is the list of the owners
// of shards 0, 1, …, as the owners field of earlier versions was, so maps
// and stored state of those versions read as they were.
type Placement struct {
	// owners[s] is the node owning shard s, "" while it has none.
	owners []string
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

// Replicas returns the replica set of shard, owner first: one node today.
// It is empty when the shard has no owner or p has no such shard. The
// slice is p's own: read it, never modify it.
func (p Placement) Replicas(shard int) []string {
	if p.Owner(shard) == "" {
		return nil
	}
	return p.owners[shard : shard+1 : shard+1]
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

// Equal reports whether p and q place every shard on the same nodes.
func (p Placement) Equal(q Placement) bool { return slices.Equal(p.owners, q.owners) }

// IsZero reports whether p places no shard (for the omitzero JSON option).
func (p Placement) IsZero() bool { return len(p.owners) == 0 }

// String formats p as the list of owners of its shards, in shard order.
func (p Placement) String() string { return fmt.Sprint(p.owners) }

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

// EncodeMsgpack writes p as the array of its shards' owners.
func (p Placement) EncodeMsgpack(enc *msgpack.Encoder) error { return enc.Encode(p.owners) }

// DecodeMsgpack reads the array EncodeMsgpack writes.
func (p *Placement) DecodeMsgpack(dec *msgpack.Decoder) error {
	var owners []string
	if err := dec.Decode(&owners); err != nil {
		return fmt.Errorf("shardmap: decode placement: %w", err)
	}
	p.owners = owners
	return nil
}

// MarshalJSON writes p as the JSON array of its shards' owners.
func (p Placement) MarshalJSON() ([]byte, error) { return json.Marshal(p.owners) }

// UnmarshalJSON reads the array MarshalJSON writes (null is the zero
// Placement).
func (p *Placement) UnmarshalJSON(b []byte) error {
	var owners []string
	if err := json.Unmarshal(b, &owners); err != nil {
		return fmt.Errorf("shardmap: decode placement: %w", err)
	}
	p.owners = owners
	return nil
}
