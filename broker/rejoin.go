package broker

// # A lost replica rejoins under a new raft id
//
// A replica whose log was lost (the broker's data directory, or the
// shard's, deleted or on a disk that died) must not come back under its
// raft id: it forgot its votes, and the leader still counts the entries it
// had acknowledged. The broker knows such a replica from its replica marks
// (replicamarks.go: it created the replica, and the directory holds no
// state now) or from a fresh data directory (noteLostLocked). It opens a
// new, empty replica under a new raft id that keeps its slot (below),
// writes that id beside the replica's files (raftid) before the replica's
// first state, and joins: join asks the shard's leader, again every
// joinEvery, to admit the new id in place of whatever member holds its
// slot (opReplicaAdmit, answered by serveAdmit with replica.Group.Admit:
// learner, then voter in the lost one's place by one joint change). The
// leader sends the new replica the whole log; once it holds every
// committed entry it becomes a voter, and the join ends when its own
// applied configuration says so. Until then its subscribers are sent to
// the other replicas (replicaDown), as a lost replica's were.
//
// Raft ids: a replica's id is slot+1+idSlots×k, where slot is its broker's
// index in the shard's replica set sorted by node id (or the slot a move
// gave it: shardmap.Placement.Slots, moves.go) and k is 0 for the
// replicas made when the stream was created, random for one that replaced
// a lost replica or was moved in. So every broker maps any id to its node
// from the map alone (raftSlots.nodeOf), and a receiver can check that a
// peer speaks for its own replicas only.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/felix-broker/felix/replica"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"

	"github.com/felix-broker/felix/internal/atomicfile"
)

// idSlots is the number of slots raft ids encode: more than any replica
// set holds.
const idSlots = 8

// opReplicaAdmit asks a shard's leader to admit the sender's new replica
// (transport.Request.Admit); brokers only.
const opReplicaAdmit = "replica.admit"

// raftIDFile holds the raft id of a replica that replaced a lost one, in
// the replica's directory; a replica without it has its slot's first id.
const raftIDFile = "raftid"

// joinEvery is the ticks between two admission requests of a joining
// replica.
const joinEvery = 5

// raftID returns the first raft id of node's slot among nodes (the
// node of each slot): the id its replica had if it was among those the
// group was created with; 0 if node has no slot.
func raftID(nodes []string, node string) uint64 {
	if i := slices.Index(nodes, node); i >= 0 {
		return uint64(i) + 1
	}
	return 0
}

// slotOf returns the slot raft id is in.
func slotOf(id uint64) int { return int((id - 1) % idSlots) }

// nodeOf returns the node of raft id among nodes, "" for none.
func nodeOf(nodes []string, id uint64) string {
	if id == 0 || slotOf(id) >= len(nodes) {
		return ""
	}
	return nodes[slotOf(id)]
}

// newRaftID returns a new raft id in slot, for a replica that replaces a
// lost one.
func newRaftID(slot int) uint64 {
	return (rand.Uint64N(1<<40)+1)*idSlots + uint64(slot) + 1
}

// readRaftID returns the id in dir's raftid file, ok false if there is
// none.
func readRaftID(dir string) (id uint64, ok bool, err error) {
	return readIDFile(dir, raftIDFile, "replica id")
}

// writeRaftID stores id in dir's raftid file, durably, before the replica
// is created there.
func writeRaftID(dir string, id uint64) error {
	return writeIDFile(dir, raftIDFile, "replica id", id)
}

// readIDFile returns the number in dir's file name, ok false if there is
// none; what names the number in errors.
func readIDFile(dir, name, what string) (id uint64, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err == nil {
		id, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	}
	if err != nil || id == 0 {
		return 0, false, fmt.Errorf("broker: %s in %s: %q: %v", what, dir, b, err)
	}
	return id, true, nil
}

// writeIDFile stores id in dir's file name, durably.
func writeIDFile(dir, name, what string, id uint64) error {
	if err := atomicfile.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	err := atomicfile.WriteFile(filepath.Join(dir, name), []byte(strconv.FormatUint(id, 10)+"\n"), 0o640)
	if err != nil {
		return fmt.Errorf("broker: store the %s in %s: %w", what, dir, err)
	}
	return nil
}

// membership returns where g's own replica stands in the configuration
// it applied: a voter only once no other member holds its slot (the
// replica it replaced is gone).
func membership(g *replica.Group) replica.Membership {
	self := g.ID()
	voters, learners := g.Members()
	switch {
	case slices.Contains(learners, self):
		return replica.Learner
	case !slices.Contains(voters, self):
		return replica.NotMember
	}
	for _, m := range slices.Concat(voters, learners) {
		if m != self && slotOf(m) == slotOf(self) {
			return replica.Learner // admitted, the old one not yet removed
		}
	}
	return replica.Voter
}

func membershipName(g *replica.Group) string {
	if m := membership(g); m != replica.NotMember {
		return m.String()
	}
	return "joining"
}

// memberAt returns the voter of g's configuration in slot, 0 if none.
func memberAt(g *replica.Group, slot int) uint64 {
	voters, _ := g.Members()
	for _, m := range voters {
		if slotOf(m) == slot {
			return m
		}
	}
	return 0
}

// join asks the leader of shard id to admit gm's replica until its own
// configuration says it is a voter (see the top of this file). It runs on
// its own goroutine, stopped by raftNet.close or when gm is unregistered.
func (n *raftNet) join(id shardmap.ShardID, gm *raftMember) {
	defer n.wg.Done()
	self := gm.g.ID()
	if n.pendingMove(id) == 0 {
		n.log.Warn("replica lost with its data: joining its group again under a new raft id", "shard", id.String(), "raft_id", self)
	} else {
		n.log.Info("replica moved here: joining its group under a new raft id", "shard", id.String(), "raft_id", self)
	}
	t := time.NewTicker(joinEvery * n.tick)
	defer t.Stop()
	var hint string // the leader a refusal named
	voter := false
	for turn := 0; ; turn++ {
		if !voter && membership(gm.g) == replica.Voter {
			voter = true
			n.log.Info("replica joined its group as a voter", "shard", id.String(), "raft_id", self, "next_offset", gm.g.NextOffset())
		}
		if voter && (gm.move == 0 || n.pendingMove(id) != gm.move) {
			return // nothing of this replica's to settle
		}
		if gm.g.Err() != nil {
			return // closed or failed: whoever reopens it joins again
		}
		select {
		case <-n.ctx.Done():
			return
		case <-gm.stop:
			return
		case <-t.C:
		}
		if voter {
			// Moved here and a voter: the control plane lets another
			// replica of the shard move once it hears so (moves.go).
			n.settle(id, gm.move)
			continue
		}
		to := hint
		if lead, _ := gm.g.Leader(); lead != 0 {
			to = gm.slots.nodeOf(lead)
		}
		if to == "" || to == n.node {
			others := slices.DeleteFunc(slices.Clone(gm.slots.nodes()), func(s string) bool { return s == n.node })
			to = others[turn%len(others)]
		}
		hint = ""
		ctx, cancel := context.WithTimeout(n.ctx, joinEvery*n.tick)
		st, err := n.askAdmit(ctx, to, id, self)
		cancel()
		var werr *transport.Error
		switch {
		case errors.As(err, &werr) && werr.Code == transport.CodeNotOwner:
			hint = werr.Owner
		case err != nil:
			if n.bad.First("admit\x00" + id.String() + "\x00" + to) {
				n.log.Warn("asking to rejoin a group failed; asking again", "shard", id.String(), "to", to, "err", err)
			}
		default:
			n.log.Debug("rejoining", "shard", id.String(), "leader", to, "member", st.Member)
		}
	}
}

// askAdmit asks broker to, the leader of shard id, to admit replica
// raftID of this broker.
func (n *raftNet) askAdmit(ctx context.Context, to string, id shardmap.ShardID, raftID uint64) (*transport.ReplicaState, error) {
	m := n.mapOf()
	if m == nil {
		return nil, errNoMap
	}
	node, ok := m.Node(to)
	if !ok {
		return nil, fmt.Errorf("%w: %s", errNotMember, to)
	}
	conn, err := n.peers.conn(ctx, node)
	if err != nil {
		return nil, err
	}
	s, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { s.CancelRead(0); s.CancelWrite(0) })
	defer stop()
	defer s.CancelRead(0)
	w := transport.NewWriter(s)
	if err := w.Write(&transport.Request{Op: opReplicaAdmit, Stream: shardmap.StreamConfig{Name: id.Stream},
		Admit: &transport.ReplicaAdmit{Shard: id.Shard, ID: raftID}}); err != nil {
		return nil, err
	}
	_ = s.Close()
	f, err := transport.NewReader(s, 0).Read() // a Response of one ReplicaState, or an Error
	if err != nil {
		return nil, err
	}
	switch f := f.(type) {
	case *transport.Response:
		if len(f.Replicas) == 1 {
			return &f.Replicas[0], nil
		}
	case *transport.Error:
		return nil, f
	}
	return nil, fmt.Errorf("broker: %s answered an admission with a %T", to, f)
}

// serveAdmit answers a peer's opReplicaAdmit: if this broker's replica of
// the shard leads, it moves the admission on (replica.Group.Admit) and
// says where the peer's replica stands; else NotOwner naming the leader
// it knows.
func (b *Broker) serveAdmit(w *transport.Writer, req *transport.Request, from caller) {
	if from.peerID == "" {
		w.Write(transport.Errorf(transport.CodeUnauthorized, "%s is asked by brokers only", opReplicaAdmit))
		return
	}
	if req.Admit == nil {
		w.Write(transport.Errorf(transport.CodeInvalid, "%s names no replica", opReplicaAdmit))
		return
	}
	id := shardmap.ShardID{Stream: req.Stream.Name, Shard: req.Admit.Shard}
	gm := b.raft.member(id)
	if gm == nil {
		w.Write(&transport.Error{Code: transport.CodeUnavailable, Message: fmt.Sprintf("%s hosts no replica of %s", b.cfg.NodeID, id)})
		return
	}
	raftID := req.Admit.ID
	// Only the node the map puts in the slot (a move's target, or the
	// slot's node replacing its lost replica) is admitted into it.
	if gm.slots.nodeOf(raftID) != from.peerID {
		w.Write(transport.Errorf(transport.CodeUnauthorized, "peer %q asked to admit raft id %d of %s, which is not its own: a broker speaks for its own replicas only", from.peerID, raftID, id))
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, b.cfg.ForwardTimeout)
	defer cancel()
	slot := slotOf(raftID)
	a, err := gm.g.Admit(ctx, raftID, func(m uint64) bool { return slotOf(m) == slot })
	var nl *replica.NotLeaderError
	switch {
	case errors.As(err, &nl):
		w.Write(&transport.Error{Code: transport.CodeNotOwner, Owner: gm.slots.nodeOf(nl.Leader),
			Message: fmt.Sprintf("%s does not lead %s", b.cfg.NodeID, id)})
		return
	case err != nil:
		w.Write(&transport.Error{Code: transport.CodeUnavailable, Message: fmt.Sprintf("%s: admit to %s: %v", b.cfg.NodeID, id, err)})
		return
	}
	_, term := gm.g.Leader()
	w.Write(&transport.Response{Replicas: []transport.ReplicaState{{Shard: id.Shard, Node: from.peerID, Leader: b.cfg.NodeID,
		Term: term, Next: gm.g.NextOffset(), Member: a.Member.String()}}})
}
