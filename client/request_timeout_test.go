package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
)

// Requests the SDK makes on its own behalf (the shard map) against a
// broker whose QUIC stack answers but whose request handling is stuck
// (fakeBroker.hangRequests).

// TestConnectToWedgedBroker: Connect(context.Background()) returns once
// connected and the request timeout has passed, not as long as the
// broker stays stuck (its best-effort map fetch had no bound).
func TestConnectToWedgedBroker(t *testing.T) {
	fc := newFakeCluster(t, 1)
	fc.brokers[0].hangRequests.Store(true)
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		c, err := Connect(context.Background(), fc.brokers[0].addr, fc.clientOpts(WithLogger(quiet), WithRequestTimeout(500*time.Millisecond))...)
		if c != nil {
			c.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Connect: %v", err)
		}
		t.Logf("Connect returned after %v", time.Since(start))
	case <-time.After(5 * time.Second):
		fc.close() // let Connect go
		err := <-done
		t.Fatalf("Connect(context.Background()) with a 500ms request timeout still blocked after 5s on a broker that never answers map.get (returned %v once the broker was stopped)", err)
	}
}

// TestMapFromOthersWhenHomeWedged: the home broker does not answer
// map.get; the map comes from the other broker of the cached map after
// the request timeout, as it does when home cannot be reached.
func TestMapFromOthersWhenHomeWedged(t *testing.T) {
	fc := newFakeCluster(t, 2)
	c := connect(t, fc, 0, WithRequestTimeout(300*time.Millisecond))
	ctx := testCtx(t)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "s", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	fc.brokers[0].hangRequests.Store(true)
	start := time.Now()
	m, err := c.Map(ctx)
	if err != nil {
		t.Fatalf("Map with home wedged and broker-1 up: %v", err)
	}
	if _, ok := m.Stream("s"); !ok {
		t.Fatalf("map of epoch %d has no stream s", m.Epoch)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Map took %v with a 300ms request timeout", d)
	}
	// With no other broker to ask, the timeout is the caller's error.
	fc.brokers[1].hangRequests.Store(true)
	_, err = c.Map(ctx)
	if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Map with every broker wedged: %v, want a timeout", err)
	}
	t.Logf("Map with every broker wedged: %v", err)
}

// TestSubscriptionWithWedgedHome: the shard's owner restarts while the
// client's home broker (not the owner) does not answer requests. The
// subscription's map refresh from home times out, the map comes from the
// owner, and the subscription reattaches to it (it stayed in the refresh
// for as long as home stayed stuck).
func TestSubscriptionWithWedgedHome(t *testing.T) {
	fc := newFakeCluster(t, 2)
	c := connect(t, fc, 0, WithRequestTimeout(500*time.Millisecond))
	ctx := testCtx(t)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "s", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, "s", Earliest(), Shard(1)) // owned by broker-1
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	next := func(d time.Duration) (Record, error) {
		rctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		for rec, err := range sub.Records(rctx) {
			return rec, err
		}
		return Record{}, errors.New("iterator ended")
	}
	if _, err := c.Publish(ctx, "s", nil, []byte("before"), WithShard(1)); err != nil {
		t.Fatal(err)
	}
	if rec, err := next(5 * time.Second); err != nil || string(rec.Value) != "before" {
		t.Fatalf("first record: %+v %v", rec, err)
	}

	fc.brokers[0].hangRequests.Store(true) // home wedges; publishes still served
	fc.brokers[1].restart(t)               // the owner restarts, same address
	if _, err := c.Publish(ctx, "s", nil, []byte("after"), WithShard(1)); err != nil {
		t.Fatal(err)
	}
	if rec, err := next(5 * time.Second); err != nil || string(rec.Value) != "after" {
		t.Fatalf("no record 5s after the owner came back (home wedged, request timeout 500ms): %+v %v", rec, err)
	}
}
