package client

import (
	"errors"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
)

// TestIdempotentGapBacksOff: a record that the owner keeps refusing
// out_of_order_sequence (a gap sending it again does not close) is sent
// again less and less often, not once a round trip until the retry
// timeout: the publisher opened a stream after another for two minutes.
// It fails once the retry timeout passes, its outcome unknown.
func TestIdempotentGapBacksOff(t *testing.T) {
	fc, c, ctx := withStream(t, WithIdempotence(), WithRetryTimeout(time.Second))
	fc.brokers[0].refuseIdempotent.Store(true)
	pub, err := c.Publisher(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	before := fc.brokers[0].published.Load()
	_, err = pub.Publish(ctx, []byte("k"), []byte("v"))
	if !errors.Is(err, ErrRetriesExhausted) {
		t.Fatalf("a record refused out of order for the whole retry timeout: %v, want ErrRetriesExhausted", err)
	}
	// Sent again after 0, 0, 10, 20, 40, 80, 160, 320 and 640 ms at
	// most within the second (the first two without waiting).
	if sent := fc.brokers[0].published.Load() - before; sent > 12 {
		t.Fatalf("the record was sent %d times within its one-second retry timeout", sent)
	}
}

// A map that gives a stream no shards (damaged, or of another version) is
// an error for an idempotent publisher, which picks shards itself: it
// divided by zero and took the application down.
func TestIdempotentPublishToAStreamOfNoShards(t *testing.T) {
	fc := newFakeCluster(t, 1)
	fc.mu.Lock()
	m := *fc.mu.m
	m.Epoch++
	m.Streams = []shardmap.Stream{{StreamConfig: shardmap.StreamConfig{Name: "z", Shards: 0}}}
	fc.mu.m = &m
	fc.mu.Unlock()
	c := connect(t, fc, 0, WithIdempotence())
	if _, err := c.Publish(testCtx(t), "z", []byte("k"), []byte("v")); err == nil {
		t.Fatal("a publish to a stream of 0 shards was acked")
	}
}
