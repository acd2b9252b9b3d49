package shardmap

import (
	"errors"
	"fmt"
	"slices"
)

// # Moving a replica
//
// A replicated shard's raft group names its members by slot: the broker
// package gives each replica a raft id that encodes a slot, and maps a
// slot to its node through the placement. At creation the slots are the
// replica set sorted by node id. A move ([Placement.Move]) gives one slot
// to another node: the node moved to takes the place of the node moved
// from, in the replica set (its order of preference included) and in the
// slot, and the slot is marked with the move's id (the control plane
// uses the epoch of the map that makes the move). The mark tells the node
// moved to that its replica is new and must be admitted into the group (a
// learner caught up from the leader, then a voter in the slot's place)
// rather than start as one of the voters the group was created with; and
// the id tells a replica of this move from data an earlier stay in the
// same slot left behind. The other slots keep their nodes, so the other
// replicas keep their raft ids.
//
// A move is pending until the node moved to has joined the group as a
// voter in the slot's place ([Placement.Settle], when it says so): while
// one is, no other slot of the shard moves (only the pending slot itself,
// to another node, should the node moved to be lost too), so that the
// group never has two slots whose old members it still counts while
// their brokers have dropped out of it. Nor does the pending slot move
// back to the move's source or to an earlier target of it (one replaced
// while pending, which may have become a voter before it was lost): the
// group may still count their copies, which their brokers would drop to
// join anew.
//
// A placement no move changed is encoded as before moves existed; one that
// a move changed is encoded as a map (movedPlacement), which versions
// without moves refuse to decode rather than misread.

// ErrBadMove is matched by the errors of [Placement.Move].
var ErrBadMove = errors.New("shardmap: invalid replica move")

// slotMap is the raft slots of one shard a move changed: nodes[i] is the
// node in slot i; moves[i] is the id of the move that put it there, 0 for
// a node the group was created with. The zero slotMap is a shard no move
// changed.
type slotMap struct {
	nodes   []string
	moves   []uint64
	pending uint64 // the id of the move not yet settled, 0 for none
	// pendingFrom is the node the pending move moved from: the group may
	// still count its copy, so the slot never moves back to it before the
	// move settles (its broker would remove that copy to join anew).
	pendingFrom string
	// pendingAlso are the earlier targets of the pending move, each
	// replaced while its move was pending (its node lost too): each may
	// have become a voter in the slot's place, and the group may count
	// its copy as well, so the slot never moves back to one of them
	// either before the move settles.
	pendingAlso []string
}

func (a slotMap) equal(b slotMap) bool {
	return slices.Equal(a.nodes, b.nodes) && slices.Equal(a.moves, b.moves) && a.pending == b.pending && a.pendingFrom == b.pendingFrom &&
		slices.Equal(a.pendingAlso, b.pendingAlso)
}

// maxPendingAlso bounds the earlier targets of one pending move, as
// decoded.
const maxPendingAlso = 64

// maxSlots is the most replicas a moved shard may have.
const maxSlots = 8

// HasMoves reports whether a move changed any shard's slots in p.
func (p Placement) HasMoves() bool { return p.moved != nil }

// Slots returns the node in each raft slot of shard: its replica set
// sorted by node id unless a move changed it. It returns a new slice
// (empty for an unplaced or unknown shard).
func (p Placement) Slots(shard int) []string {
	set := p.Replicas(shard)
	if len(set) == 0 {
		return nil
	}
	if shard < len(p.moved) && p.moved[shard].nodes != nil {
		return slices.Clone(p.moved[shard].nodes)
	}
	nodes := slices.Clone(set)
	slices.Sort(nodes)
	return nodes
}

// Joined reports whether node holds its replica of shard by a move: its
// replica started empty and joined a running group, rather than being one
// of the replicas the group was created with.
func (p Placement) Joined(shard int, node string) bool { return p.MoveID(shard, node) != 0 }

// MoveID returns the id of the move that gave node its replica of shard,
// 0 if none did.
func (p Placement) MoveID(shard int, node string) uint64 {
	if shard < 0 || shard >= len(p.moved) || node == "" {
		return 0
	}
	if i := slices.Index(p.moved[shard].nodes, node); i >= 0 {
		return p.moved[shard].moves[i]
	}
	return 0
}

// Pending returns the node and id of shard's move not yet settled, "" and
// 0 if none.
func (p Placement) Pending(shard int) (node string, id uint64) {
	if shard < 0 || shard >= len(p.moved) || p.moved[shard].pending == 0 {
		return "", 0
	}
	m := p.moved[shard]
	return m.nodes[slices.Index(m.moves, m.pending)], m.pending
}

// MayMoveTo reports whether a move of shard's pending slot (or, with no
// move pending, of any slot) may go to node, as far as the pending move
// is concerned: not back to its source nor to an earlier target of it
// (PendingFrom; see Move). It does not check node's other replicas.
func (p Placement) MayMoveTo(shard int, node string) bool { return !p.PendingFrom(shard, node) }

// PendingFrom reports whether shard's pending move is from node: node is
// its source, or an earlier target of it (replaced while the move was
// pending). Until the move settles, the group may still count node's
// copy of the shard.
func (p Placement) PendingFrom(shard int, node string) bool {
	if shard < 0 || shard >= len(p.moved) || p.moved[shard].pending == 0 || node == "" {
		return false
	}
	m := p.moved[shard]
	return node == m.pendingFrom || slices.Contains(m.pendingAlso, node)
}

// Settle returns p with shard's pending move id settled: its node is a
// voter in its slot's place. It returns p itself, unchanged, when id is
// not the pending move (settled already, or replaced by a later move).
func (p Placement) Settle(shard int, id uint64) Placement {
	if _, pending := p.Pending(shard); id == 0 || pending != id {
		return p
	}
	q := p
	q.moved = slices.Clone(p.moved)
	q.moved[shard].pending, q.moved[shard].pendingFrom, q.moved[shard].pendingAlso = 0, "", nil
	return q
}

// Move returns p with from's replica of shard given to to: to takes from's
// place in the replica set and in its raft slot, which is marked with id
// (not 0; unique among the moves of the shard: the control plane gives
// the epoch of the map that makes the move), pending until settled.
// It refuses (ErrBadMove) a shard that is not replicated (a log of
// replication factor 1 would have to be copied), a from that holds no
// replica of it, a to that already holds one, and a move while another
// slot's is pending. p is not modified.
func (p Placement) Move(shard int, from, to string, id uint64) (Placement, error) {
	set := p.Replicas(shard)
	pendingNode, _ := p.Pending(shard)
	switch {
	case pendingNode != "" && pendingNode != from:
		return p, fmt.Errorf("%w: shard %d: the move of a replica to %s is under way (not yet a voter): one move at a time per shard", ErrBadMove, shard, pendingNode)
	case pendingNode != "" && to == p.moved[shard].pendingFrom:
		return p, fmt.Errorf("%w: shard %d: %s is where the move under way came from, and the group may still count its copy, which a move back would replace: move the replica elsewhere, or wait until the move settles", ErrBadMove, shard, to)
	case pendingNode != "" && slices.Contains(p.moved[shard].pendingAlso, to):
		return p, fmt.Errorf("%w: shard %d: %s was an earlier target of the move under way, and the group may still count its copy, which a move back would replace: move the replica elsewhere, or wait until the move settles", ErrBadMove, shard, to)
	case pendingNode != "" && len(p.moved[shard].pendingAlso) >= maxPendingAlso:
		return p, fmt.Errorf("%w: shard %d: the move under way was retargeted %d times: wait until it settles", ErrBadMove, shard, maxPendingAlso)
	case id == 0:
		return p, fmt.Errorf("%w: move shard %d: move id 0", ErrBadMove, shard)
	case len(set) < 2:
		return p, fmt.Errorf("%w: shard %d has %d replica(s); only a replicated shard's replicas move", ErrBadMove, shard, len(set))
	case to == "" || from == to:
		return p, fmt.Errorf("%w: move shard %d from %q to %q: name another node to move to", ErrBadMove, shard, from, to)
	case !slices.Contains(set, from):
		return p, fmt.Errorf("%w: %s holds no replica of shard %d (replicas %v)", ErrBadMove, from, shard, set)
	case slices.Contains(set, to):
		return p, fmt.Errorf("%w: %s already holds a replica of shard %d (replicas %v)", ErrBadMove, to, shard, set)
	}
	slots := p.Slots(shard)
	moves := make([]uint64, len(slots))
	if shard < len(p.moved) && p.moved[shard].moves != nil {
		copy(moves, p.moved[shard].moves)
	}
	i := slices.Index(slots, from)
	slots[i], moves[i] = to, id

	q := Placement{owners: slices.Clone(p.owners), sets: make([][]string, len(p.sets))}
	for s, set := range p.sets {
		q.sets[s] = slices.Clone(set)
	}
	q.sets[shard][slices.Index(set, from)] = to
	q.owners[shard] = q.sets[shard][0]
	q.moved = slices.Clone(p.moved)
	if q.moved == nil {
		q.moved = make([]slotMap, len(p.owners))
	}
	source, also := from, []string(nil)
	if pendingNode != "" {
		// A pending move's target lost too: its source may still count,
		// and so may the target it replaces.
		source, also = p.moved[shard].pendingFrom, append(slices.Clone(p.moved[shard].pendingAlso), from)
	}
	q.moved[shard] = slotMap{nodes: slots, moves: moves, pending: id, pendingFrom: source, pendingAlso: also}
	return q, nil
}

// movedPlacement is a Placement a move changed, as encoded: the replica
// sets, and for each shard its slots and their move ids (both empty for a
// shard no move changed).
type movedPlacement struct {
	Sets    [][]string `msgpack:"sets" json:"sets"`
	Slots   [][]string `msgpack:"slots" json:"slots"`
	Moves   [][]uint64 `msgpack:"moves" json:"moves"`
	Pending []uint64   `msgpack:"pending" json:"pending"`
	// PendingFrom is each pending move's source ("" for none).
	PendingFrom []string `msgpack:"pending_from" json:"pending_from"`
	// PendingAlso is each pending move's earlier targets (see
	// slotMap.pendingAlso); omitted when no shard has any, and skipped
	// by a decoder of an earlier version.
	PendingAlso [][]string `msgpack:"pending_also,omitempty" json:"pending_also,omitempty"`
}

func (p Placement) movedWire() movedPlacement {
	w := movedPlacement{Sets: p.sets, Slots: make([][]string, len(p.moved)), Moves: make([][]uint64, len(p.moved)), Pending: make([]uint64, len(p.moved)), PendingFrom: make([]string, len(p.moved))}
	if w.Sets == nil {
		w.Sets = make([][]string, len(p.owners))
		for s := range w.Sets {
			w.Sets[s] = p.Replicas(s)
		}
	}
	for s, m := range p.moved {
		w.Slots[s], w.Moves[s], w.Pending[s], w.PendingFrom[s] = m.nodes, m.moves, m.pending, m.pendingFrom
		if len(m.pendingAlso) > 0 {
			if w.PendingAlso == nil {
				w.PendingAlso = make([][]string, len(p.moved))
			}
			w.PendingAlso[s] = m.pendingAlso
		}
	}
	return w
}

// setMoved makes p the placement w encodes, after checking that each
// shard's slots, where given, hold its replica set's nodes.
func (p *Placement) setMoved(w movedPlacement) error {
	if len(w.Slots) != len(w.Sets) || len(w.Moves) != len(w.Sets) || len(w.Pending) != len(w.Sets) || len(w.PendingFrom) != len(w.Sets) ||
		w.PendingAlso != nil && len(w.PendingAlso) != len(w.Sets) {
		return fmt.Errorf("shardmap: decode placement: %d replica sets, %d slot lists, %d move lists, %d pending, %d pending sources, %d lists of earlier targets",
			len(w.Sets), len(w.Slots), len(w.Moves), len(w.Pending), len(w.PendingFrom), len(w.PendingAlso))
	}
	if err := p.setFrom(w.Sets, true); err != nil {
		return err
	}
	moved := make([]slotMap, len(w.Sets))
	for s, slots := range w.Slots {
		var also []string
		if w.PendingAlso != nil {
			also = w.PendingAlso[s]
		}
		if len(also) > 0 && (w.Pending[s] == 0 || len(also) > maxPendingAlso || slices.Contains(also, "")) {
			return fmt.Errorf("shardmap: decode placement: shard %d: earlier targets %q of pending move %d", s, also, w.Pending[s])
		}
		if len(slots) == 0 {
			if len(w.Moves[s]) != 0 || w.Pending[s] != 0 || w.PendingFrom[s] != "" {
				return fmt.Errorf("shardmap: decode placement: shard %d: move ids but no slots", s)
			}
			continue
		}
		set := p.Replicas(s)
		if len(slots) != len(set) || len(slots) > maxSlots || len(w.Moves[s]) != len(slots) {
			return fmt.Errorf("shardmap: decode placement: shard %d: slots %q (move ids %v) do not fit replica set %q", s, slots, w.Moves[s], set)
		}
		for i, n := range slots {
			if !slices.Contains(set, n) || slices.Contains(slots[:i], n) {
				return fmt.Errorf("shardmap: decode placement: shard %d: slot node %q is not in replica set %q or is repeated", s, n, set)
			}
		}
		if w.Pending[s] != 0 && !slices.Contains(w.Moves[s], w.Pending[s]) {
			return fmt.Errorf("shardmap: decode placement: shard %d: pending move %d is none of its slots' (%v)", s, w.Pending[s], w.Moves[s])
		}
		if (w.Pending[s] == 0) != (w.PendingFrom[s] == "") {
			return fmt.Errorf("shardmap: decode placement: shard %d: pending move %d from %q", s, w.Pending[s], w.PendingFrom[s])
		}
		moved[s] = slotMap{nodes: slices.Clone(slots), moves: slices.Clone(w.Moves[s]), pending: w.Pending[s], pendingFrom: w.PendingFrom[s]}
		if len(also) > 0 {
			moved[s].pendingAlso = slices.Clone(also)
		}
	}
	p.moved = moved
	return nil
}
