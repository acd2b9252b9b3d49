package replica

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/felix-broker/felix/wal"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const tickEvery = 10 * time.Millisecond

// cluster is replicas of one group on an in-memory network, with real
// directories, and one ticker goroutine that ticks every open replica.
type cluster struct {
	t    testing.TB
	net  *MemNetwork
	ids  []uint64 // every replica ever started, joiners included
	dirs map[uint64]string
	// peers is the group's configuration at creation; joiners are the
	// replicas started later with Config.Join (join).
	peers   []uint64
	joiners map[uint64]bool
	mu      struct {
		sync.Mutex
		groups map[uint64]*Group
	}
	stop chan struct{}
	done chan struct{}
	opts func(*Config)
}

func newCluster(t testing.TB, n int, seed uint64, opts func(*Config)) *cluster {
	c := openCluster(t, n, seed, opts)
	go c.tick()
	return c
}

// newClusterTickedByHand is newCluster without the ticker: a group's
// clock moves only when the test calls its Tick (see tickLeader), so a
// test can tell which tick a leader is at.
func newClusterTickedByHand(t testing.TB, n int, seed uint64, opts func(*Config)) *cluster {
	c := openCluster(t, n, seed, opts)
	close(c.done)
	return c
}

func openCluster(t testing.TB, n int, seed uint64, opts func(*Config)) *cluster {
	c := &cluster{t: t, net: NewMemNetwork(seed), dirs: map[uint64]string{}, joiners: map[uint64]bool{},
		stop: make(chan struct{}), done: make(chan struct{}), opts: opts}
	c.mu.groups = map[uint64]*Group{}
	for i := 1; i <= n; i++ {
		id := uint64(i)
		c.ids = append(c.ids, id)
		c.dirs[id] = t.TempDir()
	}
	c.peers = slices.Clone(c.ids)
	for _, id := range c.ids {
		c.start(id)
	}
	t.Cleanup(c.close)
	return c
}

func (c *cluster) tick() {
	defer close(c.done)
	tk := time.NewTicker(tickEvery)
	defer tk.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-tk.C:
		}
		c.mu.Lock()
		for _, g := range c.mu.groups {
			g.Tick()
		}
		c.mu.Unlock()
	}
}

func (c *cluster) close() {
	close(c.stop)
	<-c.done
	for _, id := range c.ids {
		c.kill(id)
	}
}

// start opens replica id from its directory and attaches it.
func (c *cluster) start(id uint64) *Group {
	cfg := Config{ID: id, Peers: c.peers, Join: c.joiners[id], Dir: c.dirs[id], Name: "orders/0",
		Transport: c.net.Transport(id), Logger: slog.New(slog.DiscardHandler),
		SegmentSize: 64 << 10}
	if c.opts != nil {
		c.opts(&cfg)
	}
	g, err := Open(cfg)
	if err != nil {
		c.t.Fatalf("open replica %d: %v", id, err)
	}
	c.net.Attach(g)
	c.mu.Lock()
	c.mu.groups[id] = g
	c.mu.Unlock()
	return g
}

// kill detaches and closes replica id, if it runs.
func (c *cluster) kill(id uint64) {
	c.net.Detach(id)
	c.mu.Lock()
	g := c.mu.groups[id]
	delete(c.mu.groups, id)
	c.mu.Unlock()
	if g != nil {
		if err := g.Close(); err != nil {
			c.t.Errorf("close replica %d: %v", id, err)
		}
	}
}

func (c *cluster) group(id uint64) *Group {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.groups[id]
}

func (c *cluster) running() []*Group {
	c.mu.Lock()
	defer c.mu.Unlock()
	var gs []*Group
	for _, id := range c.ids {
		if g := c.mu.groups[id]; g != nil {
			gs = append(gs, g)
		}
	}
	return gs
}

// leader returns a running replica that believes it leads, or nil.
func (c *cluster) leader(except ...uint64) *Group {
	for _, g := range c.running() {
		if g.IsLeader() && !contains(except, g.ID()) {
			return g
		}
	}
	return nil
}

func contains(ids []uint64, id uint64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func (c *cluster) waitLeader(except ...uint64) *Group {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if g := c.leader(except...); g != nil {
			return g
		}
		time.Sleep(tickEvery)
	}
	c.t.Fatalf("no leader elected (except %v) within 20s", except)
	return nil
}

type result struct {
	offset uint64
	ts     int64
	err    error
}

// appendTo appends a record to g and returns a channel for its result.
func appendTo(g *Group, value []byte) <-chan result {
	return appendRecordTo(g, &wal.Record{Value: value})
}

// appendRecordTo appends r to g and returns a channel for its result.
func appendRecordTo(g *Group, r *wal.Record) <-chan result {
	ch := make(chan result, 1)
	g.AppendAsync(r, func(o uint64, ts int64, err error) { ch <- result{o, ts, err} })
	return ch
}

// commit appends value through whichever replica leads, retrying refusals,
// and returns its offset.
func (c *cluster) commit(value []byte) uint64 {
	c.t.Helper()
	return c.commitRecord(&wal.Record{Value: value})
}

// commitRecord is commit for a whole record.
func (c *cluster) commitRecord(rec *wal.Record) uint64 {
	c.t.Helper()
	value := rec.Value
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		g := c.leader()
		if g == nil {
			time.Sleep(tickEvery)
			continue
		}
		select {
		case r := <-appendRecordTo(g, rec):
			if r.err == nil {
				return r.offset
			}
			if !errors.Is(r.err, ErrNotLeader) && !errors.Is(r.err, ErrDropped) {
				c.t.Fatalf("append %q: %v", value, r.err)
			}
		case <-time.After(5 * time.Second): // cut off from the majority: the outcome stays open
		}
	}
	c.t.Fatalf("append %q: not committed within 30s", value)
	return 0
}

// waitConverged waits until every running replica has committed the same
// number of records, at least min.
func (c *cluster) waitConverged(min uint64) uint64 {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		gs := c.running()
		next := gs[0].NextOffset()
		same := next >= min
		for _, g := range gs[1:] {
			same = same && g.NextOffset() == next
		}
		if same {
			return next
		}
		time.Sleep(tickEvery)
	}
	var got []string
	for _, g := range c.running() {
		got = append(got, fmt.Sprintf("%d:%d", g.ID(), g.NextOffset()))
	}
	c.t.Fatalf("replicas did not converge on at least %d records within 30s: %v", min, got)
	return 0
}

// readAll reads offsets [0, next) of g.
func readAll(t testing.TB, g *Group, next uint64) []wal.Record {
	t.Helper()
	var out []wal.Record
	for uint64(len(out)) < next {
		recs, err := g.Read(uint64(len(out)), 1000, 1<<20)
		if err != nil {
			t.Fatalf("replica %d: read from %d: %v", g.ID(), len(out), err)
		}
		if len(recs) == 0 {
			t.Fatalf("replica %d: read from %d returned nothing, next is %d", g.ID(), len(out), next)
		}
		out = append(out, recs...)
	}
	return out
}

// checkSame checks that every running replica holds the same records at
// the same offsets, dense from 0, and returns them.
func (c *cluster) checkSame(next uint64) []wal.Record {
	c.t.Helper()
	var want []wal.Record
	for i, g := range c.running() {
		recs := readAll(c.t, g, next)
		for k, r := range recs {
			if r.Offset != uint64(k) {
				c.t.Fatalf("replica %d: record %d has offset %d", g.ID(), k, r.Offset)
			}
		}
		if i == 0 {
			want = recs
			continue
		}
		for k := range recs {
			if !bytes.Equal(recs[k].Value, want[k].Value) || recs[k].Timestamp != want[k].Timestamp {
				c.t.Fatalf("replica %d differs at offset %d: %q@%d, want %q@%d", g.ID(), k,
					recs[k].Value, recs[k].Timestamp, want[k].Value, want[k].Timestamp)
			}
		}
	}
	return want
}
