package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/shardmap"
)

type streamCmd struct {
	Create streamCreateCmd `cmd:"" help:"Create a stream."`
	Ls     streamLsCmd     `cmd:"" aliases:"list" help:"List the streams."`
	Info   streamInfoCmd   `cmd:"" help:"Show a stream's configuration and the owner of each shard."`
	Rm     streamRmCmd     `cmd:"" aliases:"delete" help:"Delete a stream and its records."`
	Move   streamMoveCmd   `cmd:"" help:"Move a replicated shard's replica off a broker that is down (lost for good) to another, and follow it until it is a voter."`
}

type streamCreateCmd struct {
	Name           string        `arg:"" help:"Stream name: letters, digits, '-', '_' and '.'."`
	Shards         int           `help:"Number of shards (fixed for the stream's life)." default:"1"`
	RetentionBytes int64         `help:"Bound on each shard's log size in bytes (0: unlimited). With --replicas 3 each replica drops whole segments while the rest holds at least this much." default:"0"`
	RetentionAge   time.Duration `help:"Bound on the age of each shard's records (0: unlimited). With --replicas 3 a segment goes once its newest record is older. An idle shard's log, closed for the broker's --max-open-shards, is swept once its oldest segment has expired." default:"0"`
	Replicas       int           `help:"Replication factor: 1 (each shard on one broker) or 3 (each shard replicated by raft on three brokers, acknowledged once two have fsynced it; needs at least three brokers). Fixed for the stream's life." default:"1"`
}

type streamLsCmd struct {
}

type streamInfoCmd struct {
	Name string `arg:"" help:"Stream name."`
}

type streamRmCmd struct {
	Name  string `arg:"" help:"Stream name."`
	Force bool   `short:"f" help:"Delete without asking. felixctl asks only when its standard input is a terminal; a script's stream rm deletes at once, as with kafka-topics --delete."`
}

// streamJSON is a stream as --json prints it.
type streamJSON struct {
	Name           string `json:"name"`
	Shards         int    `json:"shards"`
	RetentionBytes int64  `json:"retention_bytes"`
	RetentionAge   string `json:"retention_age"`
	Replicas       int    `json:"replicas"`
	// Owners is the owner of each shard, as an array (owners[s] owns
	// shard s); for a replicated stream, each shard's replica set, owner
	// (the preferred leader) first. Always this shape: the map's own
	// encoding of a placement (shardmap.Placement) changes while replicas
	// move, and after.
	Owners any `json:"owners,omitempty"`
	// Moving is, for a replicated stream, each replica move under way:
	// the shard and the broker moving in (in owners already; not yet a
	// voter the control plane heard of). The text's "[moving in]".
	Moving []movingJSON `json:"moving,omitempty"`
	// State is, in stream info, the liveness of each broker owners names
	// ("live" or "down") in the map of the broker asked: the text's
	// STATE column and the state beside each replica.
	State map[string]string `json:"state,omitempty"`
	// ReplicaStatus is, for a replicated stream (stream info), what each
	// replica knows: its leader, term and committed offsets.
	ReplicaStatus []client.ReplicaState `json:"replica_status,omitempty"`
}

// movingJSON is a replica move under way, as --json prints it.
type movingJSON struct {
	Shard int    `json:"shard"`
	To    string `json:"to"`
}

func toJSON(sc shardmap.StreamConfig, owners shardmap.Placement) streamJSON {
	j := streamJSON{Name: sc.Name, Shards: sc.Shards, RetentionBytes: sc.RetentionBytes, RetentionAge: sc.RetentionAge.String(), Replicas: sc.Factor()}
	switch {
	case owners.IsZero():
	case sc.Factor() > 1:
		sets := make([][]string, owners.Len())
		for s := range sets {
			sets[s] = owners.Replicas(s)
			if to, _ := owners.Pending(s); to != "" {
				j.Moving = append(j.Moving, movingJSON{Shard: s, To: to})
			}
		}
		j.Owners = sets
	default:
		own := make([]string, owners.Len())
		for s := range own {
			own[s] = owners.Owner(s)
		}
		j.Owners = own
	}
	return j
}

// request runs f on a client of the cluster, within --timeout, and wraps
// its error with the broker and stream.
func request(a *app, g *clientFlags, stream string, f func(ctx context.Context, c *conn) error) error {
	ctx, cancel := context.WithTimeout(a.ctx, g.Timeout)
	defer cancel()
	c, err := g.connect(ctx, a, "")
	if err != nil {
		return err
	}
	defer c.Close()
	if err := f(ctx, c); err != nil {
		return &brokerError{ID: c.id, Addr: c.addr, Err: &streamError{Stream: stream, Err: err}}
	}
	return nil
}

func (s *streamCreateCmd) Run(a *app) error {
	g := a.flags
	sc := shardmap.StreamConfig{Name: s.Name, Shards: s.Shards, RetentionBytes: s.RetentionBytes, RetentionAge: s.RetentionAge, Replicas: s.Replicas}
	if err := sc.Validate(); err != nil {
		return usagef("cannot create stream %q: %v", s.Name, err)
	}
	return request(a, g, s.Name, func(ctx context.Context, c *conn) error {
		if err := c.CreateStream(ctx, sc); err != nil {
			return err
		}
		owners := owners(ctx, c, s.Name)
		if g.JSON {
			return printJSON(a.stdout, toJSON(sc, owners))
		}
		fmt.Fprintf(a.stdout, "created stream %s with %d shard%s, retention %s%s\n", sc.Name, sc.Shards, plural(sc.Shards), retention(sc), replicas(sc))
		writeOwners(a.stdout, s.Name, owners, nil)
		return nil
	})
}

func (s *streamLsCmd) Run(a *app) error {
	g := a.flags
	return request(a, g, "", func(ctx context.Context, c *conn) error {
		streams, err := c.Streams(ctx)
		if err != nil {
			return err
		}
		if g.JSON {
			for _, sc := range streams {
				if err := printJSON(a.stdout, toJSON(sc, shardmap.Placement{})); err != nil {
					return err
				}
			}
			return nil
		}
		if len(streams) == 0 {
			fmt.Fprintln(a.stdout, "no streams you may see (a principal sees the streams it has a permission on): create one with `felixctl stream create NAME --shards N`")
			return nil
		}
		tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "STREAM\tSHARDS\tREPLICAS\tRETENTION")
		for _, sc := range streams {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", sc.Name, sc.Shards, sc.Factor(), retention(sc))
		}
		return tw.Flush()
	})
}

func (s *streamInfoCmd) Run(a *app) error {
	g := a.flags
	return request(a, g, s.Name, func(ctx context.Context, c *conn) error {
		sc, err := c.StreamInfo(ctx, s.Name)
		if err != nil {
			return err
		}
		owners := owners(ctx, c, s.Name)
		var states []client.ReplicaState
		if sc.Factor() > 1 {
			if states, err = c.ReplicaStatus(ctx, s.Name); err != nil {
				return err
			}
		}
		m, _ := c.Map(ctx)
		if g.JSON {
			j := toJSON(sc, owners)
			j.ReplicaStatus = states
			if m != nil && !owners.IsZero() {
				j.State = map[string]string{}
				for shard := range owners.All() {
					for _, r := range owners.Replicas(shard) {
						j.State[r] = liveness(m, r)
					}
				}
			}
			return printJSON(a.stdout, j)
		}
		fmt.Fprintf(a.stdout, "stream %s: %d shard%s, retention %s%s\n", sc.Name, sc.Shards, plural(sc.Shards), retention(sc), replicas(sc))
		writeOwners(a.stdout, s.Name, owners, m)
		writeReplicaStatus(a.stdout, s.Name, states)
		return nil
	})
}

func (s *streamRmCmd) Run(a *app) error {
	g := a.flags
	if !s.Force && a.interactive {
		ok, err := confirm(a, fmt.Sprintf("delete stream %s and all its records?", s.Name))
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("stream %s kept: not confirmed (--force deletes without asking)", s.Name)
		}
	}
	return request(a, g, s.Name, func(ctx context.Context, c *conn) error {
		if err := c.DeleteStream(ctx, s.Name); err != nil {
			return err
		}
		if g.JSON {
			return printJSON(a.stdout, map[string]any{"deleted": s.Name})
		}
		fmt.Fprintf(a.stdout, "deleted stream %s and its records\n", s.Name)
		return nil
	})
}

// owners returns the placement of the shards of stream in the map of c's
// broker, or the zero Placement if it is not there (yet).
func owners(ctx context.Context, c *conn, stream string) shardmap.Placement {
	m, err := c.Map(ctx)
	if err != nil {
		return shardmap.Placement{}
	}
	if st, ok := m.Stream(stream); ok {
		return st.Placement
	}
	return shardmap.Placement{}
}

// writeOwners prints the shard → owner table, with each owner's liveness
// when m is given; for a replicated stream, also each shard's other
// replicas (the owner is the preferred leader: the leader of the moment
// is the raft group's, not in the map), the target of a move under way
// marked.
func writeOwners(w io.Writer, stream string, owners shardmap.Placement, m *shardmap.Map) {
	if owners.IsZero() {
		return
	}
	replicated := false
	for shard := range owners.All() {
		replicated = replicated || len(owners.Replicas(shard)) > 1
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "SHARD\tOWNER"
	if m != nil {
		head += "\tSTATE"
	}
	if replicated {
		head += "\tREPLICAS"
	}
	fmt.Fprintln(tw, head)
	for shard, owner := range owners.All() {
		line := fmt.Sprintf("%s/%d\t%s", stream, shard, owner)
		if m != nil {
			line += "\t" + liveness(m, owner)
		}
		if replicated {
			var set []string
			moving, _ := owners.Pending(shard)
			for _, r := range owners.Replicas(shard) {
				name := r
				if m != nil {
					name += " (" + liveness(m, r) + ")"
				}
				if r == moving {
					name += " [moving in]" // a move's target, not yet a voter the control plane heard of
				}
				set = append(set, name)
			}
			line += "\t" + strings.Join(set, ", ")
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
}

// writeReplicaStatus prints, for a replicated stream, each replica's
// membership (voter; or joining, then learner, for a replica that
// replaces a lost one), leader, term, committed offsets and how far it is
// behind the leader.
func writeReplicaStatus(w io.Writer, stream string, states []client.ReplicaState) {
	if len(states) == 0 {
		return
	}
	head := shardHeads(states)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tREPLICA\tMEMBER\tLEADER\tTERM\tFIRST\tCOMMITTED\tBEHIND")
	for _, st := range states {
		if st.Err != "" {
			fmt.Fprintf(tw, "%s/%d\t%s\t-\t-\t-\t-\t-\t%s\n", stream, st.Shard, st.Node, st.Err)
			continue
		}
		member := st.Member
		if member == "" {
			member = "-" // a broker of an earlier version
		}
		leader := st.Leader
		if leader == "" {
			leader = "(election)"
		}
		behind := head[st.Shard] - min(st.Next, head[st.Shard])
		fmt.Fprintf(tw, "%s/%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\n", stream, st.Shard, st.Node, member, leader, st.Term, st.First, st.Next, behind)
	}
	tw.Flush()
}

// shardHeads returns, by shard, the offsets the leader has committed
// (the offset of its next record), or, where no replica reports itself
// the leader, the most any replica of the shard has.
func shardHeads(states []client.ReplicaState) map[int]uint64 {
	head, led := map[int]uint64{}, map[int]bool{}
	for _, st := range states {
		if st.Err == "" && st.Leader == st.Node {
			head[st.Shard], led[st.Shard] = st.Next, true
		}
	}
	for _, st := range states {
		if st.Err == "" && !led[st.Shard] {
			head[st.Shard] = max(head[st.Shard], st.Next)
		}
	}
	return head
}

func liveness(m *shardmap.Map, node string) string {
	if n, ok := m.Node(node); ok && n.Live {
		return "live"
	}
	return "down"
}

// replicas says a stream's replication factor when it is not 1.
func replicas(sc shardmap.StreamConfig) string {
	if sc.Factor() == 1 {
		return ""
	}
	return fmt.Sprintf(", %d replicas per shard", sc.Factor())
}

func retention(sc shardmap.StreamConfig) string {
	switch {
	case sc.RetentionBytes == 0 && sc.RetentionAge == 0:
		return "unlimited"
	case sc.RetentionAge == 0:
		return fmt.Sprintf("%d bytes per shard", sc.RetentionBytes)
	case sc.RetentionBytes == 0:
		return sc.RetentionAge.String()
	}
	return fmt.Sprintf("%d bytes per shard or %s", sc.RetentionBytes, sc.RetentionAge)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// printJSON writes v as one line of JSON: --json is NDJSON everywhere,
// one object per line (a record, a stream, a grant, a broker's stats).
func printJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// confirm asks question on stderr and reads the answer from stdin: true
// for y or yes (any case), false for anything else, the end of input
// included.
func confirm(a *app, question string) (bool, error) {
	fmt.Fprintf(a.stderr, "%s [y/N] ", question)
	line, err := bufio.NewReader(a.stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("reading the answer: %w", err)
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true, nil
	}
	return false, nil
}
