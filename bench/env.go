package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/shardmap"
)

// env is what the scenarios run against: the cluster's brokers, one SDK
// client per broker (connected lazily), the bench streams, and the
// processes to watch. It is used by one goroutine, the one running the
// scenarios.
type env struct {
	cfg      settings
	log      *slog.Logger
	prog     *progress
	opts     []client.Opt
	nodes    []shardmap.Node     // live brokers, by id
	members  []string            // every broker in the map, sorted: what placement hashes over
	names    map[string]string   // scenario -> the stream createStream made for it
	shardMem map[memKey]shardMem // the throughput rows' memory per shard (measureShardMemory)
	clients  map[string]*client.Client
	streams  []string // created, deleted by close
	runID    string
	base     time.Time  // payload stamps count from here (monotonic)
	watch    *procWatch // the brokers' processes; nil when not ours
	ownsData bool       // the cluster is ours: leave the streams to die with it
	// notes are what the run met that its figures depend on, for the
	// report (a shard whose leadership never settled on its owner).
	notes []string
}

// newEnv connects to seed (a broker address) and learns the live brokers
// from its map.
func newEnv(ctx context.Context, cfg settings, log *slog.Logger, prog *progress, seed string, opts []client.Opt) (*env, error) {
	id := make([]byte, 4)
	rand.Read(id)
	e := &env{
		cfg: cfg, log: log, prog: prog, opts: opts,
		clients: make(map[string]*client.Client),
		names:   make(map[string]string),
		runID:   hex.EncodeToString(id),
		base:    time.Now(),
	}
	c, err := client.Connect(ctx, seed, opts...)
	if err != nil {
		return nil, fmt.Errorf("bench: connect to %s: %w", seed, err)
	}
	m, err := c.Map(ctx)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("bench: shard map from %s: %w", seed, err)
	}
	for _, n := range m.Nodes {
		e.members = append(e.members, n.ID)
		if n.Live {
			e.nodes = append(e.nodes, n)
		}
		if n.Addr == seed {
			e.clients[n.ID] = c
		}
	}
	slices.Sort(e.members)
	if len(e.nodes) == 0 {
		c.Close()
		return nil, fmt.Errorf("bench: the shard map from %s has no live broker", seed)
	}
	found := false
	for _, cl := range e.clients {
		found = found || cl == c
	}
	if !found { // seed is known by another address: keep it for admin calls
		e.clients[""] = c
	}
	return e, nil
}

// client returns the client connected to broker id.
func (e *env) client(ctx context.Context, id string) (*client.Client, error) {
	if c := e.clients[id]; c != nil {
		return c, nil
	}
	for _, n := range e.nodes {
		if n.ID != id {
			continue
		}
		c, err := client.Connect(ctx, n.Addr, e.opts...)
		if err != nil {
			return nil, fmt.Errorf("bench: connect to %s at %s: %w", id, n.Addr, err)
		}
		e.clients[id] = c
		return c, nil
	}
	return nil, fmt.Errorf("bench: no live broker %q", id)
}

// quicCounts is what the bench's QUIC connections to the brokers sent and
// declared lost (client.ConnStats).
type quicCounts struct{ sent, lost uint64 }

// quicTotals returns the packets the bench's clients have sent and lost
// so far, over all their connections.
func (e *env) quicTotals() quicCounts {
	var q quicCounts
	for _, c := range e.clients {
		for _, st := range c.ConnStats() {
			q.sent += st.PacketsSent
			q.lost += st.PacketsLost
		}
	}
	return q
}

// quicSince returns what the bench's connections sent and lost since
// before (a quicTotals).
func (e *env) quicSince(before quicCounts) *quicCounts {
	now := e.quicTotals()
	return &quicCounts{sent: now.sent - before.sent, lost: now.lost - before.lost}
}

// anyClient returns a connected client.
func (e *env) anyClient(ctx context.Context) (*client.Client, error) {
	for _, c := range e.clients {
		return c, nil
	}
	return e.client(ctx, e.nodes[0].ID)
}

// createStream creates a bench stream of shards shards and waits until
// every live broker routes by a map that has it; it returns that map.
func (e *env) createStream(ctx context.Context, scenario string, shards int) (string, *shardmap.Map, error) {
	// Its owners, and for replication factor 3 the leaders the bench
	// waits for (each shard's first replica), spread evenly.
	name := balancedName(e.streamName(scenario), shards, e.members)
	e.names[scenario] = name
	c, err := e.anyClient(ctx)
	if err != nil {
		return "", nil, err
	}
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: name, Shards: shards, Replicas: e.cfg.replicas}); err != nil {
		return "", nil, fmt.Errorf("bench: create stream %s: %w", name, err)
	}
	e.streams = append(e.streams, name)
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var m *shardmap.Map
	for _, n := range e.nodes {
		bc, err := e.client(ctx, n.ID)
		if err != nil {
			return "", nil, err
		}
		for {
			m, err = bc.Map(wctx)
			if err == nil {
				if _, ok := m.Stream(name); ok {
					break
				}
			}
			select {
			case <-wctx.Done():
				return "", nil, fmt.Errorf("bench: %s does not see stream %s after creating it: %w", n.ID, name, errors.Join(err, wctx.Err()))
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return name, m, nil
}

// deleteStream deletes the bench stream createStream(scenario) made.
// streamName is the name of scenario's bench stream at the replication
// factor of the pass under way.
func (e *env) streamName(scenario string) string {
	if e.cfg.replicas > 1 {
		return fmt.Sprintf("felix-bench-%s-%s-r%d", e.runID, scenario, e.cfg.replicas)
	}
	return fmt.Sprintf("felix-bench-%s-%s", e.runID, scenario)
}

func (e *env) deleteStream(ctx context.Context, scenario string) error {
	name, ok := e.names[scenario]
	if !ok {
		name = e.streamName(scenario)
	}
	c, err := e.anyClient(ctx)
	if err != nil {
		return err
	}
	if err := c.DeleteStream(ctx, name); err != nil {
		return fmt.Errorf("bench: delete stream %s: %w", name, err)
	}
	e.streams = slices.DeleteFunc(e.streams, func(s string) bool { return s == name })
	delete(e.names, scenario)
	return nil
}

// balanceTries bounds the names balancedName tries.
const balanceTries = 256

// balancedName returns base, or base with a numbered suffix, whichever
// name of the first balanceTries spreads shards most evenly over members
// by the control plane's placement rule (rendezvous hashing of the name,
// shard and node id; shardmap.Assign): the first whose per-broker shard
// counts differ by at most one, else the one with the smallest
// difference. Placement is a pure function of these, so one name serves
// both clusters of an A/B run. Why: with hashing alone, 6 shards over 3
// brokers land 2/2/2 in only 12% of names, and one broker in four gets
// none, so the throughput row would measure two brokers in one run and
// three in the next.
func balancedName(base string, shards int, members []string) string {
	if shards < 2 || len(members) < 2 {
		return base
	}
	best, bestSpread := base, shards+1
	for i := range balanceTries {
		name := base
		if i > 0 {
			name = fmt.Sprintf("%s-%d", base, i)
		}
		if d := placementSpread(shardmap.Assign(name, shards, members), members); d < bestSpread {
			best, bestSpread = name, d
			if d <= 1 {
				break
			}
		}
	}
	return best
}

// placementSpread is the difference between the most and the fewest
// shards p gives one of members.
func placementSpread(p shardmap.Placement, members []string) int {
	most, fewest := 0, p.Len()
	for _, id := range members {
		n := len(p.OwnedBy(id))
		most, fewest = max(most, n), min(fewest, n)
	}
	return most - fewest
}

// owner returns the owner of shard of stream in m, and another live broker
// (empty when there is only one).
func (e *env) owner(m *shardmap.Map, stream string, shard int) (owner, other string, err error) {
	n, err := m.Owner(stream, shard)
	if err != nil {
		return "", "", fmt.Errorf("bench: owner of %s/%d: %w", stream, shard, err)
	}
	for _, o := range e.nodes {
		if o.ID != n.ID {
			return n.ID, o.ID, nil
		}
	}
	return n.ID, "", nil
}

// leader returns the raft leader of shard of a replicated stream, and
// another broker: the leader is whoever acknowledges a probe record (its
// Ack.Owner). The brokers hand a shard's leadership to its owner (the
// preferred leader) within seconds of an election that put it elsewhere,
// so it probes until the owner leads (for up to 20 s), and the
// leadership does not move during the run.
func (e *env) leader(ctx context.Context, m *shardmap.Map, stream string, shard int) (leader, other string, err error) {
	c, err := e.anyClient(ctx)
	if err != nil {
		return "", "", err
	}
	owner, _, err := e.owner(m, stream, shard)
	if err != nil {
		return "", "", err
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var ack client.Ack
	for deadline := time.Now().Add(20 * time.Second); ; {
		if ack, err = c.Publish(pctx, stream, nil, []byte("felix-bench-probe"), client.WithShard(shard)); err != nil {
			return "", "", fmt.Errorf("bench: finding the leader of %s/%d: %w", stream, shard, err)
		}
		if ack.Owner == owner {
			break
		}
		if time.Now().After(deadline) {
			e.notes = append(e.notes, fmt.Sprintf("%s/%d: its leadership did not settle on its owner %s within 20 s; %s led it when the rows began (throughput publishers, which connect to the owner, were forwarded)",
				stream, shard, owner, ack.Owner))
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, o := range e.nodes {
		if o.ID != ack.Owner {
			return ack.Owner, o.ID, nil
		}
	}
	return ack.Owner, "", nil
}

// close deletes the bench streams (on a cluster that is not ours) and
// closes the clients.
func (e *env) close(ctx context.Context) error {
	var errs []error
	if !e.ownsData && len(e.streams) > 0 {
		if c, err := e.anyClient(ctx); err == nil {
			for _, s := range e.streams {
				if err := c.DeleteStream(ctx, s); err != nil {
					errs = append(errs, fmt.Errorf("bench: delete stream %s: %w", s, err))
				}
			}
		}
	}
	for _, c := range e.clients {
		c.Close()
	}
	return errors.Join(errs...)
}

// sameClock reports whether the brokers' wall clock is this process's:
// they are processes of this machine (a local cluster, the bench's own),
// so a time the owner stamped on a record can be set against the bench's
// own. (watch is set for any cluster: it holds the bench's own process.)
func (e *env) sameClock() bool { return e.ownsData }
