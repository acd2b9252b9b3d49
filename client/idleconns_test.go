package client

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// liveConns counts the connections of clients open at b, as b sees them.
func (b *fakeBroker) liveConns() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, conn := range b.mu.conns {
		if conn.Context().Err() == nil {
			n++
		}
	}
	return n
}

// connStats returns c's ConnStats of the broker at addr.
func connStats(c *Client, addr string) ConnStats {
	for _, st := range c.ConnStats() {
		if st.Broker == addr {
			return st
		}
	}
	return ConnStats{Broker: addr}
}

// TestIdleConnClosed: the connections a replica status made to brokers
// other than the home are closed once unused for the idle timeout, as
// the brokers see; the home's is kept; the next status dials them again.
func TestIdleConnClosed(t *testing.T) {
	fc := newFakeCluster(t, 3)
	const idle = 200 * time.Millisecond
	c := connect(t, fc, 0, WithConnIdleTimeout(idle))
	ctx := testCtx(t)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "r", Shards: 1, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	replicaStatus := func() {
		t.Helper()
		sts, err := c.ReplicaStatus(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range sts {
			if st.Err != "" {
				t.Fatalf("replica status: %+v", sts)
			}
		}
	}
	replicaStatus()
	for _, b := range fc.brokers {
		if n := b.liveConns(); n != 1 {
			t.Fatalf("%s has %d connections of the client after a replica status, want 1", b.id, n)
		}
	}
	asked := time.Now()
	until(t, func() bool { return fc.brokers[1].liveConns() == 0 && fc.brokers[2].liveConns() == 0 },
		"the connections to broker-1 and broker-2, unused for the idle timeout (%v), to close: %+v", idle, c.ConnStats())
	if d := time.Since(asked); d < idle {
		t.Fatalf("connections closed %v after their last use, before the idle timeout %v", d, idle)
	}
	time.Sleep(2 * idle)
	if n := fc.brokers[0].liveConns(); n != 1 {
		t.Fatalf("the home broker has %d connections of the client, want its one kept: %+v", n, c.ConnStats())
	}
	if st := connStats(c, fc.brokers[1].addr); st.Connected || st.Dials != 1 {
		t.Fatalf("ConnStats of an idle broker closed: %+v", st)
	}
	replicaStatus()
	if st := connStats(c, fc.brokers[1].addr); !st.Connected || st.Dials != 2 {
		t.Fatalf("ConnStats of an idle broker used again: %+v, want it dialed again", st)
	}
}

// TestRemovedBrokerConnClosed: once a broker is no longer in the shard
// map, the client's unused connection to it is closed without waiting
// for the idle timeout; that of a broker still in the map is kept.
func TestRemovedBrokerConnClosed(t *testing.T) {
	fc := newFakeCluster(t, 3)
	c := connect(t, fc, 0) // the default idle timeout, longer than the test
	ctx := testCtx(t)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "r", Shards: 1, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReplicaStatus(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	// broker-2 leaves the membership (the control plane's checks are not
	// the point here: the map simply no longer names it).
	fc.mu.Lock()
	m := *fc.mu.m
	m.Epoch++
	m.Nodes = slices.DeleteFunc(slices.Clone(m.Nodes), func(n shardmap.Node) bool { return n.ID == "broker-2" })
	fc.mu.m = &m
	fc.mu.Unlock()
	if _, err := c.Map(ctx); err != nil {
		t.Fatal(err)
	}
	until(t, func() bool { return fc.brokers[2].liveConns() == 0 },
		"the connection to broker-2, no longer in the map, to close: %+v", c.ConnStats())
	if n := fc.brokers[1].liveConns(); n != 1 {
		t.Fatalf("broker-1, in the map and used within the idle timeout, has %d connections of the client, want 1", n)
	}
}

// TestIdleConnInUseKept: a connection that carries a publisher stream or
// a request in flight is not closed as idle, however long they last:
// here a publisher whose broker is no longer the home (it moved), and a
// request the broker holds unanswered.
func TestIdleConnInUseKept(t *testing.T) {
	fc := newFakeCluster(t, 2)
	const idle = 50 * time.Millisecond
	c := connect(t, fc, 0, WithConnIdleTimeout(idle))
	ctx := testCtx(t)
	p := streamPublisher(t, c, ctx)
	if _, err := p.Publish(ctx, nil, []byte("x")); err != nil {
		t.Fatal(err)
	}
	// The home moves to broker-1 (as WithHomeFailover moves it): broker-0's
	// connection now carries p's stream alone.
	next, err := c.conn(fc.brokers[1].addr)
	if err != nil {
		t.Fatal(err)
	}
	c.home.Store(next)
	time.Sleep(6 * idle)
	ack, err := p.Publish(ctx, nil, []byte("y"))
	if err != nil {
		t.Fatalf("publish on a stream whose connection stayed unused past the idle timeout: %v", err)
	}
	if st := connStats(c, fc.brokers[0].addr); ack.Via != "broker-0" || st.Dials != 1 {
		t.Fatalf("ack %+v, stats %+v: want the record on the publisher's first stream to broker-0", ack, st)
	}

	// A request broker-0 holds unanswered keeps its connection open, now
	// that p is gone.
	p.Close()
	fc.brokers[0].hangRequests.Store(true)
	rctx, cancel := context.WithTimeout(ctx, 8*idle)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.request(rctx, c.mustConn(t, fc.brokers[0].addr), &transport.Request{Op: opMapGet})
		done <- err
	}()
	time.Sleep(5 * idle)
	if n := fc.brokers[0].liveConns(); n != 1 {
		t.Fatalf("broker-0 has %d connections of the client while a request waits on one, want 1", n)
	}
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("request held unanswered: %v, want its context's deadline (its connection was not closed under it)", err)
	}
	until(t, func() bool { return fc.brokers[0].liveConns() == 0 },
		"broker-0's connection, unused once the request ended, to close: %+v", c.ConnStats())
}

// TestIdleConnHandoff: requests that start as the idle timeout closes
// the connection they are about to use never fail for it: a connection is
// closed only while nothing holds it, and a request that finds it closed
// dials again.
func TestIdleConnHandoff(t *testing.T) {
	fc := newFakeCluster(t, 2)
	c := connect(t, fc, 0, WithConnIdleTimeout(2*time.Millisecond))
	ctx := testCtx(t)
	b := c.mustConn(t, fc.brokers[1].addr)
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for g := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				if _, err := c.request(ctx, b, &transport.Request{Op: opMapGet}); err != nil {
					errs <- err
					return
				}
				time.Sleep(time.Duration((i+g)%6) * time.Millisecond) // around the idle timeout
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("request while idle connections close: %v", err)
	}
	st := connStats(c, fc.brokers[1].addr)
	if st.Dials < 2 {
		t.Fatalf("broker-1 dialed %d times: the idle timeout closed none of its connections between the requests, so the test tested nothing", st.Dials)
	}
	t.Logf("broker-1 dialed %d times", st.Dials)
}

// streamPublisher creates the stream "s" of one shard and returns a
// Publisher of it, closed when the test ends.
func streamPublisher(t *testing.T, c *Client, ctx context.Context) *Publisher {
	t.Helper()
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "s", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	p, err := c.Publisher(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// mustConn is c.conn for tests.
func (c *Client) mustConn(t *testing.T, addr string) *brokerConn {
	t.Helper()
	b, err := c.conn(addr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
