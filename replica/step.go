package replica

import (
	"fmt"
	"math"
	"slices"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// A peer's message reaches raft only after two checks, because etcd raft
// takes its input as trusted and panics on some inconsistent messages (a
// commit index beyond its log, entries that conflict with committed ones):
//
//   - checkMessage, in Step on the caller's goroutine, with no state: what
//     no correct peer of this version sends (types, ids, term 0, entries
//     outside MsgApp or not contiguous, configuration changes that do not
//     decode, a snapshot outside MsgSnap or one whose configuration does
//     not hold together: checkSnapshot). The caller gets ErrBadMessage. Who may send
//     to this group is the transport's to check (the broker checks that a
//     raft id belongs to the peer that sends it): the configuration
//     changes over time (members.go), and raft ignores messages from
//     replicas outside it.
//   - checkAgainstLog, on the group's goroutine just before raft steps the
//     message, against the log as both the disk and raft's memory hold it:
//     what no correct peer sends to this log (a commit index beyond it,
//     entries that contradict its committed ones, an acknowledgement of
//     entries it does not hold, a snapshot whose offsets go back before
//     those already assigned). The message is dropped and logged, as a
//     lost one would be. So is a MsgTimeoutNow from a replica that does
//     not lead in raft's current term (Group.step).
//
// Entries that conflict with committed ones need no check of their own:
// raft v3.7 answers a MsgApp whose previous index is below its commit
// index without looking at its entries, so only entries that do not follow
// that index one by one can reach a committed index, and checkMessage
// refuses those.
//
// What gets through and still makes raft panic is contained by the group's
// goroutine (see run): the group fails with a *RaftPanicError.

// peerTypes are the raft messages replicas of this version send each other.
// Proposals are not forwarded (DisableProposalForwarding), and ReadIndex
// and leader transfer are not requested by this package, so a peer never
// has reason to send those; MsgTimeoutNow is accepted, since raft's own
// leader transfer sends it from the leader to the replica it hands over
// to (Group.step drops it from anyone else), and MsgSnap carries a
// leader's compaction point (compact.go).
var peerTypes = map[pb.MessageType]bool{
	pb.MsgApp: true, pb.MsgAppResp: true, pb.MsgSnap: true,
	pb.MsgVote: true, pb.MsgVoteResp: true,
	pb.MsgPreVote: true, pb.MsgPreVoteResp: true,
	pb.MsgHeartbeat: true, pb.MsgHeartbeatResp: true,
	pb.MsgTimeoutNow: true,
}

// maxTerm bounds the terms a peer's message may carry.
const maxTerm = 1 << 48

// checkMessage returns why m cannot come from a correct peer of this
// replica (wrapping ErrBadMessage), or nil.
func checkMessage(m *pb.Message, self uint64) error {
	t := m.GetType()
	switch from := m.GetFrom(); {
	case m.GetTo() != self || from == 0 || from == self:
		return fmt.Errorf("%w: %s from %d to %d, this is %d", ErrBadMessage, t, from, m.GetTo(), self)
	case !peerTypes[t]:
		return fmt.Errorf("%w: %s is not a message between peers here", ErrBadMessage, t)
	case m.GetTerm() == 0:
		// raft takes a message of term 0 for a local one, from no term.
		return fmt.Errorf("%w: %s from %d has term 0", ErrBadMessage, t, from)
	case m.GetTerm() > maxTerm:
		// One term per election: no group gets near this, and raft's
		// term+1 must not wrap around to the term of a local message.
		return fmt.Errorf("%w: %s from %d has term %d, over %d", ErrBadMessage, t, from, m.GetTerm(), uint64(maxTerm))
	case m.GetLogTerm() > m.GetTerm():
		// The term of a sender's log entry is never above its own term.
		return fmt.Errorf("%w: %s from %d of term %d has log term %d", ErrBadMessage, t, from, m.GetTerm(), m.GetLogTerm())
	case t == pb.MsgHeartbeat && len(m.GetContext()) > 0 && !isQuiesceHeartbeat(m),
		t == pb.MsgHeartbeatResp && len(m.GetContext()) > 0:
		// raft reads a heartbeat's context as a read index (8 bytes), and
		// this version sends none but the quiesce mark (quiesce.go).
		return fmt.Errorf("%w: %s from %d carries a context of %d bytes", ErrBadMessage, t, from, len(m.GetContext()))
	case t == pb.MsgSnap:
		if err := checkSnapshot(m.GetSnapshot(), m.GetTerm()); err != nil {
			return fmt.Errorf("%w: MsgSnap from %d: %w", ErrBadMessage, from, err)
		}
	case m.GetSnapshot() != nil:
		return fmt.Errorf("%w: %s from %d carries a snapshot", ErrBadMessage, t, from)
	}
	ents := m.GetEntries()
	if len(ents) == 0 {
		return nil
	}
	if t != pb.MsgApp {
		return fmt.Errorf("%w: %s from %d carries %d entries", ErrBadMessage, t, m.GetFrom(), len(ents))
	}
	prev, term := m.GetIndex(), m.GetLogTerm()
	if prev > math.MaxUint64-uint64(len(ents)) {
		return fmt.Errorf("%w: MsgApp from %d: %d entries after index %d overflow", ErrBadMessage, m.GetFrom(), len(ents), prev)
	}
	for i, e := range ents {
		switch {
		case e.GetIndex() != prev+1+uint64(i):
			return fmt.Errorf("%w: MsgApp from %d: entry %d has index %d, expected %d", ErrBadMessage, m.GetFrom(), i, e.GetIndex(), prev+1+uint64(i))
		case e.GetTerm() < term || e.GetTerm() > m.GetTerm():
			// Terms never decrease along a log, and a leader's entries are
			// from its term or before.
			return fmt.Errorf("%w: MsgApp from %d of term %d: entry %d has term %d after term %d", ErrBadMessage, m.GetFrom(), m.GetTerm(), e.GetIndex(), e.GetTerm(), term)
		case e.GetType() == pb.EntryConfChangeV2:
			// Configuration changes are proposed as V2 only (members.go).
			if err := proto.Unmarshal(e.GetData(), &pb.ConfChangeV2{}); err != nil {
				return fmt.Errorf("%w: MsgApp from %d: entry %d: configuration change: %w", ErrBadMessage, m.GetFrom(), e.GetIndex(), err)
			}
		case e.GetType() != pb.EntryNormal:
			return fmt.Errorf("%w: MsgApp from %d: entry %d is a %s", ErrBadMessage, m.GetFrom(), e.GetIndex(), e.GetType())
		}
		term = e.GetTerm()
	}
	return nil
}

// checkAgainstLog returns why m contradicts this replica's log, or "".
// Called by the run goroutine only.
//
// The log's last index is the smaller of the disk's and raft's: raft's
// in-memory log runs ahead of the disk by the entries of the pending
// Ready, and can also end before it, when a message stepped earlier in
// the round cut it back (an append that conflicts with the uncommitted
// tail on disk, a snapshot restored over it) and the Ready that writes
// the cut is not handled yet. raft commits and acknowledges against its
// own log. RawNode does not expose that log's last index, so the run
// loop keeps a lower bound of it, l.cut (see noteCut). That is enough:
// a check that fails on it is made again once the pending Readys are
// written (Group.step), when the disk and raft agree; and a correct
// leader's heartbeat commits at most to the follower's match, below where
// its appends start, so it never costs that extra write.
func (g *Group) checkAgainstLog(l *loop, m *pb.Message) string {
	last := min(g.st.last, l.cut)
	switch m.GetType() {
	case pb.MsgHeartbeat:
		// raft commits to it without a check of its own (and panics if
		// the log is shorter); a leader sends min(match, commit).
		if c := m.GetCommit(); c > last {
			return fmt.Sprintf("commit index %d is beyond the log's last index %d", c, last)
		}
	case pb.MsgAppResp:
		// An acknowledgement of entries this leader does not hold would
		// make it probe and send from beyond its log.
		if !m.GetReject() && m.GetIndex() > last {
			return fmt.Sprintf("acknowledges index %d, beyond the log's last index %d", m.GetIndex(), last)
		}
	case pb.MsgSnap:
		// raft installs a snapshot beyond its commit index, and offsets
		// go on from the snapshot's (Group.restore). A correct leader's
		// snapshot beyond what this replica applied starts at or after
		// the offsets it assigned: offsets only grow along the log.
		// (One at or before it raft ignores, or only commits up to.)
		md := m.GetSnapshot().GetMetadata()
		next, _, _ := decodeSnapshotData(m.GetSnapshot().GetData()) // checkMessage decoded it
		if assigned := g.offs.nextOffset(); md.GetIndex() > g.applied && next < assigned {
			return fmt.Sprintf("snapshot at index %d starts at offset %d, below offset %d, which this replica assigned up to index %d", md.GetIndex(), next, assigned, g.applied)
		}
	}
	return ""
}

// noteCut lowers l.cut, the bound of raft's in-memory log, for m, a
// message raft has just stepped. An append with entries leaves raft's log
// at or beyond its last entry (entries match up to there, or the log was
// cut back and they were appended), or unchanged if refused; a snapshot
// leaves the log at or beyond its index. Whatever else a peer sends does
// not shorten raft's log.
func noteCut(l *loop, m *pb.Message) {
	switch m.GetType() {
	case pb.MsgApp:
		if n := len(m.GetEntries()); n > 0 {
			l.cut = min(l.cut, m.GetIndex()+uint64(n))
		}
	case pb.MsgSnap:
		l.cut = min(l.cut, m.GetSnapshot().GetMetadata().GetIndex())
	}
}

// maxIndex bounds a snapshot's index: one entry per group commit never
// gets near it, and the log's next index must not wrap around.
const maxIndex = 1 << 62

// maxReplicas bounds the replicas a snapshot's configuration may name.
const maxReplicas = 16

// checkSnapshot returns why snap cannot be a compaction point a leader of
// term sent (compact.go): raft restores its configuration with a panic
// on one that does not hold together.
func checkSnapshot(snap *pb.Snapshot, term uint64) error {
	md := snap.GetMetadata()
	switch {
	case snap == nil || md == nil:
		return fmt.Errorf("no snapshot")
	case md.GetIndex() == 0 || md.GetIndex() > maxIndex || md.GetTerm() == 0 || md.GetTerm() > term:
		return fmt.Errorf("snapshot at index %d, term %d (message term %d)", md.GetIndex(), md.GetTerm(), term)
	}
	if _, _, err := decodeSnapshotData(snap.GetData()); err != nil {
		return err
	}
	cs := md.GetConfState()
	voters, learners := cs.GetVoters(), cs.GetLearners()
	outgoing, next := cs.GetVotersOutgoing(), cs.GetLearnersNext()
	if len(voters) == 0 || len(voters)+len(learners)+len(outgoing)+len(next) > 4*maxReplicas {
		return fmt.Errorf("snapshot configuration of %d voters, %d learners", len(voters), len(learners))
	}
	seen := map[uint64]string{}
	for _, set := range []struct {
		name string
		ids  []uint64
	}{{"voter", voters}, {"learner", learners}, {"outgoing voter", outgoing}, {"next learner", next}} {
		for _, id := range set.ids {
			if id == 0 {
				return fmt.Errorf("snapshot configuration names replica 0")
			}
			if prev := seen[id]; prev == set.name {
				return fmt.Errorf("snapshot configuration names %s %d twice", set.name, id)
			}
			seen[id] = set.name
		}
	}
	// raft's rules: a learner is no voter; a next learner is an outgoing
	// voter; outgoing voters only during a joint configuration.
	for _, id := range learners {
		if slices.Contains(voters, id) || slices.Contains(outgoing, id) {
			return fmt.Errorf("snapshot configuration has %d as voter and learner", id)
		}
	}
	for _, id := range next {
		if !slices.Contains(outgoing, id) || slices.Contains(voters, id) {
			return fmt.Errorf("snapshot configuration has next learner %d that is not only an outgoing voter", id)
		}
	}
	if len(outgoing) == 0 && cs.GetAutoLeave() {
		return fmt.Errorf("snapshot configuration auto-leaves a joint configuration it is not in")
	}
	return nil
}
