package telemetry

import (
	"context"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

type countExporter struct {
	mu    sync.Mutex
	spans int
	calls int
}

func (e *countExporter) ExportSpans(_ context.Context, s []sdktrace.ReadOnlySpan) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.spans += len(s)
	e.calls++
	return nil
}

func (e *countExporter) Shutdown(context.Context) error { return nil }

func (e *countExporter) counts() (int, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.spans, e.calls
}

func TestSpanBufferBatchesAndFlushesOnShutdown(t *testing.T) {
	exp := &countExporter{}
	buf := NewSpanBuffer(exp, SpanBufferOptions{Interval: time.Hour, MaxBatch: 100, MaxQueue: 250})
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(buf))
	tr := tp.Tracer("test")
	for range 100 {
		_, s := tr.Start(context.Background(), "x")
		s.End()
	}
	// The 100th span fills a batch: exported without waiting for the hour.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if n, _ := exp.counts(); n == 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a full batch was not exported")
		}
		time.Sleep(time.Millisecond)
	}
	for range 300 {
		_, s := tr.Start(context.Background(), "y")
		s.End()
	}
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans, _ := exp.counts()
	if spans+int(buf.Dropped()) != 400 || spans < 250 {
		t.Fatalf("exported %d, dropped %d of 400 (queue 250)", spans, buf.Dropped())
	}
}
