package broker

import (
	"context"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/shardmap"
)

// BenchmarkPublishReplicatedInProcess is BenchmarkPublishInProcess for a
// stream of replication factor 3 on three brokers in this process (their
// three logs on the temp dir's disk): one record at a time, through the
// shard's raft leader (direct) or through a follower (forwarded). An ack
// waits for the leader's and one follower's fdatasync and a round trip
// between them over QUIC.
func BenchmarkPublishReplicatedInProcess(b *testing.B) {
	for _, forwarded := range []bool{false, true} {
		name := "direct"
		if forwarded {
			name = "forwarded"
		}
		b.Run(name, func(b *testing.B) {
			brokers, caFile := startBenchBrokers(b, 3)
			ctx := context.Background()
			connect := func(br *Broker) *client.Client {
				c, err := client.Connect(ctx, br.Addr().String(), client.WithCAFile(caFile), adminCert(caFile), client.WithLogger(quiet()))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { c.Close() })
				return c
			}
			c := connect(brokers[0])
			const stream = "bench"
			if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: stream, Shards: 1, Replicas: 3}); err != nil {
				b.Fatal(err)
			}
			waitStream(b, brokers, stream)
			probe, err := c.Publish(ctx, stream, nil, []byte("probe"), client.WithShard(0))
			if err != nil {
				b.Fatal(err)
			}
			var via *Broker
			for _, br := range brokers {
				if (br.NodeID() == probe.Owner) != forwarded {
					via = br
					break
				}
			}
			pub, err := connect(via).Publisher(ctx, stream)
			if err != nil {
				b.Fatal(err)
			}
			defer pub.Close()
			value := make([]byte, 128)
			publish := func() time.Duration {
				t0 := time.Now()
				ack, err := pub.Publish(ctx, nil, value, client.WithShard(0))
				if err != nil {
					b.Fatal(err)
				}
				if ack.Forwarded != forwarded || ack.Owner != probe.Owner {
					b.Fatalf("acked by %s (forwarded %v), want %s (forwarded %v): the leader changed", ack.Owner, ack.Forwarded, probe.Owner, forwarded)
				}
				return time.Since(t0)
			}
			closedLoop(b, publish)
		})
	}
}
