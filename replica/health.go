package replica

import (
	"sync/atomic"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
)

// # Catching up
//
// A replica that restarts rejoins its group behind: it holds the log as it
// was when it stopped, knows no leader until one is heard, and takes the
// entries committed meanwhile from the leader. Until it has them, it
// counts towards no quorum the leader can commit with, and stopping
// another replica of the group then stalls it: what an operator's rolling
// restart must wait out (the broker's readiness, see CatchUp).
//
// A follower cannot ask its leader's commit index without a round of
// heartbeats (raft's ReadIndex, which this package does not use: a
// heartbeat's context marks quiescence), so it goes by what its leader
// tells it. An append carries the leader's commit index; a heartbeat
// carries min(commit, what the leader knows the follower holds), a lower
// bound, and after a restart the first heartbeat can make a follower far
// behind look caught up until the leader, hearing its answer, sends the
// appends it lacks. So the rule, on the group's goroutine after each
// round:
//
//   - a leader is caught up;
//   - a follower is caught up while it follows a known leader, in the
//     leader's term, and its applied index is within catchUpSlack entries
//     of the highest commit index that leader has told it in that term;
//   - it was caught up (CatchUp.WasCaughtUp, which stays set) once that
//     has held for a heartbeat interval of ticks (by which time the
//     appends a heartbeat's answer calls for have come), or once it
//     quiesced on its leader's quiesce heartbeat (sent only to a follower
//     that holds the whole log, committed).
//
// Membership is not part of it: a learner can be caught up, and whoever
// asks decides whether only a voter counts (the broker does).

// catchUpSlack is how many entries a follower's applied index may trail
// its leader's commit index and still be caught up: an entry or two is
// always in flight between the two under load.
const catchUpSlack = 8

// CatchUp is a replica's view of where it stands against its group's
// leader.
type CatchUp struct {
	// Leader is the leader this replica knows, 0 if none.
	Leader uint64
	// Applied is the last index this replica applied, and LeaderCommit the
	// highest commit index the leader told it in the leader's term (its
	// own, on the leader; 0 until the leader was heard).
	Applied, LeaderCommit uint64
	// CaughtUp reports that the replica leads, or follows a known leader
	// within a few entries of its commit index (see "Catching up").
	CaughtUp bool
	// WasCaughtUp reports that the replica has been caught up, for a
	// heartbeat interval, at least once since Open. It is never unset.
	WasCaughtUp bool
}

// catchUp is what the run goroutine publishes for CatchUp.
type catchUp struct {
	leaderCommit atomic.Uint64
	applied      atomic.Uint64
	caughtUp     atomic.Bool
	wasCaughtUp  atomic.Bool
}

// CatchUp returns where the replica stands against its leader. Safe for
// concurrent use; it reads what the group's goroutine last published,
// and while that goroutine has left more than a heartbeat interval of
// ticks untaken (held up, in a slow write say: what it published may be
// long out of date) the replica is not caught up.
func (g *Group) CatchUp() CatchUp {
	g.in.Lock()
	held := g.in.ticks > g.cfg.HeartbeatTicks
	g.in.Unlock()
	return CatchUp{
		Leader:       g.leader.Load(),
		Applied:      g.catch.applied.Load(),
		LeaderCommit: g.catch.leaderCommit.Load(),
		CaughtUp:     g.catch.caughtUp.Load() && !held,
		WasCaughtUp:  g.catch.wasCaughtUp.Load(),
	}
}

// leaderTold notes the commit index in m, a message raft has just stepped,
// if it came from the leader raft follows, in the leader's term.
func (g *Group) leaderTold(l *loop, m *pb.Message) {
	if t := m.GetType(); t != pb.MsgApp && t != pb.MsgHeartbeat {
		return
	}
	st := g.rn.BasicStatus()
	if st.Lead != m.GetFrom() || st.GetTerm() != m.GetTerm() {
		return
	}
	if l.leadID != st.Lead || l.leadTerm != st.GetTerm() {
		l.leadID, l.leadTerm, l.leadCommit, l.caughtSince = st.Lead, st.GetTerm(), 0, noTick
	}
	l.leadCommit = max(l.leadCommit, m.GetCommit())
}

// noTick marks loop.caughtSince unset.
const noTick = ^uint64(0)

// noteCatchUp works out, after a round, whether the replica is caught up
// (see "Catching up") and publishes it for CatchUp.
func (g *Group) noteCatchUp(l *loop) {
	st := g.rn.BasicStatus()
	leaderCommit, caught, held := l.leadCommit, false, false
	switch {
	case st.RaftState == raft.StateLeader:
		leaderCommit, caught, held = st.GetCommit(), true, true
	case st.Lead == raft.None || st.Lead != l.leadID || st.GetTerm() != l.leadTerm:
		leaderCommit = 0
	case l.quiet:
		caught, held = true, true // quiesced on its leader's word: it holds the whole log
	default:
		caught = st.Applied+catchUpSlack >= l.leadCommit
	}
	switch {
	case !caught:
		l.caughtSince = noTick
	case l.caughtSince == noTick:
		l.caughtSince = l.ticks
	}
	held = held || caught && l.ticks-l.caughtSince >= uint64(g.cfg.HeartbeatTicks)
	g.catch.leaderCommit.Store(leaderCommit)
	g.catch.applied.Store(st.Applied)
	g.catch.caughtUp.Store(caught)
	if held {
		g.catch.wasCaughtUp.Store(true)
	}
}
