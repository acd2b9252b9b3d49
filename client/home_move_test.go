package client

import (
	"context"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
)

// TestHomeBrokerGoneForGood: the broker given to Connect is lost for good
// (its host replaced, its address changed) while the shard's owner and
// the other brokers are live in the map. Once the home has failed every
// dial for WithHomeFailover, publishes and admin requests go through
// another live broker.
func TestHomeBrokerGoneForGood(t *testing.T) {
	fc := newFakeCluster(t, 2)
	c := connect(t, fc, 0, WithHomeFailover(300*time.Millisecond))
	ctx := testCtx(t)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "s", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	fc.brokers[0].stop()
	fc.setLive("broker-0", false)
	// The map is reachable through broker-1 (refreshMap falls back once
	// the home's connection is seen closed).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		m, err := c.Map(ctx)
		if err == nil && m.Epoch == fc.currentMap().Epoch {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Map: %v", err)
		}
	}
	// An application retries a publish that failed with nothing sent; the
	// client must get it through within a few seconds.
	var err error
	// Its contexts are shorter than the dial timeout, as a dial of a host
	// that is gone takes.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err = c.Publish(pctx, "s", nil, []byte("x"), WithShard(1)) // owner broker-1 is live
		cancel()
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("publish to a shard whose owner is live, home broker gone for 10s: %v", err)
	}
	if got, want := c.Addr(), fc.brokers[1].addr; got != want {
		t.Fatalf("Addr() = %s after the move, want %s", got, want)
	}
	// Admin requests go to the new home too.
	if _, err := c.Streams(ctx); err != nil {
		t.Fatalf("Streams through the new home: %v", err)
	}
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "t", Shards: 1}); err != nil {
		t.Fatalf("CreateStream through the new home: %v", err)
	}
}

// TestHomeBrokerRestartKeepsHome: the home broker restarts at the same
// address within WithHomeFailover: the client redials it and keeps it as
// its home, though the other broker is live.
func TestHomeBrokerRestartKeepsHome(t *testing.T) {
	fc := newFakeCluster(t, 2)
	c := connect(t, fc, 0, WithHomeFailover(10*time.Second))
	ctx := testCtx(t)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "s", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, "s", nil, []byte("before"), WithShard(1)); err != nil {
		t.Fatal(err)
	}
	home := fc.brokers[0].addr
	fc.brokers[0].stop()
	// Publishes fail (and dials of the home with them) while it is down,
	// more times than the failed dials a move needs.
	for range 5 {
		pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, _ = c.Publish(pctx, "s", nil, []byte("down"), WithShard(1))
		cancel()
	}
	fc.brokers[0].start(t, home)
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = c.Publish(pctx, "s", nil, []byte("after"), WithShard(1))
		cancel()
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("publish after the home came back: %v", err)
	}
	if got := c.Addr(); got != home {
		t.Fatalf("the client moved its home to %s while %s was restarting within WithHomeFailover", got, home)
	}
}
