package client

import (
	"context"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"github.com/felix-broker/felix/internal/msgtrace"
)

// WithTracerProvider traces the client's publishes and deliveries with tp:
// a producer span per publish ("publish <stream>", ended when its ack or
// error arrives), whose W3C trace context travels with the record and is
// stored with it, and a consumer span per record a subscription delivers
// ("process <stream>", spanning the loop body of [Subscription.Records]),
// linked to the producer's span. Default: no tracing, at no cost; the
// global provider is never used implicitly.
func WithTracerProvider(tp trace.TracerProvider) Opt {
	return optFunc(func(c *config) { c.tracerProvider = tp })
}

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

	publishDur metric.Float64Histogram
	delivered  metric.Int64Counter
	ok, failed []metric.RecordOption

	// later ends producer spans and records publish latencies off the
	// path of the next publish.
	later msgtrace.Deferred
}

var latencyBuckets = []float64{
	0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
	0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

func newTelemetry(cfg *config) (*telemetry, error) {
	t := &telemetry{}
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

// startPublish starts the producer span of a publish, and returns the
// headers to send: h with the span's context added (a copy), or h itself
// when not traced. The span gets its attributes when it ends
// (finishPublish): only what the record needs is done before it is sent.
func (t *telemetry) startPublish(ctx context.Context, stream string, h map[string]string) (trace.Span, map[string]string) {
	if t.tracer == nil {
		return nil, h
	}
	ctx, sp := t.tracer.Start(ctx, "publish "+stream, trace.WithSpanKind(trace.SpanKindProducer))
	if !sp.SpanContext().IsValid() {
		return sp, h
	}
	return sp, msgtrace.WithRecordContext(ctx, h)
}

// finishPublish records a resolved publish; it runs after the waiter was
// released.
func (t *telemetry) finishPublish(f *Future) {
	end := f.end
	if end.IsZero() {
		end = time.Now()
	}
	if !f.start.IsZero() {
		opt := t.ok
		if f.err != nil {
			opt = t.failed
		}
		t.publishDur.Record(context.Background(), end.Sub(f.start).Seconds(), opt...)
	}
	sp := f.span
	if sp == nil {
		return
	}
	if sp.IsRecording() {
		sp.SetAttributes(msgtrace.System, msgtrace.OpSend, msgtrace.OpNamePublish, msgtrace.Destination.String(f.stream))
		if f.shard >= 0 {
			sp.SetAttributes(msgtrace.Partition.String(strconv.Itoa(int(f.shard))))
		}
		if f.err != nil {
			sp.RecordError(f.err)
			sp.SetStatus(codes.Error, f.err.Error())
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
			msgtrace.MessageID.String(rec.Stream+"/"+strconv.Itoa(rec.Shard)+"/"+strconv.FormatUint(rec.Offset, 10)))
	}
	return sp
}
