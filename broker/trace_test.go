package broker

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/msgtrace"
	"github.com/felix-broker/felix/shardmap"
)

// TestForwardedPublishIsOneTrace publishes one record with the SDK through
// a broker that does not own the shard, and checks the spans form one
// trace: SDK producer → forwarder's server span → its forward client span
// → the owner's server span → append → fsync; and that a subscriber's
// process span links to the producer span through the stored record. It
// runs with the SDK's own ID generator, where the forwarder starts its
// spans before forwarding, and with msgtrace.IDs, where it reserves their
// IDs and starts them once the record is answered.
func TestForwardedPublishIsOneTrace(t *testing.T) {
	t.Run("sdk-ids", func(t *testing.T) { testForwardedTrace(t, false, false) })
	t.Run("sdk-ids-under-app-span", func(t *testing.T) { testForwardedTrace(t, false, true) })
	t.Run("reserved-ids", func(t *testing.T) { testForwardedTrace(t, true, false) })
	t.Run("reserved-ids-under-app-span", func(t *testing.T) { testForwardedTrace(t, true, true) })
}

// testForwardedTrace publishes with a provider that reserves IDs or not,
// under an application's span or as a root.
func testForwardedTrace(t *testing.T, reserved, underApp bool) {
	spans := tracetest.NewInMemoryExporter()
	opts := []sdktrace.TracerProviderOption{sdktrace.WithSyncer(spans)}
	if reserved {
		opts = append(opts, sdktrace.WithIDGenerator(TraceIDGenerator()))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	defer tp.Shutdown(context.Background())
	ip := startInprocWith(t, func(c *Config) { c.TracerProvider = tp }, 2, shardmap.StreamConfig{Name: "orders", Shards: 1})
	owner, via := ip.owner("orders", 0), ip.nonOwner("orders", 0)

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	cl, err := client.Connect(ctx, via.Addr().String(), client.WithCAFile(filepath.Join(ip.dir, "certs", "ca.crt")), adminCert(filepath.Join(ip.dir, "certs", "ca.crt")),
		client.WithTracerProvider(tp), client.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pubCtx, app := ctx, trace.Span(nil)
	if underApp {
		pubCtx, app = tp.Tracer("app").Start(ctx, "request")
		defer app.End()
	}
	seq := uint64(0)
	publish := func() client.Ack {
		t.Helper()
		seq++
		ack, err := cl.Publish(pubCtx, "orders", []byte("k"), []byte("value"), client.WithHeaders(map[string]string{"app": "x"}),
			client.WithProducer("producer-7", seq))
		if err != nil {
			t.Fatal(err)
		}
		if !ack.Forwarded || ack.Owner != owner.NodeID() {
			t.Fatalf("ack %+v: want a forward to %s", ack, owner.NodeID())
		}
		return ack
	}
	// Spans end a moment after the ack (in batches): find waits for them.
	find := func(name string, kind trace.SpanKind) tracetest.SpanStub {
		t.Helper()
		deadline := time.Now().Add(waitFor)
		for {
			for _, s := range spans.GetSpans() {
				if s.Name == name && s.SpanKind == kind {
					return s
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s span %q among %d spans", kind, name, len(spans.GetSpans()))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if reserved {
		// The first publish and forward learn that the provider honours
		// reserved IDs (their spans start before the send); trace the
		// second, whose spans all start after the ack.
		publish()
		find("publish orders", trace.SpanKindProducer)
		find("forward orders", trace.SpanKindClient)
		find("fsync orders/0", trace.SpanKindInternal)
		if !via.tel.ids.Honoured() {
			t.Fatal("the forwarder does not reserve span IDs with TraceIDGenerator")
		}
		spans.Reset()
	}
	ack := publish()

	sub, err := cl.Subscribe(ctx, "orders", client.AtOffset(ack.Offset))
	if err != nil {
		t.Fatal(err)
	}
	var rec client.Record
	for r, err := range sub.Records(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		rec = r
		break // the process span ends when the loop body does
	}
	sub.Stop()
	if rec.Headers["app"] != "x" || rec.Headers["traceparent"] == "" {
		t.Fatalf("stored headers %v: want the application's and the producer's traceparent", rec.Headers)
	}
	if _, ok := rec.Headers[msgtrace.HopTraceparent]; ok {
		t.Fatalf("stored headers %v carry the forward hop's context", rec.Headers)
	}

	producer := find("publish orders", trace.SpanKindProducer)
	fwdServer := find("publish orders", trace.SpanKindServer)
	fwdClient := find("forward orders", trace.SpanKindClient)
	ownerServer := find("forward orders", trace.SpanKindServer)
	appendSpan := find("append orders/0", trace.SpanKindInternal)
	fsync := find("fsync orders/0", trace.SpanKindInternal)
	process := find("process orders", trace.SpanKindConsumer)

	if underApp && (producer.Parent.SpanID() != app.SpanContext().SpanID() || producer.SpanContext.TraceID() != app.SpanContext().TraceID()) {
		t.Errorf("producer span has parent %s in trace %s, want the application's span %s", producer.Parent.SpanID(),
			producer.SpanContext.TraceID(), app.SpanContext().SpanID())
	}
	if !underApp && producer.Parent.IsValid() {
		t.Errorf("producer span has parent %s, want a root", producer.Parent.SpanID())
	}
	chain := []tracetest.SpanStub{producer, fwdServer, fwdClient, ownerServer, appendSpan, fsync}
	for i, s := range chain {
		if s.SpanContext.TraceID() != producer.SpanContext.TraceID() {
			t.Errorf("%s %q is in trace %s, want %s", s.SpanKind, s.Name, s.SpanContext.TraceID(), producer.SpanContext.TraceID())
		}
		if i > 0 && s.Parent.SpanID() != chain[i-1].SpanContext.SpanID() {
			t.Errorf("%s %q has parent %s, want %s %q", s.SpanKind, s.Name, s.Parent.SpanID(), chain[i-1].SpanKind, chain[i-1].Name)
		}
	}
	// Spans are ended in batches after the fact, with the times things
	// happened: each lies within its parent.
	for i := 1; i < len(chain); i++ {
		c, p := chain[i], chain[i-1]
		if c.StartTime.Before(p.StartTime) || c.EndTime.After(p.EndTime) || !c.StartTime.Before(c.EndTime) {
			t.Errorf("%s %q %v..%v is not within its parent %q %v..%v", c.SpanKind, c.Name, c.StartTime, c.EndTime,
				p.Name, p.StartTime, p.EndTime)
		}
	}

	ownerNode, _ := via.currentMap().Node(owner.NodeID())
	record := []attribute.KeyValue{msgtrace.BodySize.Int(len("value")), msgtrace.ClientID.String("producer-7")}
	want := map[string][]attribute.KeyValue{
		"producer": append([]attribute.KeyValue{msgtrace.System, msgtrace.OpSend, msgtrace.Destination.String("orders"), msgtrace.Partition.String("0"),
			msgtrace.Offset.Int64(int64(ack.Offset)), msgtrace.Via.String(via.NodeID()), msgtrace.Forwarded.Bool(true)},
			append(record, msgtrace.Server(via.Addr().String())...)...),
		"forwarder server": append([]attribute.KeyValue{msgtrace.System, msgtrace.OpReceive, msgtrace.Destination.String("orders"), msgtrace.Partition.String("0"),
			msgtrace.NodeID.String(via.NodeID()), msgtrace.Via.String(via.NodeID()), msgtrace.Forwarded.Bool(true),
			msgtrace.Offset.Int64(int64(ack.Offset))}, record...),
		"forward client": append([]attribute.KeyValue{msgtrace.System, msgtrace.OpSend, msgtrace.Destination.String("orders"), msgtrace.Partition.String("0"),
			msgtrace.NodeID.String(via.NodeID()), msgtrace.Peer.String(owner.NodeID()), msgtrace.Forwarded.Bool(true)},
			append(record, msgtrace.Server(ownerNode.Addr)...)...),
		"owner server": append([]attribute.KeyValue{msgtrace.System, msgtrace.OpReceive, msgtrace.Destination.String("orders"), msgtrace.Partition.String("0"),
			msgtrace.NodeID.String(owner.NodeID()), msgtrace.Via.String(via.NodeID()), msgtrace.Forwarded.Bool(true),
			msgtrace.Offset.Int64(int64(ack.Offset))}, record...),
		"append": {msgtrace.Offset.Int64(int64(ack.Offset)), msgtrace.MessageID.String(fmt.Sprintf("orders/0/%d", ack.Offset))},
		"fsync":  {msgtrace.BatchSize.Int(1)},
		"process": {msgtrace.System, msgtrace.OpProcess, msgtrace.Destination.String("orders"), msgtrace.Partition.String("0"),
			msgtrace.Offset.Int64(int64(ack.Offset))},
	}
	got := map[string]tracetest.SpanStub{"producer": producer, "forwarder server": fwdServer, "forward client": fwdClient,
		"owner server": ownerServer, "append": appendSpan, "fsync": fsync, "process": process}
	for role, kvs := range want {
		have := map[attribute.Key]attribute.Value{}
		for _, kv := range got[role].Attributes {
			have[kv.Key] = kv.Value
		}
		for _, kv := range kvs {
			if v, ok := have[kv.Key]; !ok || v != kv.Value {
				t.Errorf("%s span: %s = %v, want %v", role, kv.Key, v.Emit(), kv.Value.Emit())
			}
		}
	}

	if len(process.Links) != 1 || process.Links[0].SpanContext.SpanID() != producer.SpanContext.SpanID() ||
		process.Links[0].SpanContext.TraceID() != producer.SpanContext.TraceID() {
		t.Errorf("process span links %+v, want one link to the producer span %s", process.Links, producer.SpanContext.SpanID())
	}
	if t.Failed() {
		for _, s := range spans.GetSpans() {
			t.Logf("%s %q trace %s span %s parent %s", s.SpanKind, s.Name, s.SpanContext.TraceID(), s.SpanContext.SpanID(), s.Parent.SpanID())
		}
	}
}

// TestFailedPublishSpans: a refused publish's spans say why in the
// conventions' terms: error status, error.type with the wire code's name
// (and felix.error.code), with the record's size and the broker dialed.
func TestFailedPublishSpans(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())
	ip := startInprocWith(t, func(c *Config) { c.TracerProvider = tp; c.MaxPayload = 1024 }, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	b := ip.brokers[0]
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	ca := filepath.Join(ip.dir, "certs", "ca.crt")
	cl, err := client.Connect(ctx, b.Addr().String(), client.WithCAFile(ca), adminCert(ca), client.WithTracerProvider(tp), client.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	value := make([]byte, 4096)
	if _, err := cl.Publish(ctx, "orders", nil, value); !errors.Is(err, client.ErrPayloadTooLarge) {
		t.Fatalf("publish of %d bytes: %v, want payload_too_large", len(value), err)
	}
	find := func(kind trace.SpanKind) tracetest.SpanStub {
		t.Helper()
		for deadline := time.Now().Add(waitFor); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			for _, s := range spans.GetSpans() {
				if s.Name == "publish orders" && s.SpanKind == kind {
					return s
				}
			}
		}
		t.Fatalf("no %s span", kind)
		return tracetest.SpanStub{}
	}
	want := map[trace.SpanKind][]attribute.KeyValue{
		trace.SpanKindProducer: append([]attribute.KeyValue{msgtrace.ErrorType.String("payload_too_large"),
			msgtrace.Code.String("payload_too_large"), msgtrace.BodySize.Int(len(value))}, msgtrace.Server(b.Addr().String())...),
		trace.SpanKindServer: {msgtrace.ErrorType.String("payload_too_large"), msgtrace.Code.String("payload_too_large")},
	}
	for kind, kvs := range want {
		s := find(kind)
		if s.Status.Code != codes.Error {
			t.Errorf("%s span status %v, want Error", kind, s.Status)
		}
		have := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes {
			have[kv.Key] = kv.Value
		}
		for _, kv := range kvs {
			if v, ok := have[kv.Key]; !ok || v != kv.Value {
				t.Errorf("%s span: %s = %v, want %v", kind, kv.Key, v.Emit(), kv.Value.Emit())
			}
		}
	}
	waitAllAnswered(t, b) // a refused record (its frame skipped whole) is counted answered too
}
