package broker

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/msgtrace"
	ftel "github.com/felix-broker/felix/internal/telemetry"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
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

// TestForwardedRecordWithLargeTracestate: a record within every limit,
// whose headers carry a valid W3C traceparent and a large (valid,
// 12 KiB) tracestate, is acked by its owner when published there; the
// same record published through a tracing non-owner must be acked too.
// The forwarder copies the tracestate into felix-hop-tracestate, which
// the frame limit's 4 KiB allowance for "the headers a forwarding broker
// adds for tracing" does not cover.
func TestForwardedRecordWithLargeTracestate(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())
	const maxPayload = 64 << 10
	ip := startInprocWith(t, func(c *Config) { c.TracerProvider = tp; c.MaxPayload = maxPayload },
		2, shardmap.StreamConfig{Name: "orders", Shards: 1})
	var members []string
	for i := range 24 {
		members = append(members, fmt.Sprintf("k%02d%s=%s", i, strings.Repeat("k", 250), strings.Repeat("v", 256)))
	}
	h := map[string]string{
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"tracestate":  strings.Join(members, ","),
	}
	if ts := msgtrace.RecordContext(h).TraceState(); ts.Len() != len(members) {
		t.Fatalf("tracestate parsed to %d members, want %d", ts.Len(), len(members))
	}
	hlen := headersLen(h)
	for i, b := range []*Broker{ip.owner("orders", 0), ip.nonOwner("orders", 0)} {
		ws := openStream(t, ip.dial(b))
		p := &transport.Publish{Seq: 1, Stream: "orders", Shard: -1, Key: []byte("k"), Headers: h,
			Value: []byte(strings.Repeat("x", maxPayload-hlen-1))}
		f := ws.roundTrip(p)
		if _, ok := f.(*transport.Ack); !ok {
			t.Errorf("publish %d (to %s, owner=%v): got %T %+v, want an ack", i, b.NodeID(), i == 0, f, f)
		}
	}
	// The owner's server span of the forward keeps the producer's tracestate.
	for deadline := time.Now().Add(waitFor); ; time.Sleep(5 * time.Millisecond) {
		for _, s := range spans.GetSpans() {
			if s.Name == "forward orders" && s.SpanKind == trace.SpanKindServer {
				if n := s.SpanContext.TraceState().Len(); n != len(members) {
					t.Fatalf("owner's server span has %d tracestate members, want %d", n, len(members))
				}
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no owner server span")
		}
	}
}

// countingProcessor counts ended spans and hands them on.
type countingProcessor struct {
	sdktrace.SpanProcessor
	ended atomic.Int64
}

func (c *countingProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	c.SpanProcessor.OnEnd(s)
	c.ended.Add(1)
}

// TestBufferedSpansDoNotPinRecords: while the exporter is slow or down,
// the SpanBuffer holds up to MaxQueue spans. What they hold must not grow
// with the records they describe: here 64 spans' records of 1 MiB each
// (192 spans in all, far below MaxQueue) must not keep 64 MiB alive.
func TestBufferedSpansDoNotPinRecords(t *testing.T) {
	buf := ftel.NewSpanBuffer(ftel.Discard{}, ftel.SpanBufferOptions{Interval: time.Hour}) // a collector that is slow
	cp := &countingProcessor{SpanProcessor: buf}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(cp))
	defer tp.Shutdown(context.Background())
	const size, n = 1 << 20, 64
	ip := startInprocWith(t, func(c *Config) { c.TracerProvider = tp; c.MaxPayload = size + 1024 }, 1,
		shardmap.StreamConfig{Name: "orders", Shards: 1})
	ws := openStream(t, ip.dial(ip.brokers[0]))
	ts, _ := trace.ParseTraceState("vendor=x")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: msgtrace.NewTraceID(), SpanID: msgtrace.NewSpanID(), TraceFlags: trace.FlagsSampled, TraceState: ts})
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	for i := range n {
		p := publish(uint64(i+1), "orders", "")
		p.Key, p.Value = []byte("k"), make([]byte, size)
		p.Headers = msgtrace.WithRecordContext(sc, nil)
		if f := ws.roundTrip(p); f.Type() != transport.FrameAck {
			t.Fatalf("publish %d: %T %+v", i, f, f)
		}
	}
	for deadline := time.Now().Add(waitFor); cp.ended.Load() < 3*n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d spans ended, want %d", cp.ended.Load(), 3*n)
		}
	}
	after := heap()
	if grew := int64(after) - int64(before); grew > 16<<20 {
		t.Errorf("heap grew by %d MiB holding %d buffered spans of %d records of 1 MiB", grew>>20, cp.ended.Load(), n)
	}
}

// errorCount returns felix.errors{code} as collected from r.
func errorCount(t *testing.T, r *sdkmetric.ManualReader, code string) int64 {
	t.Helper()
	var n int64
	eachMetric(t, r, func(m metricdata.Metrics) {
		if m.Name != "felix.errors" {
			return
		}
		for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
			if v, _ := dp.Attributes.Value("code"); v.AsString() == code {
				n += dp.Value
			}
		}
	})
	return n
}

// TestRefusalsCountedOnce: felix_errors_total counts "error answers sent
// to publishers and subscribers, by wire error code": one refused
// publish and one refused subscription are two unauthorized answers.
func TestRefusalsCountedOnce(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	ip := startInprocWith(t, func(c *Config) { c.MeterProvider = mp }, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	conn := ip.dialAs(ip.brokers[0], "nobody") // no grants
	pub := openStream(t, conn)
	pub.send(publish(1, "orders", "v"))
	wantError(t, pub.recv(), transport.ErrUnauthorized)
	if n := errorCount(t, reader, "unauthorized"); n != 1 {
		t.Errorf("after one refused publish: felix.errors{code=unauthorized} = %d, want 1", n)
	}
	sub := openStream(t, conn)
	sub.send(&transport.Subscribe{Stream: "orders", Start: transport.StartEarliest, Credit: 1})
	wantError(t, sub.recv(), transport.ErrUnauthorized)
	if n := errorCount(t, reader, "unauthorized"); n != 2 {
		t.Errorf("after one refused publish and one refused subscription: felix.errors{code=unauthorized} = %d, want 2", n)
	}
}

// TestPeerConnectionsCounted: felix.connections is "Open QUIC
// connections, by type (client or peer)": a broker that forwarded to its
// peer has a connection to it open, and counts it.
func TestPeerConnectionsCounted(t *testing.T) {
	readers := map[string]*sdkmetric.ManualReader{}
	ip := startInprocWith(t, func(c *Config) {
		r := sdkmetric.NewManualReader()
		readers[c.NodeID] = r
		c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	}, 2, shardmap.StreamConfig{Name: "orders", Shards: 1})
	via := ip.nonOwner("orders", 0)
	ws := openStream(t, ip.dial(via))
	if f := ws.roundTrip(publish(1, "orders", "v")); f.Type() != transport.FrameAck {
		t.Fatalf("publish: %T %+v", f, f)
	}
	for _, b := range ip.brokers {
		var peers int64
		eachMetric(t, readers[b.NodeID()], func(m metricdata.Metrics) {
			if m.Name != "felix.connections" {
				return
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if v, _ := dp.Attributes.Value("type"); v.AsString() == "peer" {
					peers += dp.Value
				}
			}
		})
		t.Logf("%s (forwarder=%v): felix.connections{type=peer} = %d", b.NodeID(), b == via, peers)
		if b == via && peers < 1 {
			t.Errorf("the forwarder %s counts %d open peer connections; it has one open to the owner", b.NodeID(), peers)
		}
	}
}
