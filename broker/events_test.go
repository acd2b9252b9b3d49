package broker

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/felix-broker/felix/internal/msgtrace"
	"github.com/felix-broker/felix/shardmap"
)

// TestReroutedForwardSpans: a forward refused with NotOwner and routed
// again gives the forwarder one server span with two client spans under
// it, the refused one failed with error.type not_owner, the other acked
// at the owner's offset; with span IDs reserved (TraceIDGenerator) and
// without.
func TestReroutedForwardSpans(t *testing.T) {
	t.Run("sdk-ids", func(t *testing.T) { testReroutedForwardSpans(t, false) })
	t.Run("reserved-ids", func(t *testing.T) { testReroutedForwardSpans(t, true) })
}

func testReroutedForwardSpans(t *testing.T, reserved bool) {
	spans := tracetest.NewInMemoryExporter()
	opts := []sdktrace.TracerProviderOption{sdktrace.WithSyncer(spans)}
	if reserved {
		opts = append(opts, sdktrace.WithIDGenerator(TraceIDGenerator()))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	defer tp.Shutdown(context.Background())
	sr := startStaleRoute(t, func(c *Config) { c.TracerProvider = tp })
	ip, owner, fwd, wrong, staleMap, stale := sr.ip, sr.owner, sr.fwd, sr.wrong, &sr.next, sr.stale

	ws := openStream(t, ip.dial(fwd))
	// Each record under a producer span of its own.
	send := func(seq uint64) trace.SpanContext {
		producer := trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: msgtrace.NewTraceID(), SpanID: msgtrace.NewSpanID(), TraceFlags: trace.FlagsSampled})
		p := publish(seq, "orders", "v")
		p.Headers = msgtrace.WithRecordContext(producer, nil)
		ws.send(p)
		wantAck(t, ws.recv(), seq)
		return producer
	}
	if reserved {
		// The first forward learns that the provider honours reserved IDs.
		send(1)
		if !fwd.tel.ids.Honoured() {
			t.Fatal("the forwarder does not reserve span IDs with TraceIDGenerator")
		}
	}
	staleMap.Store(stale)
	producer := send(2)

	var server tracetest.SpanStub
	var clients []tracetest.SpanStub
	for deadline := time.Now().Add(waitFor); ; time.Sleep(5 * time.Millisecond) {
		server, clients = tracetest.SpanStub{}, nil
		all := spans.GetSpans()
		for _, s := range all {
			if s.Name == "publish orders" && s.SpanKind == trace.SpanKindServer && s.Parent.SpanID() == producer.SpanID() {
				server = s
			}
		}
		for _, s := range all {
			if s.Name == "forward orders" && s.SpanKind == trace.SpanKindClient && server.SpanContext.IsValid() &&
				s.Parent.SpanID() == server.SpanContext.SpanID() {
				clients = append(clients, s)
			}
		}
		if len(clients) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("server span %v and %d client spans, want one and two", server.SpanContext.IsValid(), len(clients))
		}
	}
	if server.Status.Code == codes.Error {
		t.Errorf("server span status %v, want no error", server.Status)
	}
	peers := map[string]tracetest.SpanStub{}
	for _, c := range clients {
		if c.StartTime.Before(server.StartTime) || c.EndTime.After(server.EndTime) {
			t.Errorf("client span %v..%v is not within the server span %v..%v", c.StartTime, c.EndTime, server.StartTime, server.EndTime)
		}
		for _, kv := range c.Attributes {
			if kv.Key == msgtrace.Peer {
				peers[kv.Value.AsString()] = c
			}
		}
	}
	refused, acked := peers[wrong.NodeID()], peers[owner.NodeID()]
	attr := func(s tracetest.SpanStub, k string) string {
		for _, kv := range s.Attributes {
			if string(kv.Key) == k {
				return kv.Value.Emit()
			}
		}
		return ""
	}
	if refused.Status.Code != codes.Error || attr(refused, string(msgtrace.ErrorType)) != "not_owner" {
		t.Errorf("refused forward: status %v, error.type %q; want an error, not_owner", refused.Status, attr(refused, string(msgtrace.ErrorType)))
	}
	if acked.Status.Code == codes.Error || attr(acked, string(msgtrace.Offset)) == "" {
		t.Errorf("acked forward: status %v, offset %q; want no error and an offset", acked.Status, attr(acked, string(msgtrace.Offset)))
	}
	if !refused.EndTime.After(refused.StartTime) || acked.StartTime.Before(refused.EndTime) {
		t.Errorf("refused forward %v..%v, acked forward %v..%v: want the second after the first", refused.StartTime, refused.EndTime, acked.StartTime, acked.EndTime)
	}
	waitAllAnswered(t, fwd, owner, wrong)
}

// waitAllAnswered waits until each broker's telemetry counts no record
// taken in and unanswered (telemetry.open, which decides when deferred
// telemetry runs): every record a broker took in, refused and re-routed
// ones too, must be observed once.
func waitAllAnswered(t *testing.T, brokers ...*Broker) {
	t.Helper()
	for _, b := range brokers {
		deadline := time.Now().Add(waitFor)
		for b.tel.open.Load() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s counts %d records taken in and not answered, want 0", b.cfg.NodeID, b.tel.open.Load())
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// TestUnroutedSpansNamedByOperation: a record to a stream the map does
// not have gives a server span named by its operation alone, its stream
// name, the client's, kept in an attribute: any client could otherwise
// make span names without end. A record to a stream of the map names it
// (TestFailedPublishSpans: refused before it was routed, too).
func TestUnroutedSpansNamedByOperation(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())
	ip := startInprocWith(t, func(c *Config) { c.TracerProvider = tp }, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	ws := openStream(t, ip.dial(ip.brokers[0]))
	for i, stream := range []string{"orders", "nope-1", "nope-2"} {
		p := publish(uint64(i+1), stream, "v")
		p.Headers = msgtrace.WithRecordContext(trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: msgtrace.NewTraceID(), SpanID: msgtrace.NewSpanID(), TraceFlags: trace.FlagsSampled}), nil)
		ws.send(p)
		ws.recv()
	}
	names := map[string]int{}
	for deadline := time.Now().Add(waitFor); ; time.Sleep(5 * time.Millisecond) {
		clear(names)
		for _, s := range spans.GetSpans() {
			if s.SpanKind == trace.SpanKindServer {
				names[s.Name]++
			}
		}
		if names["publish orders"]+names["publish"] == 3 || time.Now().After(deadline) {
			break
		}
	}
	if names["publish orders"] != 1 || names["publish"] != 2 || len(names) != 2 {
		t.Fatalf("server spans by name: %v; want publish orders once and publish twice", names)
	}
}
