package broker

// # A replica moved to another broker
//
// The control plane moves a replica of a replicated shard from a broker
// that is down (lost for good, or being retired) to another
// (shardmap.Placement.Move): the broker moved to takes the raft slot of
// the broker moved from, and the slot is marked joined. What each broker
// does with the map that says so:
//
//   - Every broker hosting a replica of the shard maps the slot to its new
//     node (raftSlots.update): raft messages in the slot's name are taken
//     from, and sent to, the new node only, so the old replica, should it
//     still run, is cut off from the group.
//   - The broker moved to opens an empty replica under a new raft id in
//     the slot and joins, as a replica that lost its log does (rejoin.go):
//     the leader admits it as a learner, sends it the log (or a snapshot),
//     and once it holds every committed entry makes it a voter in place of
//     the slot's old member by one joint configuration change. The leader
//     admits only the node the map puts in the slot (serveAdmit).
//   - The broker moved to, once its replica is a voter in the slot's
//     place, tells the control plane (opReplicaSettled) until the map
//     shows the move settled: only then may another replica of the shard
//     move (see package ctl).
//   - The broker moved from, when it runs again, closes its replica and,
//     once the map shows the move settled (the group no longer counts its
//     copy), removes its directory and its mark (removeMoved, then
//     removeKeptMoved for a copy kept while the move was pending): it
//     must never come back under its old raft id.
//
// The replica moved from drops out of the group as soon as the map
// changes, before the new one has caught up, so the group counts on its
// two other replicas meanwhile. That is why the control plane moves a
// replica only from a broker that is down, and only while the shard's
// other replicas are live and no other move of the shard is pending: the
// group already counts on the other two. Moving the replica of a live
// broker without first lowering redundancy (learner first, source
// removed last) is not done yet.
//
// A replica moved in keeps the move's id (shardmap.Placement.MoveID) in
// its directory (moveid), beside its raft id: a broker that finds, for a
// shard moved to it, a directory of another move (its replica moved away
// and back while it could not remove it) removes it and joins anew
// (openReplica), since the group replaced that replica's raft id.
//
// Removal happens when the map that moves a replica away is applied
// (retain closes the replica, then removeMoved), and, for a broker that
// was down then, in a sweep of the streams with moves on the first map
// applied after it starts (sweepMoved).

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// raftSlots is a hosted group's raft slots and preferred leader, as the
// newest map applied gives them: slot i holds nodes[i], whose replicas
// have raft ids slot+1+idSlots×k. The group's transport, its entry in
// raftNet and its shard entry share one, updated when a move changes the
// slots.
type raftSlots struct {
	p atomic.Pointer[slotsAt]
}

// slotsAt is the slots as of the map of epoch.
type slotsAt struct {
	epoch uint64
	nodes []string
	owner string
}

func newRaftSlots(epoch uint64, nodes []string, owner string) *raftSlots {
	s := &raftSlots{}
	s.p.Store(&slotsAt{epoch: epoch, nodes: nodes, owner: owner})
	return s
}

// update makes the slots those of the map of epoch, unless they are of a
// newer map already. It reports whether they changed.
func (s *raftSlots) update(epoch uint64, nodes []string, owner string) bool {
	for {
		cur := s.p.Load()
		if cur.epoch >= epoch {
			return false
		}
		next := &slotsAt{epoch: epoch, nodes: nodes, owner: owner}
		if slices.Equal(cur.nodes, nodes) && cur.owner == owner {
			next.nodes = cur.nodes
		}
		if s.p.CompareAndSwap(cur, next) {
			return !slices.Equal(cur.nodes, nodes) || cur.owner != owner
		}
	}
}

// nodes returns the node of each slot. The slice is shared: read only.
func (s *raftSlots) nodes() []string { return s.p.Load().nodes }

// owner returns the shard's preferred leader.
func (s *raftSlots) owner() string { return s.p.Load().owner }

// nodeOf returns the node of raft id, "" for none.
func (s *raftSlots) nodeOf(id uint64) string { return nodeOf(s.nodes(), id) }

// idOf returns the first raft id of node's slot, 0 if it has none.
func (s *raftSlots) idOf(node string) uint64 { return raftID(s.nodes(), node) }

// opReplicaSettled tells the control plane that a replica moved here is
// a voter (ctl.OpReplicaSettled, which only the broker moved to may send).
const opReplicaSettled = "replica.settled"

// moveIDFile holds, in the directory of a replica moved to this broker,
// the id of the move (shardmap.Placement.MoveID).
const moveIDFile = "moveid"

func readMoveID(dir string) (uint64, bool, error) { return readIDFile(dir, moveIDFile, "move id") }

func writeMoveID(dir string, id uint64) error { return writeIDFile(dir, moveIDFile, "move id", id) }

// updateSlots gives the open replicas of m's replicated streams the raft
// slots and owner m gives their shards. The caller holds s.mu.
func (s *shardSet) updateSlotsLocked(m *shardmap.Map) {
	for id, e := range s.mu.entries {
		if e.slots == nil || e.gone != nil {
			continue
		}
		st, ok := m.Stream(id.Stream)
		if !ok || !st.Placement.IsReplica(id.Shard, s.node) {
			continue
		}
		if e.slots.update(m.Epoch, st.Placement.Slots(id.Shard), st.Placement.Owner(id.Shard)) {
			s.logger.Info("replica set of a shard changed: a replica moved", "shard", id.String(),
				"replicas", st.Placement.Replicas(id.Shard), "epoch", m.Epoch)
		}
	}
}

// sweepMoved removes, once per run (on the first map applied), the
// directories of this broker's replicas that m moved to other brokers
// while it was down (see the top of this file): shards of m's replicated
// streams with a move, of which this broker holds no replica in m and no
// open entry, but a directory. Each stream's removals happen
// under its gate (shardSet.mu.removing), re-checked against the newest
// map, so that no open of the shard (moved back meanwhile) races them.
func (s *shardSet) sweepMoved(m *shardmap.Map, r *applyResult) {
	for i := range m.Streams {
		st := &m.Streams[i]
		if !st.Placement.HasMoves() || shardmap.ValidateStreamName(st.Name) != nil {
			continue
		}
		var gone []int
		for shard := range st.Placement.Len() {
			if st.Placement.IsReplica(shard, s.node) {
				continue
			}
			if _, err := s.root.Lstat(filepath.Join(st.Name, strconv.Itoa(shard))); err == nil {
				gone = append(gone, shard)
			}
		}
		if len(gone) > 0 {
			s.removeMoved(st.Name, gone, r)
		}
	}
}

// removeMoved removes the directories of stream's shards gone, moved
// away, under the stream's gate, waiting for it if another holds it.
func (s *shardSet) removeMoved(stream string, gone []int, r *applyResult) {
	s.mu.Lock()
	for held := s.mu.removing[stream]; held != nil; held = s.mu.removing[stream] {
		// A claim, a set-aside or a removal under way: none of them
		// waits for an apply, so wait for it.
		s.mu.Unlock()
		<-held
		s.mu.Lock()
	}
	ch := make(chan struct{})
	s.mu.removing[stream] = ch
	latest := s.mu.latest
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.mu.removing, stream)
		s.mu.Unlock()
		close(ch)
	}()
	st, ok := latest.Stream(stream)
	if !ok {
		return // deleted meanwhile: retain removes it whole
	}
	if have, marked, err := s.createdMark(stream); err != nil || marked && st.Created != 0 && have != st.Created {
		// Data of another stream of the name than this map's (a later
		// one the map does not know yet, or an earlier one claimDir and
		// retain remove whole): not this map's moves to apply to it.
		return
	}
	for _, shard := range gone {
		id := shardmap.ShardID{Stream: stream, Shard: shard}
		s.mu.RLock()
		open := s.mu.entries[id] != nil
		s.mu.RUnlock()
		if open || st.Placement.IsReplica(shard, s.node) {
			continue // moved back, or not yet closed
		}
		if n, _ := st.Placement.Pending(shard); n != "" {
			// Until the move settles (its target a voter in the slot's
			// place) the group may still count this copy: keep it,
			// closed, and remove it on a map that shows it settled.
			s.mu.Lock()
			s.mu.keptMoved[id] = struct{}{}
			s.mu.Unlock()
			continue
		}
		forget := func() {
			s.mu.Lock()
			delete(s.mu.keptMoved, id)
			s.mu.Unlock()
		}
		if dir := filepath.Join(s.root.Name(), stream, strconv.Itoa(shard)); movedInAfter(dir, latest.Epoch) {
			// Moved here by a map newer than this one (or its move id is
			// unreadable): not this map's to judge; the next start's sweep
			// looks again.
			forget()
			continue
		}
		if err := s.removeShardDir(id, latest.Epoch); err != nil {
			r.deleteErr = append(r.deleteErr, err)
			s.mu.Lock()
			s.mu.keptMoved[id] = struct{}{} // the next map tries again
			s.mu.Unlock()
			continue
		}
		forget()
		s.logger.Info("removed this broker's replica of a shard: it was moved to another broker",
			"shard", id.String(), "replicas", st.Placement.Replicas(shard), "epoch", latest.Epoch)
	}
}

// movedInAfter reports whether the replica in dir was moved here by a
// move newer than the map of epoch (its move id is that of the map that
// made it): a broker that registered with a control plane holding an
// older map must not remove it on that map's word.
func movedInAfter(dir string, epoch uint64) bool {
	id, ok, err := readMoveID(dir)
	return err != nil || ok && id > epoch
}

// removeKeptMoved removes the copies of moved-away replicas kept while
// their move was pending (removeMoved), once m shows it settled.
func (s *shardSet) removeKeptMoved(m *shardmap.Map, r *applyResult) {
	s.mu.Lock()
	byStream := map[string][]int{}
	for id := range s.mu.keptMoved {
		if st, ok := m.Stream(id.Stream); !ok || st.Placement.IsReplica(id.Shard, s.node) {
			delete(s.mu.keptMoved, id) // deleted (retain removes it) or moved back (opened anew)
		} else if n, _ := st.Placement.Pending(id.Shard); n == "" {
			byStream[id.Stream] = append(byStream[id.Stream], id.Shard)
		}
	}
	s.mu.Unlock()
	for name, shards := range byStream {
		s.removeMoved(name, shards, r)
	}
}

// removeShardDir removes the directory of shard id (renamed into the
// trash first, so that a crash leaves no half-removed replica that could
// be opened), then forgets its replica mark.
func (s *shardSet) removeShardDir(id shardmap.ShardID, epoch uint64) error {
	rel := filepath.Join(id.Stream, strconv.Itoa(id.Shard))
	// '+' is in no stream name: no stream's trash has this name.
	trash := trashPrefix + id.Stream + "+" + strconv.Itoa(id.Shard) + "-" + strconv.FormatUint(epoch, 10)
	switch err := s.root.Rename(rel, trash); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		if err := s.root.RemoveAll(rel); err != nil {
			return fmt.Errorf("remove moved replica %s: %w", id, err)
		}
	default:
		if err := s.root.RemoveAll(trash); err != nil {
			return fmt.Errorf("remove moved replica %s (renamed %s): %w", id, trash, err)
		}
	}
	if err := s.marks.remove(id); err != nil {
		return fmt.Errorf("forget the mark of moved replica %s: %w", id, err)
	}
	return nil
}

// pendingMove returns the id of the move that brought this broker's
// replica of shard id, if the newest map shows it pending (not yet
// settled), else 0.
func (n *raftNet) pendingMove(id shardmap.ShardID) uint64 {
	m := n.mapOf()
	if m == nil {
		return 0
	}
	st, ok := m.Stream(id.Stream)
	if !ok {
		return 0
	}
	if node, move := st.Placement.Pending(id.Shard); node == n.node {
		return move
	}
	return 0
}

// settle tells the control plane that this broker's replica of shard id,
// moved here by move, is a voter in its slot's place (ctl
// replica.settled), if the map shows that move pending. A failure is
// logged once per shard: the join goroutine says it again until the map
// shows the move settled.
func (n *raftNet) settle(id shardmap.ShardID, move uint64) {
	if move == 0 || n.pendingMove(id) != move || n.toCtl == nil {
		return
	}
	ctx, cancel := context.WithTimeout(n.ctx, joinEvery*n.tick+time.Second)
	defer cancel()
	_, err := n.toCtl(ctx, &transport.Request{Op: opReplicaSettled, Stream: shardmap.StreamConfig{Name: id.Stream},
		Move: &transport.ReplicaMove{Shard: id.Shard, To: n.node, ID: move}})
	if err != nil && n.bad.First("settle\x00"+id.String()) {
		n.log.Warn("telling the control plane that a moved replica is a voter failed; telling it again", "shard", id.String(), "move", move, "err", err)
	}
}
