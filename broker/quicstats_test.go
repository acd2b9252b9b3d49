package broker

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/felix-broker/felix/shardmap"
)

// TestQUICPacketsCounted: a forwarded publish shows in the forwarder's
// counts of its client and peer connections and in the owner's peer
// counts, and a connection that ends keeps its counts (the sums never go
// back); the counts reach felix.quic.packets.sent and .lost.
func TestQUICPacketsCounted(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	ip := startInproc(t, 2, shardmap.StreamConfig{Name: "orders", Shards: 1})
	owner, via := ip.owner("orders", 0), ip.nonOwner("orders", 0)

	conn := ip.dial(via)
	ws := openStream(t, conn)
	const n = 50
	for seq := range uint64(n) {
		ws.send(publish(seq, "orders", "v"))
		wantAck(t, ws.recv(), seq)
	}
	got := via.quic.totals()
	if got[kindClient].sent < n || got[kindPeer].sent < n {
		t.Fatalf("forwarder after %d forwarded publishes, one at a time: client conns sent %d packets, peer conns %d; want at least one per ack and per forward", n, got[kindClient].sent, got[kindPeer].sent)
	}
	if o := owner.quic.totals(); o[kindPeer].sent < n {
		t.Fatalf("owner after %d forwards: peer conns sent %d packets, want at least one per answer", n, o[kindPeer].sent)
	}

	// The client's connection ends: its counts stay in the sums.
	conn.CloseWithError(0, "test done")
	deadline := time.Now().Add(waitFor)
	for {
		via.quic.mu.Lock()
		live := 0
		for _, k := range via.quic.live {
			if k == kindClient {
				live++
			}
		}
		via.quic.mu.Unlock()
		if live == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the closed client connection is still counted live after %v", waitFor)
		}
		time.Sleep(time.Millisecond)
	}
	after := via.quic.totals()
	if after[kindClient].sent < got[kindClient].sent || after[kindClient].lost < got[kindClient].lost {
		t.Fatalf("client counts went back when the connection ended: %+v, then %+v", got[kindClient], after[kindClient])
	}

	// The metrics, on a broker of its own with a meter provider.
	one := startInprocWith(t, func(c *Config) { c.MeterProvider = mp }, 1, shardmap.StreamConfig{Name: "m", Shards: 1})
	ws = openStream(t, one.dial(one.brokers[0]))
	ws.send(publish(1, "m", "v"))
	wantAck(t, ws.recv(), 1)
	sums := map[string]int64{}
	eachMetric(t, reader, func(m metricdata.Metrics) {
		if m.Name != "felix.quic.packets.sent" && m.Name != "felix.quic.packets.lost" {
			return
		}
		s, ok := m.Data.(metricdata.Sum[int64])
		if !ok || !s.IsMonotonic {
			t.Fatalf("%s is %#v, want a monotonic int64 sum", m.Name, m.Data)
		}
		for _, dp := range s.DataPoints {
			typ, _ := dp.Attributes.Value("type")
			sums[m.Name+"/"+typ.AsString()] = dp.Value
		}
	})
	if sums["felix.quic.packets.sent/client"] < 1 {
		t.Fatalf("felix.quic.packets.sent: %v, want the client connection's packets", sums)
	}
	for _, k := range []string{"felix.quic.packets.sent/peer", "felix.quic.packets.lost/client", "felix.quic.packets.lost/peer"} {
		if _, ok := sums[k]; !ok {
			t.Fatalf("no %s in %v", k, sums)
		}
	}
}
