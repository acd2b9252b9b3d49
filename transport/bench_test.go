package transport

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

func benchPublish(headers bool) *Publish {
	p := &Publish{
		Seq: 12345, Stream: "orders", Shard: -1, Key: []byte("user-00000042"),
		Value: make([]byte, 128), ProducerID: "producer-1", ProducerSeq: 777,
	}
	if headers {
		p.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	}
	return p
}

// benchCodec measures AppendFrame plus DecodeFrame of f into a reused
// buffer: the work a broker does per frame on each side.
func benchCodec(b *testing.B, f Frame) {
	buf, err := AppendFrame(nil, f)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = AppendFrame(buf[:0], f)
		if _, err := DecodeFrame(FrameType(buf[4]), buf[5:]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPublishCodec(b *testing.B) {
	b.Run("publish", func(b *testing.B) { benchCodec(b, benchPublish(false)) })
	b.Run("publish+traceparent", func(b *testing.B) { benchCodec(b, benchPublish(true)) })
	// For comparison: the same struct through msgpack reflection.
	b.Run("publish-reflect", func(b *testing.B) {
		p := benchPublish(false)
		b.ReportAllocs()
		for b.Loop() {
			data, err := msgpack.Marshal(p)
			if err != nil {
				b.Fatal(err)
			}
			var q Publish
			if err := msgpack.Unmarshal(data, &q); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkAckCodec(b *testing.B) {
	benchCodec(b, &Ack{Seq: 12345, Stream: "orders", Shard: 3, Offset: 1 << 30, Timestamp: time.Now().UnixNano(), Owner: "n2", Via: "n1", Forwarded: true})
}

func BenchmarkRecordsCodec(b *testing.B) {
	recs := make([]Record, 32)
	for i := range recs {
		recs[i] = Record{Offset: uint64(i), Timestamp: time.Now().UnixNano(), Key: []byte("user-00000042"), Value: make([]byte, 128), ProducerID: "p", ProducerSeq: uint64(i)}
	}
	benchCodec(b, &Records{Stream: "orders", Shard: 3, Records: recs})
}

// BenchmarkQUICRoundTrip echoes one 128-byte-value Publish at a time over a
// loopback QUIC stream, in process, and reports the latency percentiles.
func BenchmarkQUICRoundTrip(b *testing.B) {
	p := newPKI(b, "n1")
	benchRoundTrip(b, p, startEcho(b, p, Config{}))
}

// BenchmarkQUICRoundTripProcess is BenchmarkQUICRoundTrip against an echo
// server in another process: the cross-process floor.
func BenchmarkQUICRoundTripProcess(b *testing.B) {
	p := newPKI(b, "n1")
	benchRoundTrip(b, p, startEchoProcess(b, p))
}

func benchRoundTrip(b *testing.B, p *pki, addr string) {
	conn := dial(b, addr, ClientTLS(p.ca, &p.client, "localhost"), Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := conn.OpenStreamSync(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	r, w := NewReader(s, 0), NewWriter(s)
	pub := benchPublish(false)
	rtt := func() time.Duration {
		start := time.Now()
		if err := w.Write(pub); err != nil {
			b.Fatal(err)
		}
		if _, err := r.Read(); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for range 200 { // warm up: windows, pools, the scheduler
		rtt()
	}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		lat = append(lat, rtt())
	}
	b.StopTimer()
	slices.Sort(lat)
	pct := func(q float64) float64 {
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(pct(0.50), "p50-us")
	b.ReportMetric(pct(0.99), "p99-us")
}
