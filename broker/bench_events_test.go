package broker

import (
	"context"
	"maps"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/felix-broker/felix/internal/msgtrace"
	itel "github.com/felix-broker/felix/internal/telemetry"
	"github.com/felix-broker/felix/transport"
	"github.com/felix-broker/felix/wal"
)

// BenchmarkBuildEvents measures what telemetry builds per answered record
// (spans and latencies), on a forwarder and on an owner.
func BenchmarkBuildEvents(b *testing.B) {
	tel, headers := benchTelemetry(b)
	pub := &transport.Publish{Stream: "bench", Value: make([]byte, 128), Headers: headers}
	b.Run("forwarder", func(b *testing.B) {
		for b.Loop() {
			ev := tel.received(pub, "")
			ev.taken = true
			ev.route(0, "broker-1")
			tel.forwardContext(&ev, "broker-1", nil)
			ev.answered = time.Now()
			ev.offset = 7
			tel.build(&ev)
		}
	})
	b.Run("owner", func(b *testing.B) {
		for b.Loop() {
			ev := tel.received(pub, "")
			ev.taken = true
			ev.route(0, "broker-0")
			ev.routed = time.Now()
			ev.commit = wal.Commit{Records: 1, Bytes: 150, Start: ev.routed, Sync: 100 * time.Microsecond}
			ev.answered = time.Now()
			ev.offset = 7
			tel.build(&ev)
		}
	})
}

// BenchmarkInlineEvents measures the telemetry a traced forwarded record
// costs on its path, before its answer: the forwarder's receipt and
// forward, and the owner's receipt of the forward.
func BenchmarkInlineEvents(b *testing.B) {
	tel, headers := benchTelemetry(b)
	// Teach it that reserved IDs are honoured, as the first forward does.
	{
		pub := &transport.Publish{Stream: "bench", Headers: maps.Clone(headers)}
		ev := tel.received(pub, "")
		tel.forwardContext(&ev, "broker-1", pub.Headers)
	}
	b.Run("forwarder", func(b *testing.B) {
		pub := &transport.Publish{Stream: "bench", Value: make([]byte, 128), Headers: headers}
		for b.Loop() {
			ev := tel.received(pub, "")
			_ = tel.forwardContext(&ev, "broker-1", pub.Headers)
		}
	})
	b.Run("owner", func(b *testing.B) {
		ev := tel.received(&transport.Publish{Stream: "bench", Headers: maps.Clone(headers)}, "")
		hop := tel.forwardContext(&ev, "broker-1", headers)
		for b.Loop() {
			pub := &transport.Publish{Stream: "bench", Value: make([]byte, 128), Headers: maps.Clone(hop)}
			_ = tel.received(pub, "broker-0")
		}
	})
}

// benchTelemetry returns a broker's telemetry tracing every publish (span
// IDs reserved, spans dropped in-process) and recording metrics, as
// `felixctl bench --telemetry` runs it, and the headers of a record sent
// under a sampled producer span.
func benchTelemetry(b *testing.B) (*telemetry, map[string]string) {
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(itel.NewSpanBuffer(itel.Discard{}, itel.SpanBufferOptions{})),
		sdktrace.WithIDGenerator(msgtrace.IDs{}))
	b.Cleanup(func() { tp.Shutdown(context.Background()) })
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() { mp.Shutdown(context.Background()) })
	tel, err := newTelemetry(&Broker{cfg: Config{NodeID: "broker-0"}}, tp, mp)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(tel.close)
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: msgtrace.NewTraceID(), SpanID: msgtrace.NewSpanID(), TraceFlags: trace.FlagsSampled})
	return tel, msgtrace.WithRecordContext(parent, nil)
}
