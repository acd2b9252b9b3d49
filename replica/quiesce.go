package replica

import (
	"bytes"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// # Quiescence
//
// An idle group costs its hosts nothing but memory: with Config.Quiesce,
// a leader whose group has nothing in flight stops ticking and sends each
// follower one last heartbeat marked quiesce; a follower that holds the
// whole log and knows it is committed stops ticking too. No heartbeats, no
// election timers, no Readys, however many groups a broker hosts. This is
// CockroachDB's quiescence of idle ranges, on etcd raft unchanged: raft
// only sees fewer Tick calls, and heartbeats it would have sent itself.
//
// Who watches a quiet group instead is the owner's business: per pair of
// hosts, one signal says the other is alive (the broker's raft streams
// carry a keep-alive frame each tick they are otherwise idle). When a
// host falls silent for an election timeout, its owner calls Wake on
// every group the silent host is a member of: their replicas tick again,
// and elect a new leader if the old one is gone. Wake is also right when
// a host is heard again after a silence (it may have restarted and needs
// the leader's heartbeats).
//
// The rules, which keep raft's guarantees (they decide only when raft
// ticks, never what it does with a message):
//
//   - The leader quiesces on a tick when, for a heartbeat interval, no
//     record was proposed, and now nothing is uncommitted or unapplied, no
//     leadership transfer or configuration change is under way, and every
//     other replica (learners too) has answered within an election timeout
//     and holds the last entry (match = last index, replicating).
//   - Its quiesce heartbeat is a MsgHeartbeat carrying the commit index and
//     Context quiesceContext. The follower strips the context (raft
//     answers an ordinary heartbeat) and quiesces if, after raft stepped
//     it, raft follows the sender in the sender's term and its log ends at
//     the commit index the heartbeat carries.
//   - A quiet replica wakes (ticks again) on any work handed in: a record,
//     a transfer or an admission request, Wake, and any peer message
//     except the ones quiescence itself exchanges (a quiesce heartbeat to a
//     follower; a heartbeat answer to the leader). A follower woken by
//     anything but its leader's own message wakes the leader too, with an
//     acknowledgement of its last index (a MsgAppResp the leader already
//     had), so that a follower woken by a peer's vote request does not go
//     on to campaign against a live leader that is still quiet.
//   - A quiet replica does not count the ticks it skipped: its election
//     timer resumes where it stopped (at 0 on a follower, which the
//     quiesce heartbeat reset), so a follower that wakes campaigns only
//     after a full election timeout without hearing from its leader.

// quiesceContext marks a quiesce heartbeat. Eight bytes, because raft v3.7
// reads a heartbeat's context as a little-endian read index; the follower
// strips it before raft sees it, and no replica here sends a heartbeat
// context otherwise (ReadIndex is not used).
var quiesceContext = []byte("felix:qz")

// isQuiesceHeartbeat reports whether m is a leader's quiesce heartbeat.
func isQuiesceHeartbeat(m *pb.Message) bool {
	return m.GetType() == pb.MsgHeartbeat && bytes.Equal(m.GetContext(), quiesceContext)
}

// Wake makes a quiet replica tick again (see Quiescence). The owner calls
// it when a member of the group is heard again after a silence. It never
// blocks and is cheap on a group that is not quiet.
func (g *Group) Wake() { g.WakeSilent(0) }

// WakeSilent is Wake for when the host of replica id has been silent for
// an election timeout. If this replica follows id and was quiet until less
// than an election timeout ago (still quiet, or woken meanwhile by a
// peer's vote request, say), its election timer is also moved on to a
// whole election timeout since it woke, the time it skipped: it campaigns
// (and grants votes) as soon as a replica that never went quiet would, so
// a quiet group fails over as fast as a busy one.
func (g *Group) WakeSilent(id uint64) {
	g.in.Lock()
	g.in.wake = true
	if id != 0 {
		g.in.silent = id
	}
	g.in.Unlock()
	g.signal()
}

// Quiesced reports whether the replica is quiet: it takes no ticks, and
// (as a leader) sends no heartbeats.
func (g *Group) Quiesced() bool { return g.quiet.Load() }

// wakes reports whether a peer's message must wake a quiet replica.
func wakes(m *pb.Message) bool {
	return !isQuiesceHeartbeat(m) && m.GetType() != pb.MsgHeartbeatResp
}

// unquiesce makes the replica tick again. A follower not woken by its
// leader wakes the leader too, unless the leader's host is silent.
func (g *Group) unquiesce(l *loop, byLeader bool, silent uint64) {
	l.quiet = false
	l.lastActive, l.woke = l.ticks, l.ticks
	g.quiet.Store(false)
	st := g.rn.BasicStatus()
	if byLeader || st.RaftState != raft.StateFollower || st.Lead == raft.None || st.Lead == silent {
		return
	}
	g.cfg.Transport.Send([]*pb.Message{{
		Type: pb.MsgAppResp.Enum(), To: new(st.Lead), From: new(g.cfg.ID),
		Term: new(st.GetTerm()), Index: new(g.st.last),
	}})
}

// leaderSilent moves the election timer of a follower of replica id,
// whose host is silent, on to an election timeout since it last woke (see
// WakeSilent).
func (g *Group) leaderSilent(l *loop, id uint64) {
	st := g.rn.BasicStatus()
	if l.quiet || st.RaftState != raft.StateFollower || st.Lead != id {
		return
	}
	for l.ticks-l.woke < uint64(g.cfg.ElectionTicks) {
		g.rn.Tick()
		l.ticks++
	}
}

// maybeQuiesce quiesces a leader whose group is idle (the rules above),
// and sends its quiesce heartbeats.
func (g *Group) maybeQuiesce(l *loop) {
	if !g.cfg.Quiesce || l.quiet || l.ticks-l.lastActive < uint64(g.cfg.HeartbeatTicks) ||
		len(l.unindexed) > 0 || len(l.byIndex) > 0 {
		return
	}
	st := g.rn.BasicStatus()
	if st.RaftState != raft.StateLeader || st.LeadTransferee != raft.None ||
		st.GetCommit() != g.st.last || st.Applied != st.GetCommit() || len(g.conf.Load().GetVotersOutgoing()) > 0 {
		return
	}
	caughtUp := true
	var peers []uint64
	g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if id == g.cfg.ID {
			return
		}
		h, heard := l.heard[id]
		if pr.Match != g.st.last || pr.State != tracker.StateReplicate || !heard || l.ticks-h > uint64(g.cfg.ElectionTicks) {
			caughtUp = false
		}
		peers = append(peers, id)
	})
	if !caughtUp {
		return
	}
	l.quiet = true
	g.quiet.Store(true)
	msgs := make([]*pb.Message, len(peers))
	for i, id := range peers {
		msgs[i] = &pb.Message{
			Type: pb.MsgHeartbeat.Enum(), To: new(id), From: new(g.cfg.ID),
			Term: new(st.GetTerm()), Commit: new(st.GetCommit()), Context: quiesceContext,
		}
	}
	g.cfg.Transport.Send(msgs)
}

// followerQuiesces reports whether, raft having stepped the quiesce
// heartbeat m, this follower may stop ticking.
func (g *Group) followerQuiesces(m *pb.Message) bool {
	st := g.rn.BasicStatus()
	return g.cfg.Quiesce && st.RaftState == raft.StateFollower && st.Lead == m.GetFrom() &&
		st.GetTerm() == m.GetTerm() && st.GetCommit() == m.GetCommit() && g.st.last == m.GetCommit()
}
