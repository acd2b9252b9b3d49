package broker

import (
	"fmt"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// walMetrics returns a broker's felix.wal.fsync.duration count, the sum
// of felix.wal.batch.records and felix.wal.written's total.
func walMetrics(t *testing.T, r *sdkmetric.ManualReader) (fsyncs uint64, records, written int64) {
	t.Helper()
	eachMetric(t, r, func(m metricdata.Metrics) {
		switch d := m.Data.(type) {
		case metricdata.Histogram[float64]:
			if m.Name == "felix.wal.fsync.duration" {
				for _, dp := range d.DataPoints {
					fsyncs += dp.Count
				}
			}
		case metricdata.Histogram[int64]:
			if m.Name == "felix.wal.batch.records" {
				for _, dp := range d.DataPoints {
					records += dp.Sum
				}
			}
		case metricdata.Sum[int64]:
			if m.Name == "felix.wal.written" {
				for _, dp := range d.DataPoints {
					written += dp.Value
				}
			}
		}
	})
	return fsyncs, records, written
}

// TestReplicaSyncMetrics: a replicated shard's writes and fsyncs count in
// the brokers' felix.wal.fsync.duration, felix.wal.batch.records and
// felix.wal.written on every replica, the leader's and the followers', as
// a shard log's do.
func TestReplicaSyncMetrics(t *testing.T) {
	readers := map[string]*sdkmetric.ManualReader{}
	ip := startInprocWith(t, func(c *Config) {
		readers[c.NodeID] = sdkmetric.NewManualReader()
		c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(readers[c.NodeID]))
	}, 3, shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	l := waitOwnerLeads(t, ip, ip.brokers, id)
	const records = 10
	value := fmt.Sprintf("%0100d", 0)
	for i := range records {
		if f, ok := publishVia(t, ip, l, "r3", 0, uint64(i+1), value).(*transport.Ack); !ok {
			t.Fatalf("publish %d: %+v", i, f)
		}
	}
	// The telemetry is recorded off the path, within milliseconds; a
	// follower may still be syncing the last entry.
	deadline := time.Now().Add(waitFor)
	for _, b := range ip.brokers {
		for {
			fsyncs, recs, written := walMetrics(t, readers[b.NodeID()])
			if fsyncs >= records/2 && recs >= records && written >= records*int64(len(value)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d fsyncs of %d records and %d bytes written recorded for %d records of %d bytes, one at a time", b.NodeID(), fsyncs, recs, written, records, len(value))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
