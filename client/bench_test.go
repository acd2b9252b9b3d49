package client

import (
	"context"
	"testing"

	"github.com/felix-broker/felix/shardmap"
)

// BenchmarkPublishAsync measures the SDK's publish path against the
// in-process fake broker (no fsync): encode, window, write, ack, resolve.
func BenchmarkPublishAsync(b *testing.B) { benchPublishAsync(b) }

// BenchmarkPublishAsyncOnResolved is BenchmarkPublishAsync as the bench
// and a callback user publish: to a given shard, with a function called
// on the outcome instead of a Wait.
func BenchmarkPublishAsyncOnResolved(b *testing.B) {
	benchPublishAsync(b, WithShard(0), OnResolved(func(Ack, error) {}))
}

func benchPublishAsync(b *testing.B, opts ...PublishOpt) {
	fc := newFakeCluster(b, 1)
	ctx := context.Background()
	c, err := Connect(ctx, fc.brokers[0].addr, fc.clientOpts(WithLogger(quiet))...)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "bench", Shards: 1}); err != nil {
		b.Fatal(err)
	}
	value := make([]byte, 100)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.PublishAsync(ctx, "bench", nil, value, opts...); err != nil {
			b.Fatal(err)
		}
	}
	if err := c.Flush(ctx); err != nil {
		b.Fatal(err)
	}
}
