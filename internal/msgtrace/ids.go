package msgtrace

import (
	"context"
	"encoding/binary"
	"math/rand/v2"

	"go.opentelemetry.io/otel/trace"
)

// IDs generates trace and span IDs for an OpenTelemetry SDK tracer
// provider (sdktrace.WithIDGenerator(msgtrace.IDs{})), like the SDK's
// default, except that a span started with a context from Reserve gets the
// span ID reserved there.
//
// That lets a broker send a record on before starting the spans that
// describe it: it reserves the IDs, puts them in the hop context that
// travels with the record, and starts the spans, with their real start
// times, once the record is answered. A provider built without IDs still
// works; the broker then starts those spans before sending (see Reserves).
type IDs struct{}

type reservedKey struct{}

// reserved is what Reserve puts in a context.
type reserved struct {
	trace trace.TraceID // for a root span; zero if not reserved
	span  trace.SpanID
}

// NewIDs returns the trace and span IDs reserved in ctx, or random ones.
func (IDs) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if r, ok := ctx.Value(reservedKey{}).(reserved); ok && r.trace.IsValid() {
		return r.trace, r.span
	}
	tid := NewTraceID()
	return tid, IDs{}.NewSpanID(ctx, tid)
}

// NewSpanID returns the span ID reserved in ctx, or a random one.
func (IDs) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	if r, ok := ctx.Value(reservedKey{}).(reserved); ok {
		return r.span
	}
	return NewSpanID()
}

// NewTraceID returns a random, valid trace ID.
func NewTraceID() trace.TraceID {
	var tid trace.TraceID
	for !tid.IsValid() {
		binary.NativeEndian.PutUint64(tid[:8], rand.Uint64())
		binary.NativeEndian.PutUint64(tid[8:], rand.Uint64())
	}
	return tid
}

// NewSpanID returns a random, valid span ID.
func NewSpanID() trace.SpanID {
	var sid trace.SpanID
	for !sid.IsValid() {
		binary.NativeEndian.PutUint64(sid[:], rand.Uint64())
	}
	return sid
}

// Reserve returns ctx carrying id as the span ID of the next span started
// with it by a provider that generates IDs with IDs.
func Reserve(ctx context.Context, id trace.SpanID) context.Context {
	return context.WithValue(ctx, reservedKey{}, reserved{span: id})
}

// ReserveRoot is Reserve for a span with no parent, which also needs a
// trace ID.
func ReserveRoot(ctx context.Context, tid trace.TraceID, id trace.SpanID) context.Context {
	return context.WithValue(ctx, reservedKey{}, reserved{trace: tid, span: id})
}

// Reserves reports whether tracer's provider honours Reserve. It starts
// one span to find out, under an unsampled parent so that parent-based
// samplers do not record it; the span is never ended, so no processor
// exports it.
func Reserves(tracer trace.Tracer) bool {
	id := NewSpanID()
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: NewTraceID(), SpanID: NewSpanID(), Remote: true})
	ctx := Reserve(trace.ContextWithRemoteSpanContext(context.Background(), parent), id)
	_, sp := tracer.Start(ctx, "felix.probe")
	return sp.SpanContext().SpanID() == id
}
