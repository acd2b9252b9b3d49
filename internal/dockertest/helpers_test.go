package dockertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"testing"

	"github.com/felix-broker/felix/client"
)

// leader returns the ctl the control plane says leads.
func (c *Cluster) leader(ctx context.Context) (*Node, error) {
	var last error
	for i := 0; ; i++ {
		members, err := c.ControlPlane(ctx, c.Brokers[i%len(c.Brokers)])
		if err == nil {
			for _, m := range members {
				if m.Role == "leader" {
					if n := c.Ctl(m.Name); n != nil {
						return n, nil
					}
				}
			}
			err = fmt.Errorf("no leader among %+v", members)
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("finding the ctl leader: %w (last: %v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// newLeader waits until a ctl other than old leads, asking every broker
// in turn, and returns it and how long after killed it was first seen.
func (c *Cluster) newLeader(ctx context.Context, old *Node, killed time.Time) (*Node, time.Duration, error) {
	var last error
	for i := 0; time.Since(killed) < failoverBound; i++ {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		members, err := c.ControlPlane(actx, c.Brokers[i%len(c.Brokers)])
		cancel()
		if err == nil {
			for _, m := range members {
				if m.Role == "leader" && m.Name != old.Name {
					if n := c.Ctl(m.Name); n != nil {
						return n, time.Since(killed), nil
					}
				}
			}
			err = fmt.Errorf("control plane %+v", members)
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil, 0, fmt.Errorf("no new ctl leader within %v of killing %s (last: %v)", failoverBound, old.Name, last)
}

// createRetrying creates a stream, retrying while the control plane
// answers unavailable (the broker's ctl is the dead one, or no leader is
// elected yet) or the request times out.
func createRetrying(ctx context.Context, cl *client.Client, cfg client.StreamConfig) error {
	deadline := time.Now().Add(failoverBound)
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := cl.CreateStream(rctx, cfg)
		cancel()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, client.ErrStreamExists):
			return nil // an attempt that timed out made it
		case time.Now().After(deadline) || ctx.Err() != nil:
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// eachBroker calls f with a client connected to each broker in turn
// and the map that broker holds, closing the client after.
func (c *Cluster) eachBroker(ctx context.Context, t *testing.T, f func(b *Node, cl *client.Client, m *client.Map)) {
	t.Helper()
	for _, b := range c.Brokers {
		cl, err := c.Client(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		m, err := cl.Map(ctx)
		if err != nil {
			cl.Close()
			t.Fatalf("%s's map: %v", b.Name, err)
		}
		f(b, cl, m)
		cl.Close()
	}
}

// checkUsable checks that every shard of stream has a live broker owner
// and takes a record through every broker.
func (c *Cluster) checkUsable(ctx context.Context, t *testing.T, stream string) {
	t.Helper()
	c.eachBroker(ctx, t, func(b *Node, cl *client.Client, m *client.Map) {
		st, ok := m.Stream(stream)
		if !ok {
			t.Errorf("%s's map (epoch %d) lacks stream %s", b.Name, m.Epoch, stream)
			return
		}
		for shard, owner := range st.Placement.All() {
			if n, ok := m.Node(owner); !ok || !n.Live {
				t.Errorf("%s/%d placed on %q, not a live broker (epoch %d)", stream, shard, owner, m.Epoch)
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			ack, err := cl.Publish(pctx, stream, nil, []byte("after the failover"), client.WithShard(shard))
			cancel()
			if err != nil {
				t.Errorf("publish to %s/%d through %s: %v", stream, shard, b.Name, err)
			} else if ack.Owner != owner {
				t.Errorf("%s/%d acked by %s, placed on %s", stream, shard, ack.Owner, owner)
			}
		}
	})
}

// publisher publishes one record at a time through one broker until its
// context ends, keyed over every shard, and keeps count.
type publisher struct {
	via    string
	acked  int
	maxGap time.Duration // longest wait for an ack
	errs   []pubErr
}

type pubErr struct {
	at  time.Time
	err error
}

func (p *publisher) run(ctx context.Context, cl *client.Client, stream string) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		start := time.Now()
		pctx, cancel := context.WithTimeout(ctx, failoverBound)
		_, err := cl.Publish(pctx, stream, []byte("k"+strconv.Itoa(i%64)), []byte(p.via))
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			p.errs = append(p.errs, pubErr{at: time.Now(), err: err})
		} else {
			p.acked++
			p.maxGap = max(p.maxGap, time.Since(start))
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2].Round(time.Millisecond)
}

// modes are the ways the control plane keeps its state that every
// scenario runs in: the ctls' embedded etcd members, and an external
// etcd cluster (felix etcd containers) reached with --etcd-endpoints.
var modes = []struct {
	name string
	opts Options
}{
	{"embedded", Options{}},
	{"external", Options{ExternalEtcd: true}},
}

// forModes runs f as a subtest in every mode (-run 'Test/external' picks
// one).
func forModes(t *testing.T, f func(t *testing.T, opts Options)) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) { f(t, m.opts) })
	}
}

// adminClient connects a superuser client through the first broker, closed
// when the test ends.
func (c *Cluster) adminClient(ctx context.Context, t *testing.T) *client.Client {
	t.Helper()
	cl, err := c.Client(ctx, c.Brokers[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// load is a publisher through every broker of the cluster, on one
// stream, until stop.
type load struct {
	pubs    []*publisher
	clients []*client.Client
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	stopped bool
}

// startLoad starts publishing to stream through every broker; the test
// ends it with stop (a cleanup stops it if the test fails first).
func (c *Cluster) startLoad(ctx context.Context, t *testing.T, stream string) *load {
	t.Helper()
	c.waitStream(ctx, t, stream)
	l := &load{}
	pctx, cancel := context.WithCancel(ctx)
	l.cancel = cancel
	t.Cleanup(l.halt)
	for _, b := range c.Brokers {
		cl, err := c.Client(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		l.clients = append(l.clients, cl)
		p := &publisher{via: b.Name}
		l.pubs = append(l.pubs, p)
		l.wg.Add(1)
		go func() { defer l.wg.Done(); p.run(pctx, cl, stream) }()
	}
	return l
}

func (l *load) halt() {
	if l.stopped {
		return
	}
	l.stopped = true
	l.cancel()
	l.wg.Wait()
	for _, cl := range l.clients {
		cl.Close()
	}
}

// stop ends the load and fails the test for every refused publish, for a
// broker through which nothing was acked, and for a stall of a third of
// failoverBound; it returns the counts and the longest wait for an ack.
func (l *load) stop(t *testing.T) (acked, refused int, maxGap time.Duration) {
	t.Helper()
	l.halt()
	for _, p := range l.pubs {
		acked += p.acked
		refused += len(p.errs)
		maxGap = max(maxGap, p.maxGap)
		for _, e := range p.errs {
			t.Errorf("publish through %s refused at %s: %v", p.via, e.at.Format("15:04:05.000"), e.err)
		}
		if p.acked == 0 {
			t.Errorf("nothing acked through %s", p.via)
		}
	}
	if maxGap > failoverBound/3 {
		t.Errorf("publishing stalled for %v", maxGap)
	}
	return acked, refused, maxGap
}

// waitStream waits until every broker's map has stream: a create returns
// once the broker it went through has it, the others a moment later.
func (c *Cluster) waitStream(ctx context.Context, t *testing.T, stream string) {
	t.Helper()
	for _, b := range c.Brokers {
		cl, err := c.Client(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		for {
			m, err := cl.Map(ctx)
			if err == nil {
				if _, ok := m.Stream(stream); ok {
					break
				}
			}
			select {
			case <-ctx.Done():
				cl.Close()
				t.Fatalf("%s's map never had stream %s: %v", b.Name, stream, err)
			case <-time.After(50 * time.Millisecond):
			}
		}
		cl.Close()
	}
}
