package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/shardmap"
)

// streamMoveCmd moves a replica of a replicated shard off a broker lost
// for good (client.MoveReplica), then follows the new replica until it is
// a voter.
type streamMoveCmd struct {
	Name  string        `arg:"" help:"Stream name (a stream of replication factor 3)."`
	Shard int           `required:"" placeholder:"N" help:"The shard whose replica moves."`
	From  string        `required:"" placeholder:"BROKER-ID" help:"Broker whose replica moves: one that is down, lost for good. A live one is refused: stop it first."`
	To    string        `placeholder:"BROKER-ID" help:"Live broker without a replica of the shard to move it to (default: the one the control plane picks by rendezvous hashing)."`
	Wait  time.Duration `help:"Follow the new replica for this long, until it has caught up and is a voter; exit 1 if it is not by then (0: do not wait)." default:"60s"`
}

// movePoll is how often stream move asks the replicas how far the new one
// is.
const movePoll = 250 * time.Millisecond

// moveJSON is a move as --json prints it.
type moveJSON struct {
	Stream   string   `json:"stream"`
	Shard    int      `json:"shard"`
	From     string   `json:"from"`
	To       string   `json:"to"`
	Epoch    uint64   `json:"epoch"`
	Replicas []string `json:"replicas"`
}

func (s *streamMoveCmd) Run(a *app) error {
	g := a.flags
	if err := shardmap.ValidateStreamName(s.Name); err != nil {
		return usagef("cannot move a replica of stream %q: %s", s.Name, plainError(err))
	}
	switch {
	case s.Shard < 0:
		return usagef("--shard must be a shard number (0 or more), got %d", s.Shard)
	case s.From == "":
		return usagef("--from must name the broker whose replica moves")
	case s.To == s.From:
		return usagef("--to %s is the broker the replica moves from: name another, or leave --to out to let the control plane choose", s.To)
	case s.Wait < 0:
		return usagef("--wait must not be negative, got %s", s.Wait)
	}
	cctx, cancel := context.WithTimeout(a.ctx, g.Timeout)
	defer cancel()
	c, err := g.connect(cctx, a, "")
	if err != nil {
		return err
	}
	defer c.Close()
	mv, err := moveWhenReady(a.ctx, c, g.Timeout, max(s.Wait, g.Timeout), s.Name, s.Shard, s.From, s.To, func() {
		if !g.JSON {
			fmt.Fprintf(a.stdout, "waiting for the other replicas of %s/%d to be voters under one leader (an election after %s went down, or a replica rejoining)\n", s.Name, s.Shard, s.From)
		}
	})
	if err != nil {
		return &brokerError{ID: c.id, Addr: c.addr, Err: &streamError{Stream: s.Name, Err: err}}
	}
	if g.JSON {
		if err := printJSON(a.stdout, map[string]any{"moved": moveJSON{Stream: mv.Stream, Shard: mv.Shard, From: mv.From, To: mv.To, Epoch: mv.Epoch, Replicas: mv.Replicas}}); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(a.stdout, "moved %s shard %d: %s → %s (map epoch %d); %s joins the group and catches up from its leader\n",
			mv.Stream, mv.Shard, mv.From, mv.To, mv.Epoch, mv.To)
		if s.Wait == 0 {
			fmt.Fprintf(a.stdout, "follow it with `felixctl stream info %s`\n", mv.Stream)
		}
	}
	if s.Wait == 0 {
		return nil
	}
	err = followReplica(a.ctx, c, a.flags.Timeout, s.Wait, mv, func(p replicaProgress) error {
		if g.JSON {
			return printJSON(a.stdout, map[string]any{"progress": p})
		}
		_, err := fmt.Fprintln(a.stdout, p)
		return err
	})
	if err != nil && a.ctx.Err() != nil {
		return nil // interrupted: the move is made, only the following stops
	}
	return err
}

// followReplica polls the replicas of mv's shard until mv.To reports
// itself a voter, for up to wait, each poll within timeout (--timeout),
// and calls report, if not nil, with each change of its state worth a
// line (targetProgress, newsSince). It returns nil once mv.To is a voter,
// ctx's error if ctx ends first, and an error that says where the
// replica is if wait runs out.
func followReplica(ctx context.Context, c *conn, timeout, wait time.Duration, mv client.MovedReplica, report func(replicaProgress) error) error {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	tick := time.NewTicker(movePoll)
	defer tick.Stop()
	var (
		last    replicaProgress
		printed time.Time
		lastErr error
	)
	for {
		// Each poll within --timeout too: a broker that stopped answering
		// must not hold up the next.
		pctx, pcancel := context.WithTimeout(wctx, timeout)
		states, err := c.ReplicaStatus(pctx, mv.Stream)
		pcancel()
		switch {
		case err == nil:
			lastErr = nil
			p := targetProgress(states, mv.Shard, mv.To)
			if now := time.Now(); p.newsSince(last, printed, now) {
				if report != nil {
					if err := report(p); err != nil {
						return err
					}
				}
				last, printed = p, now
			}
			if p.done() && settled(wctx, c, timeout, mv) {
				return nil
			}
		case wctx.Err() == nil:
			lastErr = err // asked again at the next tick
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			msg := fmt.Sprintf("%s did not become a voter of %s/%d within %s (--wait): %s", mv.To, mv.Stream, mv.Shard, wait, last.status())
			if lastErr != nil {
				msg += fmt.Sprintf("; the last replica status failed: %s", plainError(lastErr))
			}
			return errors.New(msg + fmt.Sprintf(". The move is made and the replica goes on joining: follow it with `felixctl stream info %s`", mv.Stream))
		case <-tick.C:
		}
	}
}

// moveReadyPoll is how often a move the SDK found the shard not ready
// for is asked again.
const moveReadyPoll = 500 * time.Millisecond

// moveWhenReady makes the move, asking again while the SDK says the
// shard's other replicas are not yet voters under one leader (they elect
// one within an election timeout of the source going down), for up to
// wait; each attempt within timeout. waiting runs once, at the first such
// answer.
func moveWhenReady(ctx context.Context, c *conn, timeout, wait time.Duration, stream string, shard int, from, to string, waiting func()) (client.MovedReplica, error) {
	deadline := time.Now().Add(wait)
	for first := true; ; first = false {
		mctx, cancel := context.WithTimeout(ctx, timeout)
		mv, err := c.MoveReplica(mctx, stream, shard, from, to)
		cancel()
		if !errors.Is(err, client.ErrReplicasNotReady) || time.Now().Add(moveReadyPoll).After(deadline) {
			return mv, err
		}
		if first && waiting != nil {
			waiting()
		}
		select {
		case <-ctx.Done():
			return mv, err
		case <-time.After(moveReadyPoll):
		}
	}
}

// settled reports whether the map no longer shows mv pending: its target
// told the control plane it is a voter, and another replica of the shard
// may move (a voter reports it within a few raft ticks).
func settled(ctx context.Context, c *conn, timeout time.Duration, mv client.MovedReplica) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	m, err := c.Map(ctx)
	if err != nil {
		return false
	}
	st, ok := m.Stream(mv.Stream)
	if !ok {
		return true // deleted meanwhile: nothing is pending
	}
	node, _ := st.Placement.Pending(mv.Shard)
	return node != mv.To
}

// replicaProgress is what a moved replica reports, as stream move prints
// it.
type replicaProgress struct {
	Node  string `json:"node"`
	Shard int    `json:"shard"`
	// Reported is whether its broker reported the replica: not before it
	// has the map of the move and has opened it.
	Reported bool `json:"reported"`
	// Member is its place in the group: "joining", "learner" or "voter"
	// ("" from a broker of an earlier version).
	Member string `json:"member,omitempty"`
	// Committed is the offset of the next record it will commit; Leader
	// the leader's (or, during an election, the most any replica has).
	Committed uint64 `json:"committed"`
	Leader    uint64 `json:"leader_committed"`
	// Err says why its broker could not report it.
	Err string `json:"err,omitempty"`
}

// targetProgress returns what node's replica of shard reports in states.
func targetProgress(states []client.ReplicaState, shard int, node string) replicaProgress {
	p := replicaProgress{Node: node, Shard: shard, Leader: shardHeads(states)[shard]}
	for _, st := range states {
		if st.Shard == shard && st.Node == node {
			p.Reported, p.Member, p.Committed, p.Err = true, st.Member, st.Next, st.Err
		}
	}
	return p
}

// done reports whether the replica is a voter of its group.
func (p replicaProgress) done() bool { return p.Reported && p.Err == "" && p.Member == "voter" }

// newsSince reports whether p is worth a line after last, printed at
// printed: a new state (reported, membership, error), or, for a learner,
// new offsets once a second at most.
func (p replicaProgress) newsSince(last replicaProgress, printed, now time.Time) bool {
	switch {
	case printed.IsZero():
		return true
	case p.Reported != last.Reported || p.Member != last.Member || p.Err != last.Err:
		return true
	case p.Member == "learner" && (p.Committed != last.Committed || p.Leader != last.Leader):
		return now.Sub(printed) >= time.Second
	}
	return false
}

// String is the line stream move prints for p.
func (p replicaProgress) String() string { return p.Node + ": " + p.state() }

// status says where p is, for the message of a wait that ran out.
func (p replicaProgress) status() string {
	switch {
	case !p.Reported:
		return "it has not reported the replica yet (has it received the map of the move? is it running?)"
	case p.Err == "" && p.Member == "learner":
		return "it is a " + p.state()
	case p.Err == "" && p.Member == "":
		return "its broker does not report the replica's membership (a broker of an earlier version?)"
	}
	return "it is " + p.state()
}

func (p replicaProgress) state() string {
	switch {
	case !p.Reported:
		return "no replica reported yet"
	case p.Err != "":
		return "not reporting (" + p.Err + ")"
	case p.Member == "joining":
		return "joining (not admitted to the group yet)"
	case p.Member == "learner":
		return fmt.Sprintf("learner at offset %d of %d", p.Committed, p.Leader)
	case p.Member == "":
		return "membership not reported (a broker of an earlier version?)"
	}
	return p.Member
}
