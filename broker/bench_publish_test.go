package broker

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/ctl"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// BenchmarkPublishInProcess measures the publish path with everything in
// this process: the control plane, the brokers (real logs, real fsync on
// the temp dir's disk) and an SDK client publishing one record at a time
// (closed loop) to a one-shard stream, through the owner (direct) or
// through another broker (forwarded). It reports p50 and p99 in µs; run it
// with -cpuprofile to see where a publish spends its time without process
// boundaries in the way. The cross-process figures, next to the machine's
// floors, come from `felixctl bench`.
func BenchmarkPublishInProcess(b *testing.B) {
	for _, forwarded := range []bool{false, true} {
		name := "direct"
		if forwarded {
			name = "forwarded"
		}
		b.Run(name, func(b *testing.B) {
			brokers, caFile := startBenchBrokers(b, 2)
			ctx := context.Background()
			c, err := client.Connect(ctx, brokers[0].Addr().String(), client.WithCAFile(caFile), adminCert(caFile), client.WithLogger(quiet()))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			const stream = "bench"
			if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: stream, Shards: 1}); err != nil {
				b.Fatal(err)
			}
			waitStream(b, brokers, stream)
			owner, err := brokers[0].Map().Owner(stream, 0)
			if err != nil {
				b.Fatal(err)
			}
			via := brokers[0]
			if (via.NodeID() == owner.ID) == forwarded {
				via = brokers[1]
			}
			if via != brokers[0] {
				c.Close()
				if c, err = client.Connect(ctx, via.Addr().String(), client.WithCAFile(caFile), adminCert(caFile), client.WithLogger(quiet())); err != nil {
					b.Fatal(err)
				}
				defer c.Close()
			}
			pub, err := c.Publisher(ctx, stream)
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
				if ack.Forwarded != forwarded {
					b.Fatalf("forwarded %v, want %v", ack.Forwarded, forwarded)
				}
				return time.Since(t0)
			}
			b.ReportAllocs()
			closedLoop(b, publish)
		})
	}
}

// closedLoop warms up with 200 publishes, then measures one publish per
// benchmark iteration and reports their p50 and p99 in µs.
func closedLoop(b *testing.B, publish func() time.Duration) {
	for range 200 { // warm up: connections, windows, pools
		publish()
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		lat = append(lat, publish())
	}
	b.StopTimer()
	slices.Sort(lat)
	pct := func(q float64) float64 {
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))]) / float64(time.Microsecond)
	}
	b.ReportMetric(pct(0.50), "p50-us")
	b.ReportMetric(pct(0.99), "p99-us")
}

// startBenchBrokers starts a control plane and n brokers in this process
// and returns the brokers and the cluster CA file. Everything stops when
// the benchmark ends.
func startBenchBrokers(b *testing.B, n int, opts ...func(*Config)) ([]*Broker, string) {
	b.Helper()
	dir := b.TempDir()
	certDir := filepath.Join(dir, "certs")
	ids := []string{"ctl"}
	for i := range n {
		ids = append(ids, cluster.BrokerID(i))
	}
	if err := transport.GenerateDevCerts(certDir, ids...); err != nil {
		b.Fatal(err)
	}
	ctlTLS, err := cluster.CtlServerTLS(certDir)
	if err != nil {
		b.Fatal(err)
	}
	cs, err := ctl.New(ctl.Config{Addr: "127.0.0.1:0", DataDir: filepath.Join(dir, "ctl"), TLS: ctlTLS, Etcd: cluster.CtlEtcd(certDir, ""), LeaseTTL: time.Second,
		Superusers: []string{transport.DevAdminName}, Logger: quiet()})
	if err != nil {
		b.Fatal(err)
	}
	if err := cs.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cs.Close() })
	var brokers []*Broker
	for i := range n {
		id := cluster.BrokerID(i)
		nt, err := cluster.LoadNodeTLS(certDir, id)
		if err != nil {
			b.Fatal(err)
		}
		br, err := New(Config{
			NodeID: id, Listen: "127.0.0.1:0", DataDir: filepath.Join(dir, id),
			ServerTLS: nt.Server, PeerTLS: nt.Peer, CtlTLS: nt.Ctl, CtlAddr: cs.Addr(),
			LeaseTTL: time.Second, Logger: quiet(),
		}.with(opts))
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		err = br.Start(ctx)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { br.Close() })
		brokers = append(brokers, br)
	}
	return brokers, filepath.Join(certDir, "ca.crt")
}

// with returns c changed by opts.
func (c Config) with(opts []func(*Config)) Config {
	for _, o := range opts {
		o(&c)
	}
	return c
}

// waitStream waits until every broker's map has stream.
func waitStream(b *testing.B, brokers []*Broker, stream string) {
	b.Helper()
	deadline := time.Now().Add(waitFor)
	for _, br := range brokers {
		for {
			if m := br.Map(); m != nil {
				if _, ok := m.Stream(stream); ok {
					break
				}
			}
			if time.Now().After(deadline) {
				b.Fatal(fmt.Errorf("%s does not see stream %s", br.NodeID(), stream))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}
