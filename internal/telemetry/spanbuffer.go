package telemetry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// SpanBuffer is a span processor that batches ended spans without waking
// anyone per span: OnEnd appends to a slice under a mutex, and one
// goroutine exports every Interval, or sooner when MaxBatch spans are
// waiting. The SDK's BatchSpanProcessor hands every span to its goroutine
// through a channel, which wakes that goroutine once per span; on a small
// machine each such wake-up costs tens of microseconds of CPU that the
// publish path then competes with.
//
// When MaxQueue spans are held, waiting or in an export under way (the
// exporter is slow or down), new spans are dropped and counted
// (Dropped), never blocking the caller.
// A failed export, and spans dropped since the last export, are reported
// to OnError (by default otel.Handle, which New routes to the process's
// slog logger).
type SpanBuffer struct {
	exp      sdktrace.SpanExporter
	interval time.Duration
	maxBatch int
	maxQueue int

	mu    sync.Mutex // guards spans and exporting
	spans []sdktrace.ReadOnlySpan
	// exporting is how many spans an export under way holds (taken from
	// spans, not yet handed to the exporter and returned): they count
	// against MaxQueue with those waiting.
	exporting int
	full      chan struct{} // capacity 1: MaxBatch spans are waiting
	stop      chan struct{}
	done      chan struct{}
	// ctx is the periodic exports' (run's); cancel ends the one under
	// way when Shutdown's context ends first.
	ctx     context.Context
	cancel  context.CancelFunc
	once    sync.Once
	dropped atomic.Uint64
	onError func(error)
	// reported is the Dropped count last reported to onError; owned by
	// the export goroutine.
	reported uint64
}

// SpanBufferOptions configures a SpanBuffer; zero means the default.
type SpanBufferOptions struct {
	Interval time.Duration // how often to export; default 1s
	MaxBatch int           // spans that trigger an early export; default 2048
	MaxQueue int           // spans kept before dropping; default 8 × MaxBatch
	// OnError is told of each failed periodic export and of spans dropped;
	// default otel.Handle.
	OnError func(error)
}

// NewSpanBuffer returns a running SpanBuffer exporting to exp. Shutdown
// stops it.
func NewSpanBuffer(exp sdktrace.SpanExporter, o SpanBufferOptions) *SpanBuffer {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 2048
	}
	if o.MaxQueue <= 0 {
		o.MaxQueue = 8 * o.MaxBatch
	}
	if o.OnError == nil {
		o.OnError = otel.Handle
	}
	b := &SpanBuffer{exp: exp, interval: o.Interval, maxBatch: o.MaxBatch, maxQueue: o.MaxQueue, onError: o.OnError,
		full: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	go b.run()
	return b
}

// OnStart does nothing: spans are buffered when they end.
func (b *SpanBuffer) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd buffers s for the next export.
func (b *SpanBuffer) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	b.mu.Lock()
	if len(b.spans)+b.exporting >= b.maxQueue {
		b.mu.Unlock()
		b.dropped.Add(1)
		return
	}
	b.spans = append(b.spans, s)
	n := len(b.spans)
	b.mu.Unlock()
	if n == b.maxBatch {
		select {
		case b.full <- struct{}{}:
		default:
		}
	}
}

// Dropped returns how many spans were dropped because the queue was full.
func (b *SpanBuffer) Dropped() uint64 { return b.dropped.Load() }

func (b *SpanBuffer) run() {
	defer close(b.done)
	t := time.NewTicker(b.interval)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		case <-b.full:
		}
		if err := b.export(b.ctx); err != nil {
			b.onError(fmt.Errorf("telemetry: exporting spans: %w", err))
		}
		if d := b.dropped.Load(); d != b.reported {
			b.onError(fmt.Errorf("telemetry: span queue full (the exporter is slow or down): %d spans dropped (%d in all)", d-b.reported, d))
			b.reported = d
		}
	}
}

// export sends everything buffered, MaxBatch spans at a time, until ctx
// ends: the spans not sent then are dropped.
func (b *SpanBuffer) export(ctx context.Context) error {
	b.mu.Lock()
	spans := b.spans
	b.spans = nil
	b.exporting += len(spans)
	b.mu.Unlock()
	defer func(n int) { // the exporter has let them all go
		b.mu.Lock()
		b.exporting -= n
		b.mu.Unlock()
	}(len(spans))
	var firstErr error
	for len(spans) > 0 {
		if err := ctx.Err(); err != nil {
			b.dropped.Add(uint64(len(spans)))
			return cmp.Or(firstErr, err)
		}
		n := min(len(spans), b.maxBatch)
		ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := b.exp.ExportSpans(ectx, spans[:n]); err != nil && firstErr == nil {
			firstErr = err
		}
		cancel()
		spans = spans[n:]
	}
	return firstErr
}

// ForceFlush exports everything buffered now.
func (b *SpanBuffer) ForceFlush(ctx context.Context) error { return b.export(ctx) }

// Shutdown stops the export goroutine, exports what is left and shuts the
// exporter down, within ctx: an export under way when ctx ends (a
// collector that does not answer) is given up, and what is left dropped.
func (b *SpanBuffer) Shutdown(ctx context.Context) error {
	var err error
	b.once.Do(func() {
		close(b.stop)
		select {
		case <-b.done:
		case <-ctx.Done():
			b.cancel()
			<-b.done
		}
		b.cancel()
		err = errors.Join(b.export(ctx), b.exp.Shutdown(ctx))
	})
	return err
}
