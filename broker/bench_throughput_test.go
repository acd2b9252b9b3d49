package broker

import (
	"context"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/shardmap"
)

// BenchmarkPublishThroughput pipelines 128-byte records from 64 publishers
// (one QUIC stream each, 32 in flight per stream) into one broker owning
// every shard of a 4-shard stream, all in this process. It reports acked
// durable records per second, records per fsync and the process's CPU
// time per record (publishers and broker together: cpu-µs/record, which
// unlike records/s does not depend on how many CPUs are free); run it with
// -cpuprofile to see where that goes. The broker records metrics, as
// `felix broker` does by default (its /metrics).
func BenchmarkPublishThroughput(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())
	brokers, caFile := startBenchBrokers(b, 1, func(c *Config) { c.MeterProvider = mp })
	ctx := context.Background()
	c, err := client.Connect(ctx, brokers[0].Addr().String(), client.WithCAFile(caFile), adminCert(caFile), client.WithLogger(quiet()))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	const stream, publishers, window = "bench", 64, 32
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: stream, Shards: 4}); err != nil {
		b.Fatal(err)
	}
	waitStream(b, brokers, stream)
	pubs := make([]*client.Publisher, publishers)
	for i := range pubs {
		if pubs[i], err = c.Publisher(ctx, stream); err != nil {
			b.Fatal(err)
		}
		defer pubs[i].Close()
	}
	value := make([]byte, 128)
	key := []byte("k")
	per := b.N/publishers + 1
	statsBefore := brokers[0].shards.fsyncs()
	b.ResetTimer()
	start, cpu := time.Now(), processCPU(b)
	var wg sync.WaitGroup
	for i, p := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inflight := make(chan *client.Future, window)
			drain := func() {
				if _, err := (<-inflight).Wait(ctx); err != nil {
					b.Error(err)
				}
			}
			for j := range per {
				if len(inflight) == window {
					drain()
				}
				key[0] = byte(i + j)
				f, err := p.PublishAsync(ctx, []byte{byte(i), byte(j)}, value, client.WithShard((i+j)%4))
				if err != nil {
					b.Error(err)
					return
				}
				inflight <- f
			}
			for len(inflight) > 0 {
				drain()
			}
		}()
	}
	wg.Wait()
	elapsed, cpu := time.Since(start), processCPU(b)-cpu
	b.StopTimer()
	records := per * publishers
	fsyncs := brokers[0].shards.fsyncs() - statsBefore
	b.ReportMetric(float64(records)/elapsed.Seconds(), "records/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(records), "cpu-µs/record")
	if fsyncs > 0 {
		b.ReportMetric(float64(records)/float64(fsyncs), "records/fsync")
	}
}

// fsyncs returns the fsyncs of every open log so far .
func (s *shardSet) fsyncs() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var n uint64
	for _, e := range s.mu.entries {
		select {
		case <-e.ready:
			if e.log != nil {
				n += e.log.Stats().Fsyncs
			}
		default:
		}
	}
	return n
}
