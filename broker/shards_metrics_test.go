package broker

import (
	"context"
	"fmt"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/felix-broker/felix/shardmap"
)

// gaugeValues collects the int64 gauge name from r, by "stream/shard"
// (or "" for a series without those labels).
func gaugeValues(t *testing.T, r *sdkmetric.ManualReader, name string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	eachMetric(t, r, func(m metricdata.Metrics) {
		if m.Name != name {
			return
		}
		g, ok := m.Data.(metricdata.Gauge[int64])
		if !ok {
			t.Fatalf("%s is a %T, want an int64 gauge", name, m.Data)
		}
		for _, dp := range g.DataPoints {
			stream, _ := dp.Attributes.Value("stream")
			shard, _ := dp.Attributes.Value("shard")
			key := ""
			if stream.AsString() != "" {
				key = stream.AsString() + "/" + shard.AsString()
			}
			out[key] = dp.Value
		}
	})
	return out
}

// eachMetric collects r and calls f with each metric.
func eachMetric(t testing.TB, r *sdkmetric.ManualReader, f func(metricdata.Metrics)) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			f(m)
		}
	}
}

// TestShardGauges: every owned shard with a log reports its size, next
// offset and records, also when its log was closed for the open-log
// budget (what it showed when it closed); ShardMetrics bounds how many.
func TestShardGauges(t *testing.T) {
	const budget, shards = 4, 10
	for _, tc := range []struct {
		name     string
		limit    int
		reported int
	}{
		{"all", 0, shards},
		{"bounded", 3, 3},
		{"off", -1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reader := sdkmetric.NewManualReader()
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			defer mp.Shutdown(context.Background())
			ip := startInprocWith(t, func(c *Config) {
				c.MaxOpenShards, c.MeterProvider, c.ShardMetrics = budget, mp, tc.limit
			}, 1, shardmap.StreamConfig{Name: "many", Shards: shards})
			b := ip.brokers[0]
			ws := openStream(t, ip.dial(b))
			seq := uint64(0)
			for shard := range shards {
				for range shard + 1 { // shard n gets n+1 records
					wantAck(t, publishShard(ws, seq, "many", shard, "v"), seq)
					seq++
				}
			}
			if n := b.shards.openLogs(); n > budget {
				t.Fatalf("%d logs open, budget %d", n, budget)
			}
			next := gaugeValues(t, reader, "felix.shard.next.offset")
			records := gaugeValues(t, reader, "felix.shard.records")
			size := gaugeValues(t, reader, "felix.shard.log.size")
			omitted := gaugeValues(t, reader, "felix.shard.metrics.omitted")
			if len(next) != tc.reported || len(records) != tc.reported || len(size) != tc.reported {
				t.Fatalf("gauges for %d/%d/%d shards, want %d: %v", len(next), len(records), len(size), tc.reported, next)
			}
			for shard := range tc.reported { // the first ones, in shard order
				id := fmt.Sprintf("many/%d", shard)
				if next[id] != int64(shard+1) || records[id] != int64(shard+1) || size[id] <= 0 {
					t.Errorf("%s: next %d, records %d, size %d; want %d, %d, > 0", id, next[id], records[id], size[id], shard+1, shard+1)
				}
			}
			if tc.limit >= 0 && omitted[""] != int64(shards-tc.reported) {
				t.Errorf("omitted %v, want %d", omitted, shards-tc.reported)
			}
		})
	}
}

// TestParkedFsyncsCounted: felix.wal.fsyncs.parked counts the
// fdatasyncs the broker's logs parked. With Config.ParkedSync every
// committer's fdatasync parks (a lone record committed inline blocks), so
// pipelined records make it grow; the counter equals the sync group's.
func TestParkedFsyncsCounted(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	ip := startInprocWith(t, func(c *Config) {
		c.MeterProvider, c.ParkedSync = mp, true
	}, 1, shardmap.StreamConfig{Name: "parked", Shards: 1})
	b := ip.brokers[0]
	ws := openStream(t, ip.dial(b))
	const n = 200
	for seq := range uint64(n) { // pipelined: the committer takes what queues behind the first
		ws.send(publish(seq, "parked", "v"))
	}
	for seq := range uint64(n) {
		wantAck(t, ws.recv(), seq)
	}
	var parked int64 = -1
	eachMetric(t, reader, func(m metricdata.Metrics) {
		if m.Name != "felix.wal.fsyncs.parked" {
			return
		}
		s, ok := m.Data.(metricdata.Sum[int64])
		if !ok || !s.IsMonotonic || len(s.DataPoints) != 1 {
			t.Fatalf("felix.wal.fsyncs.parked is %#v, want one monotonic int64 sum", m.Data)
		}
		parked = s.DataPoints[0].Value
	})
	if parked <= 0 {
		t.Fatalf("felix.wal.fsyncs.parked = %d after %d pipelined records with ParkedSync, want > 0", parked, n)
	}
	if g := b.shards.syncGroup.Parked(); uint64(parked) > g {
		t.Fatalf("felix.wal.fsyncs.parked = %d, more than the sync group's %d", parked, g)
	}
}
