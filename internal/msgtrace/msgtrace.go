// Package msgtrace holds what the broker and the client SDK share to trace
// a record: the attribute keys and span names of the OpenTelemetry
// messaging conventions as Felix uses them, and the two places a W3C trace
// context travels in a record's headers.
//
// A record carries two contexts:
//
//   - its creation context, under the standard "traceparent" and
//     "tracestate" keys, set by the SDK's producer span and stored with the
//     record, so a subscriber's process span can link to the producer. No
//     broker ever rewrites it.
//   - a hop context, under "felix-hop-traceparent" (and
//     "felix-hop-tracestate", which Felix's brokers leave out: the trace's
//     tracestate is the record's own, and a second copy of it could push a
//     record at the size limit over the frame limit), set by a forwarding
//     broker on the copy it sends to the owner (the parent of the owner's
//     server span). The owner removes it before the record is checked and
//     stored.
//
// It also holds the two things that keep telemetry off a record's path:
// IDs, an ID generator that lets a span's IDs be reserved before the
// record is sent and the span started afterwards, and Deferred, which runs
// span and metric work in batches after the record is answered.
//
// The package owns no provider and reads no global: callers pass the
// tracer they were configured with. It does no I/O (Server only splits an
// address).
package msgtrace

import (
	"context"
	"maps"
	"net"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of Felix's tracers and meters.
const ScopeName = "github.com/felix-broker/felix"

// Attributes of the messaging conventions, and Felix's own.
var (
	System        = semconv.MessagingSystemKey.String("felix")
	OpSend        = semconv.MessagingOperationTypeSend
	OpReceive     = semconv.MessagingOperationTypeReceive
	OpProcess     = semconv.MessagingOperationTypeProcess
	OpNamePublish = semconv.MessagingOperationName("publish")
	OpNameForward = semconv.MessagingOperationName("forward")
	OpNameProcess = semconv.MessagingOperationName("process")
)

// Attribute keys.
const (
	Destination = semconv.MessagingDestinationNameKey        // stream
	Partition   = semconv.MessagingDestinationPartitionIDKey // shard, as a string
	MessageID   = semconv.MessagingMessageIDKey              // "stream/shard/offset"
	Offset      = attribute.Key("felix.offset")
	NodeID      = attribute.Key("felix.node.id")   // the node that made the span
	Via         = attribute.Key("felix.via")       // the broker the client published through
	Owner       = attribute.Key("felix.owner")     // the shard's owner
	Forwarded   = attribute.Key("felix.forwarded") // the record crossed a forward hop
	Peer        = attribute.Key("felix.peer.id")   // the other broker of a forward hop
	BatchSize   = attribute.Key("felix.wal.batch_records")
	Code        = attribute.Key("felix.error.code")

	// Of the general conventions, on failed spans and on spans of a
	// request to another process.
	ErrorType     = semconv.ErrorTypeKey                // a failed span's wire error code name ("unavailable"), or the SDK's cause ("connection_lost")
	BodySize      = semconv.MessagingMessageBodySizeKey // the record's value, in bytes
	ClientID      = semconv.MessagingClientIDKey        // the producer id, when the record has one
	ServerAddress = semconv.ServerAddressKey            // the broker a client span went to (the SDK's broker, a forward's owner)
	ServerPort    = semconv.ServerPortKey
)

// Server returns server.address and server.port for addr ("host:port"):
// only server.address when addr has no port, nothing when addr is "".
func Server(addr string) []attribute.KeyValue {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return []attribute.KeyValue{ServerAddress.String(addr)}
	}
	if n, err := strconv.Atoi(port); err == nil {
		return []attribute.KeyValue{ServerAddress.String(host), ServerPort.Int(n)}
	}
	return []attribute.KeyValue{ServerAddress.String(host)}
}

// Header keys.
const (
	HopTraceparent = "felix-hop-traceparent"
	HopTracestate  = "felix-hop-tracestate"
)

var tc propagation.TraceContext

// WithRecordContext returns a copy of h with sc as the record's creation
// context. h is not modified.
func WithRecordContext(sc trace.SpanContext, h map[string]string) map[string]string {
	out := make(map[string]string, len(h)+2)
	maps.Copy(out, h)
	delete(out, "tracestate") // h's belongs to h's traceparent; Inject sets sc's, if any
	tc.Inject(trace.ContextWithSpanContext(context.Background(), sc), propagation.MapCarrier(out))
	return out
}

// RecordContext returns the creation context stored in h, or an invalid
// span context if there is none. It allocates nothing when h has none.
func RecordContext(h map[string]string) trace.SpanContext {
	if _, ok := h["traceparent"]; !ok {
		return trace.SpanContext{}
	}
	return detached(trace.SpanContextFromContext(tc.Extract(context.Background(), propagation.MapCarrier(h))))
}

// detached returns sc with a tracestate of its own: the members
// ParseTraceState returns are substrings of the header it parsed, whose
// strings may point into a whole decoded frame (transport.DecodeFrame
// aliases them), which a span or link holding sc would keep alive.
func detached(sc trace.SpanContext) trace.SpanContext {
	ts := sc.TraceState()
	if ts.Len() == 0 {
		return sc
	}
	own, err := trace.ParseTraceState(ts.String()) // a new string
	if err != nil {
		return sc.WithTraceState(trace.TraceState{})
	}
	return sc.WithTraceState(own)
}

// WithHop returns a copy of h carrying sc as the hop context. h is not
// modified.
func WithHop(sc trace.SpanContext, h map[string]string) map[string]string {
	out := make(map[string]string, len(h)+2)
	maps.Copy(out, h)
	delete(out, HopTracestate)
	tc.Inject(trace.ContextWithSpanContext(context.Background(), sc), hopCarrier(out))
	return out
}

// TakeHop removes the hop context from h and returns ctx with it as the
// remote parent; ok is false (and ctx returned as is) if h has none. h
// must belong to the caller.
func TakeHop(ctx context.Context, h map[string]string) (_ context.Context, ok bool) {
	if _, ok := h[HopTraceparent]; !ok {
		return ctx, false
	}
	ctx = tc.Extract(ctx, hopCarrier(h))
	if sc := trace.SpanContextFromContext(ctx); sc.TraceState().Len() > 0 {
		ctx = trace.ContextWithRemoteSpanContext(ctx, detached(sc))
	}
	delete(h, HopTraceparent)
	delete(h, HopTracestate)
	return ctx, true
}

// StripHop removes a hop context from h (a client has no business sending
// one). It allocates nothing.
func StripHop(h map[string]string) {
	if len(h) == 0 {
		return
	}
	delete(h, HopTraceparent)
	delete(h, HopTracestate)
}

// hopCarrier maps the W3C keys to the hop keys of a header map.
type hopCarrier map[string]string

func hopKey(k string) string {
	switch k {
	case "traceparent":
		return HopTraceparent
	case "tracestate":
		return HopTracestate
	}
	return k
}

func (c hopCarrier) Get(k string) string { return c[hopKey(k)] }
func (c hopCarrier) Set(k, v string)     { c[hopKey(k)] = v }
func (c hopCarrier) Keys() []string      { return []string{"traceparent", "tracestate"} }
