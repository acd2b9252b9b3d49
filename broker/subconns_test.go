package broker

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/shardmap"
)

// sdkClient connects an SDK client to b as the admin principal.
func sdkClient(t *testing.T, ip *inproc, b *Broker, opts ...client.Opt) (*client.Client, context.Context) {
	t.Helper()
	caFile := filepath.Join(ip.dir, "certs", "ca.crt")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	c, err := client.Connect(ctx, b.Addr().String(), append([]client.Opt{client.WithCAFile(caFile), adminCert(caFile), client.WithLogger(quiet())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, ctx
}

// TestPublishInsideRecordsLoop: the consume-transform-produce loop, one
// client with its defaults: each record of a stream is published to
// another while the subscription's shards run ahead, up to their credit,
// as another client publishes the input. What they send unread fills
// their own connection's flow-control window only, never the one the
// publish's ack comes back on (on one connection the first publish after
// the window filled waited for good).
func TestPublishInsideRecordsLoop(t *testing.T) {
	const shards, perShard = 8, 1000 // 8 MiB: more than a connection's first window, within the credit
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "in", Shards: shards}, shardmap.StreamConfig{Name: "out", Shards: 1})
	c, ctx := sdkClient(t, ip, ip.brokers[0])
	sub, err := c.Subscribe(ctx, "in", client.Earliest())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	input, _ := sdkClient(t, ip, ip.brokers[0])
	value := bytes.Repeat([]byte("x"), 1024)
	published := make(chan error, 1)
	go func() {
		for range perShard {
			for shard := range shards {
				if _, err := input.PublishAsync(ctx, "in", nil, value, client.WithShard(shard)); err != nil {
					published <- err
					return
				}
			}
		}
		published <- input.Flush(ctx)
	}()
	n := 0
	for rec, err := range sub.Records(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			time.Sleep(time.Second) // the input comes, and the shards send ahead
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Publish(pctx, "out", nil, rec.Value)
		cancel()
		if err != nil {
			t.Fatalf("publish after %d records consumed: %v", n, err)
		}
		if n++; n == 500 { // well past the first publish after the window filled
			break
		}
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}
}

// TestSubscribeMoreShardsThanOneConnectionCarries: one subscription to a
// stream of more shards on one broker than a connection may carry
// subscriptions (MaxSubsPerConn, 128) reads every shard (it failed for
// good with limit_exceeded).
func TestSubscribeMoreShardsThanOneConnectionCarries(t *testing.T) {
	const shards = 150
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "wide", Shards: shards})
	c, ctx := sdkClient(t, ip, ip.brokers[0])
	for shard := range shards {
		if _, err := c.Publish(ctx, "wide", nil, []byte("v"), client.WithShard(shard)); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := c.Subscribe(ctx, "wide", client.Earliest())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	seen := map[int]bool{}
	for rec, err := range sub.Records(ctx) {
		if err != nil {
			t.Fatalf("after %d of %d shards' records: %v", len(seen), shards, err)
		}
		seen[rec.Shard] = true
		if len(seen) == shards {
			break
		}
	}
}
