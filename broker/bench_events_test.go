package broker

import (
	"context"
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
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(itel.NewSpanBuffer(itel.Discard{}, itel.SpanBufferOptions{})),
		sdktrace.WithIDGenerator(msgtrace.IDs{}))
	defer tp.Shutdown(context.Background())
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())
	br := &Broker{cfg: Config{NodeID: "broker-0"}}
	tel, err := newTelemetry(br, tp, mp)
	if err != nil {
		b.Fatal(err)
	}
	defer tel.close()
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: msgtrace.NewTraceID(), SpanID: msgtrace.NewSpanID(), TraceFlags: trace.FlagsSampled})
	pub := &transport.Publish{Stream: "bench", Value: make([]byte, 128), Headers: msgtrace.WithRecordContext(parent, nil)}
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
