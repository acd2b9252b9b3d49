package replica

import (
	"context"
	"fmt"
	"slices"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
)

// # Membership changes
//
// A replica whose log was lost (its machine's disk) cannot come back under
// its raft id: it forgot its votes, and the leader still counts the
// entries it acknowledged. It comes back as a new replica, with a new id,
// that replaces the lost one: Config.Join opens it empty, outside the
// group, and Admit, asked of the leader again and again by whoever drives
// the join (the broker), moves the group one raft configuration change at
// a time:
//
//  1. a replaced learner (an earlier join that never finished) is removed;
//  2. the new replica is added as a learner: the leader sends it the whole
//     log, from index 1, and it votes for nobody and counts for no quorum;
//  3. once it holds every committed entry and answers, one joint change
//     (raft's joint consensus, left automatically) makes it a voter and
//     removes the replica it replaces, so the group never has fewer than
//     its voters but the lost one: three voters, of which the lost one
//     counted for nothing, become the same two and the new one;
//  4. a replaced voter left over (if the new one became a voter otherwise)
//     is removed.
//
// Each step is one raft configuration change, committed by the group's
// quorum and applied by every replica in log order; Admit answers from
// the configuration the leader has applied, so asking again is always
// safe (a change proposed while another is pending is dropped by raft, and
// a change applied twice changes nothing). The configuration at creation
// is the one in the state file, from which every replica, a joining one
// included, replays the changes in the log; once retention has dropped
// the log's start, the state file holds the configuration as of the
// compaction point, and a replica that needs the dropped entries gets a
// snapshot taken at the last change applied (retention.go).

// Membership is a replica's place in its group's configuration.
type Membership int

// A replica is outside the configuration, a learner (it receives the log
// and votes for nobody) or a voter.
const (
	NotMember Membership = iota
	Learner
	Voter
)

func (m Membership) String() string {
	switch m {
	case Learner:
		return "learner"
	case Voter:
		return "voter"
	}
	return "none"
}

// Admission is the leader's answer to Admit.
type Admission struct {
	Member Membership // the replica's place in the configuration the leader applied
	// Changing reports that a change is under way (one was proposed, or
	// the group is between two configurations): ask again.
	Changing bool
	// Match is the last log index the leader knows the replica holds, and
	// Commit the leader's commit index: a learner is promoted once Match
	// reaches Commit.
	Match, Commit uint64
}

// Done reports whether the replica is a voter and nothing it replaces is
// left in the configuration.
func (a Admission) Done() bool { return a.Member == Voter && !a.Changing }

// Members returns the voters and learners of the configuration this
// replica has applied (while the group is between two configurations,
// voters holds both).
func (g *Group) Members() (voters, learners []uint64) {
	cs := g.conf.Load()
	voters = append(slices.Clone(cs.GetVoters()), cs.GetVotersOutgoing()...)
	slices.Sort(voters)
	return slices.Compact(voters), append(slices.Clone(cs.GetLearners()), cs.GetLearnersNext()...)
}

// admitRequest is an Admit handed to the run goroutine.
type admitRequest struct {
	id       uint64
	replaces func(member uint64) bool
	reply    chan admitReply // capacity 1
}

type admitReply struct {
	a   Admission
	err error
}

// Admit, on the leader, moves the group's configuration one step towards
// replica id being a voter in place of the members replaces reports (see
// the comment at the top of this file), and says where it stands. It
// returns a *NotLeaderError on a replica that does not lead, ErrClosed or
// ErrFailed. Call it again until the answer is Done.
func (g *Group) Admit(ctx context.Context, id uint64, replaces func(member uint64) bool) (Admission, error) {
	if id == 0 {
		return Admission{}, fmt.Errorf("replica: group %q: admit: replica id 0", g.cfg.Name)
	}
	req := admitRequest{id: id, replaces: replaces, reply: make(chan admitReply, 1)}
	g.in.Lock()
	if err := g.refusal(); err != nil {
		g.in.Unlock()
		return Admission{}, err
	}
	g.in.admits = append(g.in.admits, req)
	g.in.Unlock()
	g.signal()
	select {
	case r := <-req.reply:
		return r.a, r.err
	case <-ctx.Done():
		return Admission{}, ctx.Err()
	}
}

// admit answers one Admit on the run goroutine.
func (g *Group) admit(req admitRequest) (Admission, error) {
	st := g.rn.Status()
	if st.RaftState != raft.StateLeader {
		return Admission{}, &NotLeaderError{Group: g.cfg.Name, Leader: st.Lead, Term: st.GetTerm()}
	}
	cfg := st.Config
	a := Admission{Commit: st.GetCommit()}
	_, in := cfg.Voters[0][req.id]
	_, out := cfg.Voters[1][req.id]
	_, learner := cfg.Learners[req.id]
	_, next := cfg.LearnersNext[req.id]
	switch {
	case in || out:
		a.Member = Voter
	case learner || next:
		a.Member = Learner
	}
	pr, known := st.Progress[req.id]
	a.Match = pr.Match
	if len(cfg.Voters[1]) > 0 {
		a.Changing = true // joint: raft leaves it on its own
		return a, nil
	}
	var oldVoters, oldLearners []uint64
	for m := range cfg.Voters[0] {
		if m != req.id && req.replaces(m) {
			oldVoters = append(oldVoters, m)
		}
	}
	for m := range cfg.Learners {
		if m != req.id && req.replaces(m) {
			oldLearners = append(oldLearners, m)
		}
	}
	var changes []*pb.ConfChangeSingle
	change := func(t pb.ConfChangeType, id uint64) {
		changes = append(changes, &pb.ConfChangeSingle{Type: t.Enum(), NodeId: new(id)})
	}
	switch {
	case len(oldLearners) > 0:
		change(pb.ConfChangeRemoveNode, oldLearners[0])
	case a.Member == NotMember:
		change(pb.ConfChangeAddLearnerNode, req.id)
	case a.Member == Learner:
		if !known || !pr.RecentActive || pr.Match < a.Commit {
			return a, nil // catching up
		}
		change(pb.ConfChangeAddNode, req.id)
		for _, m := range oldVoters {
			change(pb.ConfChangeRemoveNode, m)
		}
	case len(oldVoters) > 0:
		change(pb.ConfChangeRemoveNode, oldVoters[0])
	default:
		return a, nil // done
	}
	if err := g.rn.ProposeConfChange(&pb.ConfChangeV2{Changes: changes}); err != nil {
		return a, fmt.Errorf("replica: group %q: propose a configuration change: %w", g.cfg.Name, err)
	}
	g.logger.Info("replica: proposed a configuration change", "changes", describeChanges(changes), "for", req.id)
	a.Changing = true
	return a, nil
}

func describeChanges(cs []*pb.ConfChangeSingle) string {
	s := ""
	for i, c := range cs {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s %d", c.GetType(), c.GetNodeId())
	}
	return s
}
