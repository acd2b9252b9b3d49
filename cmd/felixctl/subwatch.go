package main

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/shardmap"
)

// shardWatch checks, for `sub`, that the owner of every subscribed shard
// can be reached from here, and says on stderr when one cannot and when it
// can again. The SDK reattaches a shard with backoff on its own and says
// nothing; the watch tells the person which shard is stuck and why (its
// owner is down, its advertised name does not resolve here, or its address
// does not answer from here) while the other shards go on.
//
// It judges from the outside: the shard map (liveness), DNS, and a dial of
// the owner, made only for a shard that delivered nothing since the last
// check.
type shardWatch struct {
	a      *app
	g      *clientFlags
	c      *conn
	stream string
	shard  int // -1: every shard

	mu struct {
		sync.Mutex
		recent  map[int]bool         // shards that delivered since the last check
		problem map[int]string       // shard -> why it cannot be read now
		okUntil map[string]time.Time // owner -> until when a dial that worked is trusted
	}
}

func newShardWatch(a *app, g *clientFlags, c *conn, stream string, shard int) *shardWatch {
	w := &shardWatch{a: a, g: g, c: c, stream: stream, shard: shard}
	w.mu.recent = map[int]bool{}
	w.mu.problem = map[int]string{}
	w.mu.okUntil = map[string]time.Time{}
	return w
}

// received notes that shard delivered a record.
func (w *shardWatch) received(shard int) {
	w.mu.Lock()
	w.mu.recent[shard] = true
	w.mu.Unlock()
}

// problems returns a sentence per shard that cannot be read now.
func (w *shardWatch) problems() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	shards := make([]int, 0, len(w.mu.problem))
	for s := range w.mu.problem {
		shards = append(shards, s)
	}
	slices.Sort(shards)
	out := make([]string, len(shards))
	for i, s := range shards {
		out[i] = fmt.Sprintf("shard %s could not be read: %s", shardmap.ShardID{Stream: w.stream, Shard: s}, w.mu.problem[s])
	}
	return out
}

// run checks at once and then every interval until ctx ends.
func (w *shardWatch) run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = 2 * time.Second
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.check(ctx)
		t.Reset(interval)
	}
}

// check looks at every subscribed shard's owner once.
func (w *shardWatch) check(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, w.g.Timeout)
	defer cancel()
	m, err := w.c.Map(cctx)
	if err != nil {
		return // the home broker itself is gone: the subscription says so
	}
	st, ok := m.Stream(w.stream)
	if !ok {
		return
	}
	w.mu.Lock()
	recent := w.mu.recent
	w.mu.recent = map[int]bool{}
	w.mu.Unlock()

	// One verdict per owner: "" when it can be reached.
	verdicts := map[string]string{}
	var vmu sync.Mutex
	var wg sync.WaitGroup
	for shard, owner := range st.Placement.All() {
		if (w.shard >= 0 && shard != w.shard) || recent[shard] {
			continue
		}
		vmu.Lock()
		_, seen := verdicts[owner]
		verdicts[owner] = ""
		vmu.Unlock()
		if seen {
			continue
		}
		n, _ := m.Node(owner)
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := w.verdict(cctx, n)
			vmu.Lock()
			verdicts[owner] = v
			vmu.Unlock()
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	for shard, owner := range st.Placement.All() {
		if w.shard >= 0 && shard != w.shard {
			continue
		}
		why := verdicts[owner] // "" for a shard that delivered, or whose owner answers
		id := shardmap.ShardID{Stream: w.stream, Shard: shard}
		was := w.mu.problem[shard]
		switch {
		case why != "" && was == "":
			others := ""
			if st.Placement.Len() > 1 && w.shard < 0 {
				others = "; the other shards go on"
			}
			fmt.Fprintf(w.a.stderr, "felixctl: shard %s cannot be read: %s%s\n", id, why, others)
		case why == "" && was != "":
			fmt.Fprintf(w.a.stderr, "felixctl: shard %s can be read again (its owner %s answers)\n", id, owner)
		}
		if why == "" {
			delete(w.mu.problem, shard)
		} else {
			w.mu.problem[shard] = why
		}
	}
}

// verdict says why node cannot be reached from here, or "" if it can.
func (w *shardWatch) verdict(ctx context.Context, n shardmap.Node) string {
	name := fmt.Sprintf("%s (%s)", n.ID, n.Addr)
	if !n.Live {
		return fmt.Sprintf("its owner %s is down (the control plane has lost its lease); its records come once it is back", name)
	}
	if n.ID == w.c.id {
		return "" // the broker this subscription is attached through
	}
	w.mu.Lock()
	trusted := time.Now().Before(w.mu.okUntil[n.ID])
	w.mu.Unlock()
	if trusted {
		return ""
	}
	host, _, err := net.SplitHostPort(n.Addr)
	if err != nil {
		return fmt.Sprintf("its owner %s advertises an address that is not HOST:PORT", name)
	}
	if net.ParseIP(host) == nil {
		if _, err := net.DefaultResolver.LookupHost(ctx, host); err != nil && ctx.Err() == nil {
			return fmt.Sprintf("its owner %s advertises the name %s, which cannot be resolved from this host: set an advertised address reachable from here (felix broker --advertise)", name, host)
		}
	}
	t, err := w.g.discover(w.a)
	if err != nil {
		return ""
	}
	opts := []client.Opt{client.WithLogger(w.a.log), client.WithDialTimeout(w.g.DialTimeout), client.WithClientCertFile(t.certFile, t.keyFile)}
	if t.caFile != "" {
		opts = append(opts, client.WithCAFile(t.caFile))
	}
	cl, err := client.Connect(ctx, n.Addr, opts...)
	if err != nil {
		if ctx.Err() != nil {
			return ""
		}
		return fmt.Sprintf("its owner %s does not answer from this host, though the control plane has it live: is its advertised address reachable from here?", name)
	}
	cl.Close()
	w.mu.Lock()
	w.mu.okUntil[n.ID] = time.Now().Add(30 * time.Second)
	w.mu.Unlock()
	return ""
}
