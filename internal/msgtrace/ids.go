package msgtrace

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"sync/atomic"

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
// works; the broker then starts those spans before sending (see
// Reservations).
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

// Reservations is whether a tracer honours Reserve, learned from the
// first span started with a reservation (no probe span is ever made). Its
// zero value knows nothing yet; it is safe for concurrent use.
type Reservations struct{ state atomic.Int32 } // 0 unknown, 1 honoured, 2 not

// Honoured reports whether spans may be started after the fact with
// reserved IDs: the first one started with a reservation got its ID, and
// Refuse was not called since.
func (r *Reservations) Honoured() bool { return r.state.Load() == 1 }

// Learn records whether sp, started with a reservation of id, got it. Only
// the first call counts.
func (r *Reservations) Learn(sp trace.Span, id trace.SpanID) {
	state := int32(2)
	if sp.SpanContext().SpanID() == id {
		state = 1
	}
	r.state.CompareAndSwap(0, state)
}

// Refused reports whether spans are known not to get reserved IDs, so
// that asking for them is wasted work.
func (r *Reservations) Refused() bool { return r.state.Load() == 2 }

// Refuse stops reservations for good. It reports whether they were
// honoured until now.
func (r *Reservations) Refuse() bool { return r.state.Swap(2) == 1 }
