package client

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"github.com/felix-broker/felix/internal/msgtrace"
	"github.com/felix-broker/felix/transport"
)

// WithTracerProvider traces the client's publishes and deliveries with tp:
// a producer span per publish ("publish <stream>", ended when its ack or
// error arrives), whose W3C trace context travels with the record and is
// stored with it, and a consumer span per record a subscription delivers
// ("process <stream>", spanning the loop body of [Subscription.Records]),
// linked to the producer's span. Default: no tracing, at no cost; the
// global provider is never used implicitly.
//
// A producer span's context must go out with the record, so by default the
// span is started before the record is sent. Build tp with
// sdktrace.WithIDGenerator(client.TraceIDGenerator()) and the client
// reserves the span's IDs instead, sends, and starts and ends the span
// afterwards, off the publish's path, with the times the publish really
// started and ended. The record carries the sampling decision the SDK's
// parent-based default sampler makes (the parent's, or sampled for a
// root); should tp's sampler ever decide otherwise, the client logs it and
// goes back to starting spans before sending.
func WithTracerProvider(tp trace.TracerProvider) Opt {
	return optFunc(func(c *config) { c.tracerProvider = tp })
}

// IDGenerator is what an OpenTelemetry SDK tracer provider generates
// trace and span IDs with (the methods of sdktrace.IDGenerator).
type IDGenerator interface {
	NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID)
	NewSpanID(ctx context.Context, traceID trace.TraceID) trace.SpanID
}

// TraceIDGenerator returns an ID generator to build a tracer provider with
// (sdktrace.WithIDGenerator), so that publishes can reserve their producer
// spans' IDs and start the spans after sending (see WithTracerProvider).
// It generates random IDs like the SDK's default.
func TraceIDGenerator() IDGenerator { return msgtrace.IDs{} }

// WithMeterProvider records the client's metrics with mp:
// felix.client.publish.duration (seconds, from publish to ack or error, by
// outcome) and felix.client.records.delivered. Default: no metrics.
func WithMeterProvider(mp metric.MeterProvider) Opt {
	return optFunc(func(c *config) { c.meterProvider = mp })
}

// telemetry is the client's instruments, created once by Connect.
type telemetry struct {
	tracer trace.Tracer // nil: tracing off
	timed  bool         // a MeterProvider was given
	// ids: tracer takes reserved IDs, so producer spans are started after
	// the send. Refused for good if a span's sampling ever differs from the
	// decision sent with its record.
	ids msgtrace.Reservations
	log *slog.Logger

	publishDur metric.Float64Histogram
	delivered  metric.Int64Counter
	ok, failed []metric.RecordOption

	// later ends producer spans and records publish latencies off the
	// path of the next publish, and calls the OnResolved functions of
	// records failed under a lock (notifyLater).
	later msgtrace.Deferred
}

var latencyBuckets = []float64{
	0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
	0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

func newTelemetry(cfg *config) (*telemetry, error) {
	t := &telemetry{log: cfg.logger}
	if cfg.tracerProvider != nil {
		t.tracer = cfg.tracerProvider.Tracer(msgtrace.ScopeName)
	}
	mp := cfg.meterProvider
	if mp == nil {
		mp = noop.NewMeterProvider()
	} else {
		t.timed = true
	}
	m := mp.Meter(msgtrace.ScopeName)
	var err error
	if t.publishDur, err = m.Float64Histogram("felix.client.publish.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from a publish to its ack or error, by outcome."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...)); err != nil {
		return nil, err
	}
	if t.delivered, err = m.Int64Counter("felix.client.records.delivered", metric.WithUnit("{record}"),
		metric.WithDescription("Records subscriptions delivered to the application.")); err != nil {
		return nil, err
	}
	t.ok = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "ok")))}
	t.failed = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "error")))}
	return t, nil
}

// startPublish does what must precede the send of f's record for its
// producer span: it reserves the span's IDs, or starts it, and returns the
// headers to send: h with the span's context added (a copy), or h itself
// when not traced. The span gets its attributes when it ends.
func (t *telemetry) startPublish(ctx context.Context, f *Future, h map[string]string) map[string]string {
	if t.tracer == nil {
		return h
	}
	o := f.obs // set: the client traces
	cfg := trace.SpanContextConfig{SpanID: msgtrace.NewSpanID(), TraceFlags: trace.FlagsSampled}
	if parent := trace.SpanContextFromContext(ctx); parent.IsValid() {
		cfg.TraceID, cfg.TraceFlags, cfg.TraceState = parent.TraceID(), parent.TraceFlags()&trace.FlagsSampled, parent.TraceState()
	} else {
		cfg.TraceID, o.root = msgtrace.NewTraceID(), true
	}
	if o.start.IsZero() {
		o.start = time.Now()
	}
	o.parent, o.reserved = ctx, trace.NewSpanContext(cfg)
	if t.ids.Honoured() {
		return msgtrace.WithRecordContext(o.reserved, h)
	}
	// Start it now, asking for the reserved IDs all the same: the first
	// publish learns whether the provider honours them.
	sp := t.producerSpan(f)
	t.ids.Learn(sp, o.reserved.SpanID())
	if sc := sp.SpanContext(); sc.IsValid() {
		return msgtrace.WithRecordContext(sc, h)
	}
	return h
}

// producerSpan returns f's producer span, starting it (at f.start, with
// its reserved IDs) if need be; nil when f is not traced.
func (t *telemetry) producerSpan(f *Future) trace.Span {
	o := f.obs
	if o == nil {
		return nil
	}
	if o.span != nil || !o.reserved.IsValid() {
		return o.span
	}
	ctx := o.parent
	switch {
	case t.ids.Refused(): // asking would be wasted work
	case o.root:
		ctx = msgtrace.ReserveRoot(ctx, o.reserved.TraceID(), o.reserved.SpanID())
	default:
		ctx = msgtrace.Reserve(ctx, o.reserved.SpanID())
	}
	_, o.span = t.tracer.Start(ctx, "publish "+f.stream, trace.WithSpanKind(trace.SpanKindProducer), trace.WithTimestamp(o.start))
	o.parent = nil
	if got := o.span.SpanContext(); t.ids.Honoured() && (got.SpanID() != o.reserved.SpanID() || got.IsSampled() != o.reserved.IsSampled()) {
		if t.ids.Refuse() {
			// Expected once with a sampler that is not parent-based with
			// always-on roots (a trace-ID ratio for roots, say).
			t.log.Info("client: tracing: a producer span did not get the IDs or sampling decision sent with its record; producer spans are now started before sending",
				"sent", o.reserved.SpanID().String(), "sent_sampled", o.reserved.IsSampled(),
				"got", got.SpanID().String(), "got_sampled", got.IsSampled())
		}
	}
	return o.span
}

// finishPublish records a resolved publish; it runs after the waiter was
// released.
func (t *telemetry) finishPublish(f *Future) {
	o := f.obs
	end := o.end
	if end.IsZero() {
		end = time.Now()
	}
	if t.timed {
		opt := t.ok
		if f.err != nil {
			opt = t.failed
		}
		t.publishDur.Record(context.Background(), end.Sub(o.start).Seconds(), opt...)
	}
	sp := t.producerSpan(f)
	if sp == nil {
		return
	}
	if sp.IsRecording() {
		sp.SetAttributes(msgtrace.System, msgtrace.OpSend, msgtrace.OpNamePublish, msgtrace.Destination.String(f.stream),
			msgtrace.BodySize.Int(o.bodySize))
		sp.SetAttributes(msgtrace.Server(o.broker)...)
		if o.producerID != "" {
			sp.SetAttributes(msgtrace.ClientID.String(o.producerID))
		}
		if f.shard >= 0 {
			sp.SetAttributes(msgtrace.Partition.String(strconv.Itoa(int(f.shard))))
		}
		if f.err != nil {
			sp.RecordError(f.err)
			sp.SetStatus(codes.Error, f.err.Error())
			sp.SetAttributes(msgtrace.ErrorType.String(errorType(f.err)))
			var werr *transport.Error
			if !errors.Is(f.err, ErrConnectionLost) && errors.As(f.err, &werr) {
				sp.SetAttributes(msgtrace.Code.String(werr.Code.String()))
			}
		} else {
			a := f.ack
			sp.SetAttributes(msgtrace.Partition.String(strconv.Itoa(a.Shard)),
				msgtrace.Offset.Int64(int64(a.Offset)),
				msgtrace.MessageID.String(a.Stream+"/"+strconv.Itoa(a.Shard)+"/"+strconv.FormatUint(a.Offset, 10)),
				msgtrace.Owner.String(a.Owner), msgtrace.Via.String(a.Via), msgtrace.Forwarded.Bool(a.Forwarded))
		}
	}
	sp.End(trace.WithTimestamp(end))
}

// errorType is a failed publish's error.type: the broker's wire code name
// ("unavailable"), or, when no broker answered, what the SDK saw
// ("connection_lost", "closed", "dial", "timeout", "canceled"), else
// "_OTHER". A low-cardinality name, as the conventions ask.
func errorType(err error) string {
	var werr *transport.Error
	var derr *DialError
	switch {
	case errors.Is(err, ErrConnectionLost):
		return "connection_lost"
	case errors.As(err, &werr):
		return werr.Code.String()
	case errors.Is(err, ErrClosed):
		return "closed"
	case errors.As(err, &derr):
		return "dial"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "_OTHER"
}

// startProcess starts the consumer span of delivering rec, a child of ctx
// linked to the producer's span stored with the record.
func (t *telemetry) startProcess(ctx context.Context, rec *Record) trace.Span {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	if sc := msgtrace.RecordContext(rec.Headers); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	_, sp := t.tracer.Start(ctx, "process "+rec.Stream, opts...)
	if sp.IsRecording() {
		sp.SetAttributes(msgtrace.System, msgtrace.OpProcess, msgtrace.OpNameProcess,
			msgtrace.Destination.String(rec.Stream), msgtrace.Partition.String(strconv.Itoa(rec.Shard)),
			msgtrace.Offset.Int64(int64(rec.Offset)),
			msgtrace.MessageID.String(rec.Stream+"/"+strconv.Itoa(rec.Shard)+"/"+strconv.FormatUint(rec.Offset, 10)),
			msgtrace.BodySize.Int(len(rec.Value)))
		if rec.ProducerID != "" {
			sp.SetAttributes(msgtrace.ClientID.String(rec.ProducerID))
		}
	}
	return sp
}
