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

// stuckExporter is an exporter whose collector never answers: every
// export waits for its context to end.
type stuckExporter struct{ exporting chan struct{} }

func (e *stuckExporter) ExportSpans(ctx context.Context, _ []sdktrace.ReadOnlySpan) error {
	select {
	case e.exporting <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}
func (e *stuckExporter) Shutdown(context.Context) error { return nil }

// TestSpanBufferShutdownWithinItsContext: Shutdown returns when its
// context ends even while a periodic export waits on a collector that
// does not answer (it waited for that export's own 10 s timeout, one per
// batch queued, well past a process's stop timeout).
func TestSpanBufferShutdownWithinItsContext(t *testing.T) {
	exp := &stuckExporter{exporting: make(chan struct{}, 1)}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(NewSpanBuffer(exp, SpanBufferOptions{Interval: 5 * time.Millisecond, MaxBatch: 1})))
	for range 3 {
		_, s := tp.Tracer("t").Start(context.Background(), "s")
		s.End()
	}
	<-exp.exporting
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := tp.Shutdown(ctx)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Shutdown with a 100 ms context returned %v after %v", err, took)
	}
}

// hungExporter is a collector that does not answer: ExportSpans holds its
// batch until its context ends.
type hungExporter struct{ started chan int }

func (e hungExporter) ExportSpans(ctx context.Context, s []sdktrace.ReadOnlySpan) error {
	e.started <- len(s)
	<-ctx.Done()
	return ctx.Err()
}
func (hungExporter) Shutdown(context.Context) error { return nil }

// TestSpanBufferKeepsAtMostMaxQueue: "spans kept before dropping" is
// MaxQueue; with a collector that does not answer, the buffer must not
// keep more than MaxQueue spans (waiting, or held by the export under
// way) — here 20, of 40 ended.
func TestSpanBufferKeepsAtMostMaxQueue(t *testing.T) {
	exp := hungExporter{started: make(chan int, 16)}
	buf := NewSpanBuffer(exp, SpanBufferOptions{Interval: time.Hour, MaxBatch: 10, MaxQueue: 20, OnError: func(error) {}})
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(buf))
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		tp.Shutdown(ctx)
	}()
	tr := tp.Tracer("test")
	end := func(n int) {
		for range n {
			_, s := tr.Start(context.Background(), "x")
			s.End()
		}
	}
	end(10) // a full batch: the export starts, and hangs
	inExport := <-exp.started
	end(30)
	kept := uint64(40) - buf.Dropped()
	if kept > 20 {
		t.Errorf("the buffer keeps %d spans (%d in the hung export, %d dropped), MaxQueue is 20", kept, inExport, buf.Dropped())
	}
}
