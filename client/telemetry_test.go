package client

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/felix-broker/felix/internal/msgtrace"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestProducerSpanReserved publishes with a provider built with
// TraceIDGenerator: the first publish learns that it honours reserved
// IDs, and records go out with the context of a span that is started
// after the ack with that context, as a root and under the application's
// span.
func TestProducerSpanReserved(t *testing.T) {
	fc := newFakeCluster(t, 1)
	if err := fc.createStream(shardmap.StreamConfig{Name: "orders", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans), sdktrace.WithIDGenerator(TraceIDGenerator()))
	defer tp.Shutdown(context.Background())
	c := connect(t, fc, 0, WithTracerProvider(tp))

	ctx := testCtx(t)
	appCtx, app := tp.Tracer("app").Start(ctx, "request")
	for i, pctx := range []context.Context{ctx, ctx, appCtx} {
		ack, err := c.Publish(pctx, "orders", nil, []byte("v"))
		if err != nil {
			t.Fatal(err)
		}
		sent := msgtrace.RecordContext(fc.stored(t, "orders", ack.Offset).Headers)
		// The span is started and ended a moment after the ack.
		var producer *tracetest.SpanStub
		until(t, func() bool {
			for _, s := range spans.GetSpans() {
				if s.Name == "publish orders" && s.SpanContext.SpanID() == sent.SpanID() {
					producer = &s
				}
			}
			return producer != nil
		}, "a producer span with the span ID sent with record %d (%s)", i, sent.SpanID())
		if producer.SpanContext.TraceID() != sent.TraceID() || !producer.SpanContext.IsSampled() || !sent.IsSampled() {
			t.Errorf("publish %d: producer %v, record carries %v", i, producer.SpanContext, sent)
		}
		if i == 2 && (producer.Parent.SpanID() != app.SpanContext().SpanID() || sent.TraceID() != app.SpanContext().TraceID()) {
			t.Errorf("producer span's parent %s in trace %s, want the application's span %s", producer.Parent.SpanID(), sent.TraceID(), app.SpanContext().SpanID())
		}
		if !producer.StartTime.Before(producer.EndTime) {
			t.Errorf("publish %d: producer span %v..%v", i, producer.StartTime, producer.EndTime)
		}
	}
	app.End()
	if !c.tel.ids.Honoured() {
		t.Error("the client does not reserve producer span IDs with TraceIDGenerator")
	}
}

// TestProducerSpanSamplingMismatch uses a provider whose sampler records
// nothing: once the client has learned that the provider honours reserved
// IDs, a record goes out marked sampled (the default sampler's decision
// for a root), its span turns out unsampled, and the client goes back to
// starting spans before sending.
func TestProducerSpanSamplingMismatch(t *testing.T) {
	fc := newFakeCluster(t, 1)
	if err := fc.createStream(shardmap.StreamConfig{Name: "orders", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()), sdktrace.WithIDGenerator(TraceIDGenerator()))
	defer tp.Shutdown(context.Background())
	c := connect(t, fc, 0, WithTracerProvider(tp))
	ctx := testCtx(t)
	for range 2 { // the first learns, the second is predicted wrong
		if _, err := c.Publish(ctx, "orders", nil, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	until(t, func() bool { return !c.tel.ids.Honoured() }, "the client to stop reserving IDs after a span's sampling differed")
	ack, err := c.Publish(ctx, "orders", nil, []byte("v"))
	if err != nil {
		t.Fatal(err)
	}
	if got := msgtrace.RecordContext(fc.stored(t, "orders", ack.Offset).Headers); !got.IsValid() || got.IsSampled() {
		t.Errorf("second record carries %v, want the unsampled context of a span started before sending", got)
	}
}

// stored returns the record of stream's shard 0 at offset.
func (fc *fakeCluster) stored(t *testing.T, stream string, offset uint64) transport.Record {
	t.Helper()
	fc.mu.Lock()
	defer fc.mu.Unlock()
	log := fc.mu.logs[shardmap.ShardID{Stream: stream, Shard: 0}]
	if offset >= uint64(len(log)) {
		t.Fatalf("no record at %s/0/%d", stream, offset)
	}
	return log[offset]
}

// until waits up to 10s for cond, failing with what it waited for.
func until(t *testing.T, cond func() bool, what string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for "+what, args...)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestProducerSpanAttributes: a producer span names the broker it went to
// (server.address, server.port), the record's size and its producer id;
// a failed one has error.type, the wire code's name.
func TestProducerSpanAttributes(t *testing.T) {
	fc := newFakeCluster(t, 1)
	if err := fc.createStream(StreamConfig{Name: "orders", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())
	c := connect(t, fc, 0, WithTracerProvider(tp))
	ctx := testCtx(t)
	if _, err := c.Publish(ctx, "orders", nil, []byte("hello"), WithProducer("p-1", 0)); err != nil {
		t.Fatal(err)
	}
	// Shard 3 of a one-shard stream: the broker refuses it.
	if _, err := c.Publish(ctx, "orders", nil, []byte("hi"), WithShard(3)); !errors.Is(err, ErrUnknownStream) {
		t.Fatalf("publish to shard 3: %v, want unknown_stream", err)
	}
	var ok, failed *tracetest.SpanStub
	until(t, func() bool {
		for _, s := range spans.GetSpans() {
			if s.Name != "publish orders" {
				continue
			}
			if s.Status.Code == codes.Error {
				failed = &s
			} else {
				ok = &s
			}
		}
		return ok != nil && failed != nil
	}, "a producer span of each publish")
	server := msgtrace.Server(fc.brokers[0].addr)
	for _, tc := range []struct {
		span *tracetest.SpanStub
		want []attribute.KeyValue
		not  []attribute.Key
	}{
		{ok, append([]attribute.KeyValue{msgtrace.BodySize.Int(5), msgtrace.ClientID.String("p-1")}, server...),
			[]attribute.Key{msgtrace.ErrorType, msgtrace.Code}},
		{failed, append([]attribute.KeyValue{msgtrace.BodySize.Int(2), msgtrace.ErrorType.String("unknown_stream"),
			msgtrace.Code.String("unknown_stream"), msgtrace.Partition.String("3")}, server...),
			[]attribute.Key{msgtrace.ClientID}},
	} {
		have := map[attribute.Key]attribute.Value{}
		for _, kv := range tc.span.Attributes {
			have[kv.Key] = kv.Value
		}
		for _, kv := range tc.want {
			if v, ok := have[kv.Key]; !ok || v != kv.Value {
				t.Errorf("span %s (status %v): %s = %v, want %v", tc.span.Name, tc.span.Status.Code, kv.Key, v.Emit(), kv.Value.Emit())
			}
		}
		for _, k := range tc.not {
			if v, ok := have[k]; ok {
				t.Errorf("span %s (status %v) has %s = %v", tc.span.Name, tc.span.Status.Code, k, v.Emit())
			}
		}
	}
}

func TestErrorType(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&PublishError{Err: &transport.Error{Code: transport.CodeUnavailable}}, "unavailable"},
		{fmt.Errorf("x: %w", ErrPayloadTooLarge), "payload_too_large"},
		{&PublishError{Err: lost(&transport.Error{Code: transport.CodeShuttingDown})}, "connection_lost"},
		{&PublishError{Err: errClosedInFlight}, "closed"},
		{&PublishError{Err: &DialError{Addr: "x:1", Err: errDialTimeout}}, "dial"},
		{&PublishError{Err: context.DeadlineExceeded}, "timeout"},
		{&PublishError{Err: context.Canceled}, "canceled"},
		{errors.New("what"), "_OTHER"},
	} {
		if got := errorType(tc.err); got != tc.want {
			t.Errorf("errorType(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
