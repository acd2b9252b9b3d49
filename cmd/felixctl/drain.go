package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/felix-broker/felix/shardmap"
)

// clusterDrainCmd moves every replica a broker lost for good holds to
// brokers the control plane picks (client.MoveReplica, for each shard of
// each replicated stream whose replica set has it), following each new
// replica until it is a voter (followReplica), a few at a time.
type clusterDrainCmd struct {
	Broker   string        `arg:"" help:"Broker whose replicas move: one that is down, lost for good. A live one is refused: stop it first."`
	Parallel int           `default:"2" help:"How many new replicas catch up at once: the next move is made when one of them is a voter."`
	Wait     time.Duration `default:"5m" help:"Follow each new replica for this long, until it has caught up and is a voter; one that is not by then is reported, the drain goes on, and it exits 1."`
}

// clusterRemoveCmd removes a broker lost for good from the members
// (client.RemoveBroker).
type clusterRemoveCmd struct {
	Broker string `arg:"" help:"Broker to remove: one that is down, lost for good, holds no replica (move them first with felixctl cluster drain), and whose replicas' moves have settled (each new replica a voter)."`
}

func (s *clusterRemoveCmd) Run(a *app) error {
	if s.Broker == "" {
		return usagef("name the broker to remove")
	}
	g := a.flags
	ctx, cancel := context.WithTimeout(a.ctx, g.Timeout)
	defer cancel()
	c, err := g.connect(ctx, a, "")
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.RemoveBroker(ctx, s.Broker); err != nil {
		return &brokerError{ID: c.id, Addr: c.addr, Err: err}
	}
	if g.JSON {
		return printJSON(a.stdout, map[string]any{"removed": s.Broker})
	}
	_, err = fmt.Fprintf(a.stdout, "removed broker %s from the cluster: the shard map no longer lists it (should it start again, it joins as a new broker holding nothing)\n", s.Broker)
	return err
}

// drainShardJSON is a shard as drain --json prints it: the new replica
// (node) that is a voter, or why a move was not made or did not finish.
type drainShardJSON struct {
	Stream string `json:"stream"`
	Shard  int    `json:"shard"`
	Node   string `json:"node,omitempty"`
	Error  string `json:"error,omitempty"`
}

// drainJSON is a drain's plan (first line) and outcome (last line), as
// --json prints them.
type drainJSON struct {
	Broker   string `json:"broker"`
	Replicas int    `json:"replicas"` // to move
	Parallel int    `json:"parallel,omitempty"`
	Moved    *int   `json:"moved,omitempty"` // in the summary only
	Voters   *int   `json:"voters,omitempty"`
	// Unmovable are the shards of replication factor 1 the broker owns.
	Unmovable []string `json:"unmovable"`
}

func (s *clusterDrainCmd) Run(a *app) error {
	switch {
	case s.Broker == "":
		return usagef("name the broker to drain")
	case s.Parallel < 1:
		return usagef("--parallel must be 1 or more, got %d", s.Parallel)
	case s.Wait <= 0:
		return usagef("--wait must be positive, got %s: drain follows each new replica until it is a voter, to bound how many catch up at once", s.Wait)
	}
	g := a.flags
	cctx, cancel := context.WithTimeout(a.ctx, g.Timeout)
	defer cancel()
	c, err := g.connect(cctx, a, "")
	if err != nil {
		return err
	}
	defer c.Close()
	m, err := c.ClusterStatus(cctx)
	if err != nil {
		return &brokerError{ID: c.id, Addr: c.addr, Err: err}
	}
	n, ok := m.Node(s.Broker)
	switch {
	case !ok:
		var ids []string
		for _, n := range m.Nodes {
			ids = append(ids, n.ID)
		}
		return fmt.Errorf("%s is not a member of the cluster (members: %s): nothing to drain", s.Broker, strings.Join(ids, ", "))
	case n.Live:
		return fmt.Errorf("%s is live: stop it first. Drain moves the replicas of a broker lost for good; a live broker's replicas are not moved (each would leave its shard's group at once)", s.Broker)
	}
	d := newDrain(a, c, s, m)
	return d.run()
}

// drain is one run of cluster drain: the moves to make, taken in order by
// --parallel workers, and what came of them.
type drain struct {
	a   *app
	c   *conn
	cmd *clusterDrainCmd
	// moves are the shards whose replica moves, in stream and shard
	// order; unmovable the shards of replication factor 1 the broker
	// owns.
	moves     []shardmap.ShardID
	unmovable []shardmap.ShardID

	// mu serializes the workers' lines (so that they do not interleave)
	// and guards what follows, which the workers update.
	mu      sync.Mutex
	next    int  // index in moves of the next move to make
	stopped bool // make no more moves
	moved   int
	voters  int
	// notMoved says, by shard, why a move was not made; notVoter are
	// the shards whose new replica did not become a voter within --wait.
	notMoved, notVoter []string
	writeErr           error
}

func newDrain(a *app, c *conn, cmd *clusterDrainCmd, m *shardmap.Map) *drain {
	d := &drain{a: a, c: c, cmd: cmd}
	for _, st := range m.Streams {
		if st.Factor() == 1 {
			for _, shard := range st.Placement.OwnedBy(cmd.Broker) {
				d.unmovable = append(d.unmovable, shardmap.ShardID{Stream: st.Name, Shard: shard})
			}
			continue
		}
		for _, shard := range st.Placement.ReplicatedBy(cmd.Broker) {
			d.moves = append(d.moves, shardmap.ShardID{Stream: st.Name, Shard: shard})
		}
	}
	return d
}

// run makes the moves, at most --parallel catching up at once, and
// prints a summary; the error says what is left to do.
func (d *drain) run() error {
	b := d.cmd.Broker
	d.line(map[string]any{"drain": drainJSON{Broker: b, Replicas: len(d.moves), Parallel: d.cmd.Parallel, Unmovable: shardNames(d.unmovable)}},
		func(w io.Writer) {
			if len(d.moves) > 0 {
				fmt.Fprintf(w, "draining %s: %s to move to other brokers, %d catching up at once\n", b, replicaCount(len(d.moves)), min(d.cmd.Parallel, len(d.moves)))
			}
			if len(d.unmovable) > 0 {
				fmt.Fprintf(w, "%s of replication factor 1 cannot move (their logs stay on %s): %s\n", shardsCount(len(d.unmovable)), b, strings.Join(shardNames(d.unmovable), ", "))
			}
		})
	var wg sync.WaitGroup
	for range min(d.cmd.Parallel, len(d.moves)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.work()
		}()
	}
	wg.Wait()
	return d.finish()
}

// work makes moves until none is left or the drain stops: each is one
// MoveReplica, followed until its new replica is a voter.
func (d *drain) work() {
	a, b := d.a, d.cmd.Broker
	for {
		id, ok := d.take()
		if !ok {
			return
		}
		mv, err := moveWhenReady(a.ctx, d.c, a.flags.Timeout, d.cmd.Wait, id.Stream, id.Shard, b, "", nil)
		if err != nil {
			if a.ctx.Err() != nil {
				d.stop()
				return
			}
			// Something is wrong (the broker came back, no broker to move
			// to, the control plane unreachable): make no more moves.
			msg, _ := explain(&brokerError{ID: d.c.id, Addr: d.c.addr, Err: &streamError{Stream: id.Stream, Err: err}})
			d.mu.Lock()
			d.stopped = true
			d.notMoved = append(d.notMoved, id.String()+": "+msg)
			d.mu.Unlock()
			d.line(map[string]any{"failed": drainShardJSON{Stream: id.Stream, Shard: id.Shard, Error: msg}},
				func(w io.Writer) { fmt.Fprintf(w, "%s: not moved: %s\n", id, msg) })
			return
		}
		d.mu.Lock()
		d.moved++
		d.mu.Unlock()
		d.line(map[string]any{"moved": moveJSON{Stream: mv.Stream, Shard: mv.Shard, From: mv.From, To: mv.To, Epoch: mv.Epoch, Replicas: mv.Replicas}},
			func(w io.Writer) {
				fmt.Fprintf(w, "moved %s: %s → %s (map epoch %d); catching up\n", id, mv.From, mv.To, mv.Epoch)
			})
		err = followReplica(a.ctx, d.c, a.flags.Timeout, d.cmd.Wait, mv, nil)
		switch {
		case err == nil:
			d.mu.Lock()
			d.voters++
			d.mu.Unlock()
			d.line(map[string]any{"voter": drainShardJSON{Stream: mv.Stream, Shard: mv.Shard, Node: mv.To}},
				func(w io.Writer) { fmt.Fprintf(w, "%s: %s is a voter\n", id, mv.To) })
		case a.ctx.Err() != nil:
			d.stop()
			return
		default:
			// The replica goes on joining; the next move is made all the
			// same, so a shard that does not catch up holds up no other.
			msg := plainError(err)
			d.mu.Lock()
			d.notVoter = append(d.notVoter, id.String())
			d.mu.Unlock()
			d.line(map[string]any{"failed": drainShardJSON{Stream: mv.Stream, Shard: mv.Shard, Node: mv.To, Error: msg}},
				func(w io.Writer) { fmt.Fprintf(w, "%s: %s\n", id, msg) })
		}
	}
}

// take returns the next shard to move, unless none is left or the drain
// stopped.
func (d *drain) take() (shardmap.ShardID, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped || d.next == len(d.moves) || d.a.ctx.Err() != nil {
		return shardmap.ShardID{}, false
	}
	d.next++
	return d.moves[d.next-1], true
}

func (d *drain) stop() {
	d.mu.Lock()
	d.stopped = true
	d.mu.Unlock()
}

// line prints one line (or a few) of the drain: v with --json, else what
// text writes.
func (d *drain) line(v any, text func(io.Writer)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.a.flags.JSON {
		if err := printJSON(d.a.stdout, v); err != nil && d.writeErr == nil {
			d.writeErr = err
		}
		return
	}
	text(d.a.stdout)
}

// finish prints the summary, and returns an error saying what is left to
// do, if anything is.
func (d *drain) finish() error {
	b := d.cmd.Broker
	total := len(d.moves)
	moved, voters := d.moved, d.voters
	d.line(map[string]any{"summary": drainJSON{Broker: b, Replicas: total, Moved: &moved, Voters: &voters, Unmovable: shardNames(d.unmovable)}},
		func(w io.Writer) {
			switch {
			case total == 0:
				fmt.Fprintf(w, "%s holds no replica of a replicated stream: nothing to move\n", b)
			case voters == total && len(d.unmovable) == 0:
				fmt.Fprintf(w, "drained %s: %s moved, every new one a voter\n", b, replicaCount(total))
			case voters == total:
				fmt.Fprintf(w, "moved %s's %s, every new one a voter; its %s of replication factor 1 stay on it\n", b, replicaCount(total), shardsCount(len(d.unmovable)))
			default:
				fmt.Fprintf(w, "drain of %s: %d of %s moved, %d of them voters\n", b, moved, replicaCount(total), voters)
			}
			if voters == total && len(d.unmovable) == 0 {
				fmt.Fprintf(w, "remove it from the cluster with `felixctl cluster remove %s`\n", b)
			}
		})
	if d.writeErr != nil {
		return d.writeErr
	}
	var problems []string
	if d.a.ctx.Err() != nil {
		problems = append(problems, fmt.Sprintf("interrupted with %d of %s not moved yet: run `felixctl cluster drain %s` again to move the rest",
			total-moved, replicaCount(total), b))
	}
	if len(d.notMoved) > 0 {
		problems = append(problems, fmt.Sprintf("the drain stopped with %d of %s not moved (%s): run `felixctl cluster drain %s` again once that is fixed",
			total-moved, replicaCount(total), strings.Join(d.notMoved, "; "), b))
	}
	if len(d.notVoter) > 0 {
		what, goes := "1 new replica did not become a voter", "it goes on joining: follow it"
		if len(d.notVoter) > 1 {
			what, goes = fmt.Sprintf("%d new replicas did not become voters", len(d.notVoter)), "they go on joining: follow them"
		}
		problems = append(problems, fmt.Sprintf("%s within --wait %s (%s); %s with `felixctl stream info STREAM`, and remove %s once every new replica is a voter",
			what, d.cmd.Wait, strings.Join(d.notVoter, ", "), goes, b))
	}
	if len(d.unmovable) > 0 {
		problems = append(problems, fmt.Sprintf("%s of replication factor 1 stay on %s: their logs cannot move; bring %s back to serve them, or, to remove it (`felixctl cluster remove %s`), delete their streams (%s) first",
			shardsCount(len(d.unmovable)), b, b, b, strings.Join(streamsOf(d.unmovable), ", ")))
	}
	if len(problems) == 0 {
		return nil
	}
	return errors.New(strings.Join(problems, ". "))
}

// shardNames returns ids as stream/shard.
func shardNames(ids []shardmap.ShardID) []string {
	out := []string{}
	for _, id := range ids {
		out = append(out, id.String())
	}
	return out
}

// streamsOf returns the streams of ids, each once, in order.
func streamsOf(ids []shardmap.ShardID) []string {
	var out []string
	for _, id := range ids {
		if len(out) == 0 || out[len(out)-1] != id.Stream {
			out = append(out, id.Stream)
		}
	}
	return out
}

func replicaCount(n int) string { return fmt.Sprintf("%d replica%s", n, plural(n)) }
func shardsCount(n int) string  { return fmt.Sprintf("%d shard%s", n, plural(n)) }
