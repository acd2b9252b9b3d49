package ctl

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// # Removing a member
//
// A member stays one when it goes down, with its shards, for it may come
// back. One lost for good is removed by an operator (cluster.remove),
// once it is down and holds nothing: its replicas of replicated shards
// moved to other brokers first (stream.move, which `felixctl cluster
// drain` makes for each of them). A member that still owns a shard of a
// stream of replication factor 1 cannot be removed: placement would give
// the shard to another member with an empty log (shardmap.Place places a
// shard whose owner is not a member anew), forking its offsets. So with
// every refusal passed no placed shard names the member, and removing it
// changes no placement: the map of the next epoch differs from the last
// only in its node list (removeMember checks this too, and refuses rather
// than re-place a shard).
//
// Nor is a member removed while a move of a replica from it is pending
// (shardmap.Placement.PendingFrom: it is the move's source, or an earlier
// target replaced while the move was pending): until the move's new
// replica is a voter in its place and says so (the move settles), the
// shard's raft group may still count the member's copy, which its broker
// keeps until then (package broker). Removing it then would tell the
// operator that its disk may go while the shard may still need it, and
// leave the pending move naming a broker the cluster no longer knows.
// The refusal (*MovesPendingError) names the moves; the operator waits
// until they settle (felixctl stream move and cluster drain follow them
// until they do), or, should a new replica's broker be lost too, moves
// that replica on. A move cannot be cancelled.
//
// A removed member's liveness leaves nothing behind that could bring it
// back: it is removed only while down, so it has no live/ key and no
// registration the leader counts (the end of one it had is ignored, as
// the end of any registration that is not current). Should the broker
// start again, it registers as any new broker does: a new member, holding
// no shard until streams are created or replicas moved to it.

// removeMember removes member id from the cluster. It refuses
// (ErrInvalid) an id that is not a member, a member that is live (held
// live after a takeover included), one that owns a shard of a stream of
// replication factor 1, one that holds a replica of a shard of a
// replicated stream, and (*MovesPendingError) one that a move not yet
// settled is from. Removing it changes no stream's placement.
func (s *state) removeMember(id string) error {
	if id == "" {
		return fmt.Errorf("%w: remove a broker: name the broker to remove", ErrInvalid)
	}
	m, ok := s.members[id]
	switch {
	case !ok:
		return fmt.Errorf("%w: remove %s: %s is not a member of the cluster (members: %s)",
			ErrInvalid, id, id, orNone(slices.Sorted(maps.Keys(s.members))))
	case m.node.Live && m.session == 0:
		return fmt.Errorf("%w: remove %s: %s is live: the ctl leader that took over holds it live until it registers again or the takeover's registration grace ends; "+
			"if it is stopped, remove it once the grace is over and it is down", ErrInvalid, id, id)
	case m.node.Live:
		return fmt.Errorf("%w: remove %s: %s is live: stop it first (a live broker registers again at once)", ErrInvalid, id, id)
	}
	var owned, held []shardmap.ShardID
	var pending []PendingMove
	for _, name := range slices.Sorted(maps.Keys(s.streams)) {
		st := s.streams[name]
		for shard := range st.Placement.Len() {
			if st.Placement.PendingFrom(shard, id) {
				to, move := st.Placement.Pending(shard)
				pending = append(pending, PendingMove{Shard: shardmap.ShardID{Stream: name, Shard: shard}, To: to, ID: move})
			}
			switch {
			case !st.Placement.IsReplica(shard, id):
			case st.Factor() == 1:
				owned = append(owned, shardmap.ShardID{Stream: name, Shard: shard})
			default:
				held = append(held, shardmap.ShardID{Stream: name, Shard: shard})
			}
		}
	}
	if len(owned) > 0 {
		return fmt.Errorf("%w: remove %s: it owns %s of streams of replication factor 1 (%s): "+
			"its shards would be placed anew on other brokers with empty logs, forking their offsets; bring %s back to serve them, or delete those streams first",
			ErrInvalid, id, shardCount(len(owned)), firstShards(owned), id)
	}
	if len(held) > 0 {
		return fmt.Errorf("%w: remove %s: it holds replicas of %s of replicated streams (%s): move them first: felixctl cluster drain %s",
			ErrInvalid, id, shardCount(len(held)), firstShards(held), id)
	}
	if len(pending) > 0 {
		return &MovesPendingError{Node: id, Moves: pending}
	}
	// With the refusals above no placed shard names id; make sure
	// nothing would be placed anew all the same.
	ids := slices.DeleteFunc(slices.Sorted(maps.Keys(s.members)), func(m string) bool { return m == id })
	for _, name := range slices.Sorted(maps.Keys(s.streams)) {
		st := s.streams[name]
		if p := s.place(st, ids).Placement; !p.Equal(st.Placement) {
			return fmt.Errorf("ctl: remove %s: refused: it would change the placement of stream %q from %v to %v", id, name, st.Placement, p)
		}
	}
	delete(s.members, id)
	s.bump()
	return nil
}

// firstShards lists the first few of ids, and how many more there are.
func firstShards(ids []shardmap.ShardID) string {
	return firstFew(ids, shardmap.ShardID.String)
}

// firstFew lists the first few of xs, each as name says, and how many
// more there are.
func firstFew[T any](xs []T, name func(T) string) string {
	const few = 5
	var names []string
	for _, x := range xs[:min(len(xs), few)] {
		names = append(names, name(x))
	}
	out := strings.Join(names, ", ")
	if len(xs) > few {
		out += fmt.Sprintf(" and %d more", len(xs)-few)
	}
	return out
}

// MovesPendingError is the error of a removal refused because moves of
// replicas from the member are pending: their new replicas are not yet
// voters in its place, and until they are the shards' raft groups may
// still count its copies (see "Removing a member" in remove.go). It
// matches ErrInvalid; on the wire it is CodeInvalid, with the message.
type MovesPendingError struct {
	// Node is the member whose removal was refused.
	Node string
	// Moves are the pending moves from it, by stream and shard.
	Moves []PendingMove
}

// PendingMove is a replica move not yet settled.
type PendingMove struct {
	Shard shardmap.ShardID
	// To is the broker the replica moves to; its replica is not yet a
	// voter of the shard's group (or has not yet said so).
	To string
	// ID is the move's id: the epoch of the map that made it.
	ID uint64
}

func (e *MovesPendingError) Error() string {
	first := e.Moves[0]
	what := fmt.Sprintf("the move of its replica of %s is not yet settled (%s's replica is not yet a voter in %s's place): until it settles, the shard's raft group",
		first, first.To, e.Node)
	wait, info := "it settles", fmt.Sprintf("felixctl stream info %s shows %s [moving in]", first.Shard.Stream, first.To)
	if len(e.Moves) > 1 {
		what = fmt.Sprintf("the moves of its replicas of %s are not yet settled (%s; the new replicas are not yet voters in %s's place): until each settles, its shard's raft group",
			shardCount(len(e.Moves)), firstFew(e.Moves, PendingMove.String), e.Node)
		wait, info = "they settle", "felixctl stream info STREAM shows a new replica [moving in]"
	}
	return fmt.Sprintf("%v: remove %s: %s may still count %s's copy, which its broker keeps until then. "+
		"Wait until %s, then remove %s: %s until then (felixctl stream move and felixctl cluster drain follow a move until it settles). "+
		"Should a new replica's broker be lost too, move that replica on (felixctl stream move %s --shard %d --from %s); a move cannot be cancelled",
		ErrInvalid, e.Node, what, e.Node, wait, e.Node, info, first.Shard.Stream, first.Shard.Shard, first.To)
}

// Unwrap makes the error match ErrInvalid.
func (e *MovesPendingError) Unwrap() error { return ErrInvalid }

// String says "stream/shard to node".
func (m PendingMove) String() string { return m.Shard.String() + " to " + m.To }

// RemoveBroker removes the broker id from the cluster's members, persists
// that and pushes the new map, which no longer lists it. It is for a
// broker lost for good, once its replicas have moved to other brokers
// ([Server.MoveReplica]) and those moves have settled: it must be down
// and hold nothing, or it is refused with an error that says why (a
// *MovesPendingError for moves not yet settled). Removing it changes no
// shard's placement. Should the broker come back, it registers as a new
// member.
// Errors are *transport.Error values (CodeInvalid, CodeInternal) that
// also match ErrInvalid. On a follower the change is made by the leader.
func (s *Server) RemoveBroker(id string) error {
	return s.removeBroker(origin{principal: ctlPrincipal}, id)
}

func (s *Server) removeBroker(o origin, id string) error {
	req := &transport.Request{Op: OpClusterRemove, NodeID: id, Principal: o.principal, ID: o.id}
	err := s.change("broker removed", req, func(st *state) error { return st.removeMember(id) })
	if err != nil {
		return err
	}
	s.log.Info("broker removed", "node", id, "epoch", s.Map().Epoch)
	return nil
}
