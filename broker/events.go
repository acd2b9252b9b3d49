package broker

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/felix-broker/felix/internal/msgtrace"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
	"github.com/felix-broker/felix/wal"
)

// Telemetry at the edges: the publish path records what happens to a
// record in a pubEvents value (timestamps, the trace context it came
// with, its route, its outcome) and hands it to telemetry.observe once
// the record is answered; every span, latency and count of a publish is
// built from it here, in the way franz-go's hooks and kotel keep tracing
// and metrics out of the client's path. The path itself makes two other
// calls: telemetry.received (the timestamp and the trace context off the
// headers) and, on a forward, telemetry.forwardContext (the hop context
// the owner needs, with span IDs reserved for the spans built later).

// pubEvents is what the publish path records about one record, from its
// receipt to its answer. The path only stamps it (see the methods that
// take a timestamp) and sets its route; telemetry reads it. With
// telemetry off, received is zero and nothing else is recorded.
type pubEvents struct {
	pub  *transport.Publish
	peer string // the forwarding broker, on a peer's stream; "" on a client's

	received time.Time  // the publish was read
	routed   time.Time  // it was handed to this broker's log (the append span's start)
	answered time.Time  // its answer was about to be written
	commit   wal.Commit // the group commit that made it durable (when traced)

	// Its route: shard is -1 until it is routed.
	shard int
	owner string

	// Its outcome: the offset it was written at, or the refusal it got.
	offset uint64
	err    *transport.Error

	taken bool // authorized and taken in: counted in felix_records_in

	hop   hopEvents // the current forward to the owner, if any
	trace pubTrace  // tracing state; built and read by telemetry only
}

// hopEvents is one forward of a record to its owner.
type hopEvents struct {
	peer      string    // the owner it went to
	forwarded time.Time // when it was put on the lane to the owner

	spanID trace.SpanID // the client span's ID, reserved before the send
	span   trace.Span   // the client span, if started before the send
}

// pubTrace is a record's tracing state between its receipt and its
// answer: the parent of its server span and, when that span had to be
// started or its ID reserved before a forward, those.
type pubTrace struct {
	on     bool // the broker traces
	parent trace.SpanContext
	spanID trace.SpanID // the server span's reserved ID, if any
	span   trace.Span   // the server span, if started before the answer
}

// route records where the record was routed.
func (ev *pubEvents) route(shard int, owner string) { ev.shard, ev.owner = shard, owner }

// received returns the events of a publish just read from a publisher
// stream (of peer, or of a client when peer is ""): the time, and the
// parent of its server span from its headers (a forwarder's hop context
// on a peer stream, the producer's on a client stream). It removes any
// hop context from the headers, traced or not.
func (t *telemetry) received(pub *transport.Publish, peer string) pubEvents {
	ev := pubEvents{pub: pub, peer: peer, received: t.now(), shard: -1}
	if t.tracer == nil {
		msgtrace.StripHop(pub.Headers) // never stored, never counted
		return ev
	}
	ev.trace.on = true
	if hop, ok := msgtrace.TakeHop(context.Background(), pub.Headers); ok && peer != "" {
		ev.trace.parent = trace.SpanContextFromContext(hop)
		if p := ev.trace.parent; p.IsValid() && p.TraceState().Len() == 0 {
			// The hop carries no tracestate (forwardContext): the
			// trace's is the record's own, when it is the same trace.
			if rc := msgtrace.RecordContext(pub.Headers); rc.TraceID() == p.TraceID() {
				ev.trace.parent = p.WithTraceState(rc.TraceState())
			}
		}
	} else {
		ev.trace.parent = msgtrace.RecordContext(pub.Headers)
	}
	return ev
}

// untraced returns the events of a publish the stream's reader could not
// read (skipped whole): it is counted, not traced.
func (t *telemetry) untraced(pub *transport.Publish, peer string) pubEvents {
	return pubEvents{pub: pub, peer: peer, received: t.now(), shard: -1}
}

// stampRouted records that the record is being handed to this broker's
// log: the start of its append span, so only when tracing.
func (t *telemetry) stampRouted(ev *pubEvents) {
	if t.tracer != nil {
		ev.routed = time.Now()
	}
}

// stampAnswered records that the record's answer is about to be written
// (taken before it leaves, so the spans built from it nest inside the
// producer's), unless its commit already gave it one (shardCommits.stamp).
func (t *telemetry) stampAnswered(ev *pubEvents) {
	if ev.answered.IsZero() {
		ev.answered = t.now()
	}
}

// forwardContext records a forward of the record to owner and returns
// the headers to send it with: h, plus the hop context (the parent of the
// owner's server span) when tracing is on. It is the only tracing work
// before the answer: when the provider takes reserved span IDs
// (TraceIDGenerator) it reserves the IDs of the server and client spans
// built after the answer; otherwise it starts them now, and the first
// forward learns which is the case.
func (t *telemetry) forwardContext(ev *pubEvents, owner string, h map[string]string) map[string]string {
	ev.hop = hopEvents{peer: owner, forwarded: t.now()}
	if !ev.trace.on {
		return h
	}
	ev.hop.spanID = msgtrace.NewSpanID()
	if p := ev.trace.parent; t.ids.Honoured() && p.IsValid() {
		// The hop carries the producer's sampling decision, which a
		// parent-based sampler (the SDK's default) keeps.
		if ev.trace.span == nil && !ev.trace.spanID.IsValid() {
			ev.trace.spanID = msgtrace.NewSpanID()
		}
		return msgtrace.WithHop(trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: p.TraceID(), SpanID: ev.hop.spanID,
			TraceFlags: p.TraceFlags(), // no TraceState: the owner takes the record's (received)
		}), h)
	}
	// Start them now, asking for the reserved ID all the same: the first
	// forward learns whether the provider honours it.
	sp := t.clientSpan(ev)
	t.ids.Learn(sp, ev.hop.spanID)
	// Without the tracestate, which is the record's (its producer's) and
	// may be as large as the headers allow: the frame limit leaves room
	// for a traceparent, not for a second copy of the headers.
	return msgtrace.WithHop(sp.SpanContext().WithTraceState(trace.TraceState{}), h)
}

// taken counts a record taken in (given its slot), to be answered and
// observed; with telemetry off it does nothing.
func (t *telemetry) taken(ev *pubEvents) {
	if !ev.received.IsZero() {
		t.open.Add(1)
	}
}

// observe builds the telemetry of a record once it is answered: counts
// now (cheap, and read by the tests right after an answer), latencies
// and spans a moment later in a batch, with the times things happened.
// ev is copied into the batch (no allocation per record; the caller's
// inbound stays on its stack).
//
// When ev's record was the last the broker had taken in and not
// answered, the batch runs as soon as the goroutines its answer woke have
// run (msgtrace.Deferred.Soon): at light load the broker is about to
// idle until the next record, and the batch runs then instead of at a
// tick that may fall inside that record's path (measured: a tick's batch
// during a direct publish's fsync delays its ack; with ticks only, a
// closed loop of traced publishes had a p50 8% over untraced, 17%
// forwarded). Under load the count seldom drops to 0, and the ticks run
// the batches.
func (t *telemetry) observe(ev *pubEvents) {
	if ev.received.IsZero() {
		return // telemetry is off
	}
	t.count(ev)
	q := &t.events
	q.Lock()
	q.evs = append(q.evs, *ev)
	first := len(q.evs) == 1
	q.Unlock()
	if first {
		t.later.Add(t.buildEvents) // once per batch
	}
	if t.open.Add(-1) == 0 {
		t.later.Soon()
	}
}

// eventQueue holds the events of answered records until the next batch
// of deferred telemetry builds them.
type eventQueue struct {
	sync.Mutex
	evs   []pubEvents
	spare []pubEvents
}

// buildEvents builds the telemetry of the records observed since it last
// ran. msgtrace.Deferred runs it, once per batch that has records.
func (t *telemetry) buildEvents() {
	q := &t.events
	q.Lock()
	evs := q.evs
	q.evs, q.spare = q.spare[:0], nil
	q.Unlock()
	for i := range evs {
		t.build(&evs[i])
		evs[i] = pubEvents{} // let go of the records
	}
	q.Lock()
	if q.spare == nil {
		q.spare = evs[:0]
	}
	q.Unlock()
}

// rerouted builds the telemetry of a forward the owner refused with
// refusal (NotOwner), after which the record is routed again: its client
// span ends, and the record goes on with no forward in ev.
func (t *telemetry) rerouted(ev *pubEvents, refusal *transport.Error) {
	if ev.received.IsZero() {
		return
	}
	if ev.trace.on {
		t.serverSpan(ev) // the parent of this and any later forward, now
	}
	e := new(pubEvents)
	*e = *ev
	e.err, e.answered = refusal, time.Now()
	ev.hop = hopEvents{}
	t.later.Add(func() { t.buildHop(e) })
}

// count records a record's counters at its answer.
func (t *telemetry) count(ev *pubEvents) {
	if ev.taken {
		src := 0
		if ev.peer != "" {
			src = 1
		}
		t.in.records[src].Add(1)
		t.in.bytes[src].Add(int64(len(ev.pub.Key) + len(ev.pub.Value)))
	}
	if ev.err != nil {
		t.countError(ev.err.Code)
	}
}

// build records an answered record's latencies and spans.
func (t *telemetry) build(ev *pubEvents) {
	ctx := context.Background()
	acked := ev.err == nil
	forwarded := !ev.hop.forwarded.IsZero()
	t.buildHop(ev)
	if acked && ev.peer == "" {
		path := t.local
		if forwarded {
			path = t.forwarded
		}
		t.publishDur.Record(ctx, ev.answered.Sub(ev.received).Seconds(), path...)
	}
	if !ev.trace.on {
		return
	}
	server := t.serverSpan(ev)
	if acked && !ev.routed.IsZero() {
		t.traceAppend(server, shardmap.ShardID{Stream: ev.pub.Stream, Shard: ev.shard}, ev.routed, ev.answered, ev.offset, ev.commit)
	}
	t.endServer(ev)
}

// buildHop records ev's forward, if any: its count and latency, and its
// client span.
func (t *telemetry) buildHop(ev *pubEvents) {
	if ev.hop.forwarded.IsZero() {
		return
	}
	po := t.peerOpts(ev.hop.peer)
	po.forwards.Add(1)
	if ev.err == nil {
		t.forwardDur.Record(context.Background(), ev.answered.Sub(ev.hop.forwarded).Seconds(), po.rec...)
	}
	if ev.trace.on {
		t.endClient(ev)
	}
}

// peerMetricOpts are the metric options of a peer (peer=id), and the
// count of records forwarded to it (reported by the callback).
type peerMetricOpts struct {
	rec      []metric.RecordOption
	at       metric.MeasurementOption
	forwards atomic.Int64
	attrs    atomic.Pointer[peerAttrs] // its client spans' attributes (peerAttrs)
}

// peerOpts returns the metric options of peer id, made once per peer.
func (t *telemetry) peerOpts(id string) *peerMetricOpts {
	if o, ok := t.peers.Load(id); ok {
		return o.(*peerMetricOpts)
	}
	kv := attribute.String("peer", id)
	o, _ := t.peers.LoadOrStore(id, &peerMetricOpts{rec: recordOpt(kv), at: metric.WithAttributeSet(attribute.NewSet(kv))})
	return o.(*peerMetricOpts)
}

// serverSpan returns ev's server span, starting it (at ev.received, with
// its reserved ID if it has one) if need be; nil when tracing is off. It
// has no attributes until endServer.
func (t *telemetry) serverSpan(ev *pubEvents) trace.Span {
	if ev.trace.span != nil || !ev.trace.on {
		return ev.trace.span
	}
	ctx := context.Background()
	if ev.trace.parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, ev.trace.parent)
	}
	if ev.trace.spanID.IsValid() {
		ctx = msgtrace.Reserve(ctx, ev.trace.spanID)
	}
	_, ev.trace.span = t.tracer.Start(ctx, spanOp(ev)+" "+ev.pub.Stream, trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(ev.received))
	return ev.trace.span
}

// spanStream returns name, a record's stream, as a span attribute may
// keep it, and whether the broker's map has that stream: the map's copy
// of the name, or a copy of its own; never name itself, which points into
// the record's decoded frame (transport.DecodeFrame aliases its strings):
// a span kept by the SpanBuffer (up to MaxQueue of them while the
// exporter is slow or down) would keep the whole record alive.
func (t *telemetry) spanStream(name string) (string, bool) {
	if t.currentMap != nil {
		if m := t.currentMap(); m != nil {
			if st, ok := m.Stream(name); ok {
				return st.Name, true
			}
		}
	}
	return strings.Clone(name), false
}

// spanOp is the operation ev's server span names: "publish", or
// "forward" for a peer's record.
func spanOp(ev *pubEvents) string {
	if ev.peer != "" {
		return "forward"
	}
	return "publish"
}

// endServer gives ev's server span (starting it if need be) its
// attributes, the record's offset when it was written, and the refusal
// as its status, and ends it when the record was answered. The
// attributes go in one call: each SetAttributes grows the span's slice
// (measured, a third of the bytes a traced record allocated). They are
// gathered in t.spanAttrs (see there), not in a slice of their own, which
// the call through the Span interface would move to the heap each time
// (a quarter of the bytes build allocated).
func (t *telemetry) endServer(ev *pubEvents) {
	sp := t.serverSpan(ev)
	if sp == nil {
		return
	}
	if sp.IsRecording() {
		via := t.nodeID
		if ev.peer != "" {
			via = ev.peer
		}
		stream, known := t.spanStream(ev.pub.Stream)
		attrs := append(t.spanAttrs[:0], msgtrace.System, msgtrace.OpReceive, msgtrace.Destination.String(stream),
			t.node, msgtrace.Via.String(via), msgtrace.BodySize.Int(len(ev.pub.Value)))
		if ev.pub.ProducerID != "" {
			attrs = append(attrs, msgtrace.ClientID.String(strings.Clone(producerName(ev.pub.ProducerID))))
		}
		if ev.shard >= 0 {
			attrs = append(attrs, msgtrace.Partition.String(strconv.Itoa(ev.shard)), msgtrace.Owner.String(ev.owner),
				msgtrace.Forwarded.Bool(ev.peer != "" || ev.owner != t.nodeID))
		}
		if ev.err == nil {
			attrs = append(attrs, msgtrace.Offset.Int64(int64(ev.offset)))
		}
		sp.SetAttributes(attrs...)
		t.spanAttrs = clearAttrs(attrs)
		if ev.shard < 0 && !known {
			// A stream the map does not have: its name is the
			// client's, any string, and span names must be few; the
			// attribute keeps it.
			sp.SetName(spanOp(ev))
		}
	}
	endSpan(sp, ev.err, trace.WithTimestamp(ev.answered))
}

// clearAttrs empties attrs for reuse, dropping what its values refer to.
func clearAttrs(attrs []attribute.KeyValue) []attribute.KeyValue {
	clear(attrs)
	return attrs[:0]
}

// clientSpan returns the client span of ev's forward, starting it (at
// the forward, with its reserved ID) if need be.
func (t *telemetry) clientSpan(ev *pubEvents) trace.Span {
	h := &ev.hop
	if h.span != nil {
		return h.span
	}
	ctx := trace.ContextWithSpan(context.Background(), t.serverSpan(ev))
	if !t.ids.Refused() {
		ctx = msgtrace.Reserve(ctx, h.spanID)
	}
	_, h.span = t.tracer.Start(ctx, "forward "+ev.pub.Stream,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(h.forwarded))
	return h.span
}

// endClient gives the client span of ev's forward its attributes (and the
// offset the owner wrote the record at, when it did) and ends it with the
// owner's refusal, if any. Like endServer, in one SetAttributes call,
// gathered in t.spanAttrs.
func (t *telemetry) endClient(ev *pubEvents) {
	if ev.hop.span == nil && !ev.hop.spanID.IsValid() {
		return // not traced
	}
	sp := t.clientSpan(ev)
	if sp.IsRecording() {
		pub := ev.pub
		stream, _ := t.spanStream(pub.Stream)
		attrs := append(t.spanAttrs[:0], msgtrace.System, msgtrace.OpSend, msgtrace.OpNameForward,
			msgtrace.Destination.String(stream), msgtrace.Partition.String(strconv.Itoa(ev.shard)),
			t.node, msgtrace.Via.String(t.nodeID), msgtrace.Forwarded.Bool(true),
			msgtrace.BodySize.Int(len(pub.Value)))
		attrs = append(attrs, t.peerAttrs(ev.hop.peer)...)
		if pub.ProducerID != "" {
			attrs = append(attrs, msgtrace.ClientID.String(strings.Clone(producerName(pub.ProducerID))))
		}
		if ev.err == nil {
			attrs = append(attrs, msgtrace.Offset.Int64(int64(ev.offset)))
		}
		sp.SetAttributes(attrs...)
		t.spanAttrs = clearAttrs(attrs)
	}
	endSpan(sp, ev.err, trace.WithTimestamp(ev.answered))
}

// peerAttrs returns the attributes of a forward's client span that name
// its peer: its id, and its address as the map has it now (the span ends
// after the answer; an address seldom changes in between). They are made
// once per peer and address.
func (t *telemetry) peerAttrs(id string) []attribute.KeyValue {
	po := t.peerOpts(id)
	var addr string
	if m := t.currentMap(); m != nil {
		if n, ok := m.Node(id); ok {
			addr = n.Addr
		}
	}
	if pa := po.attrs.Load(); pa != nil && pa.addr == addr {
		return pa.kv
	}
	pa := &peerAttrs{addr: addr, kv: append([]attribute.KeyValue{msgtrace.Peer.String(id)}, msgtrace.Server(addr)...)}
	po.attrs.Store(pa)
	return pa.kv
}

// peerAttrs are a peer's span attributes for one address of it.
type peerAttrs struct {
	addr string
	kv   []attribute.KeyValue
}

// endSpan ends sp (if any) with err as its status, its wire code name
// as error.type (and felix.error.code, kept for dashboards that use it).
func endSpan(sp trace.Span, err *transport.Error, opts ...trace.SpanEndOption) {
	if sp == nil {
		return
	}
	if err != nil && sp.IsRecording() {
		sp.SetStatus(codes.Error, err.Error())
		code := err.Code.String()
		sp.SetAttributes(msgtrace.ErrorType.String(code), msgtrace.Code.String(code))
	}
	sp.End(opts...)
}

// startChild starts an internal span under parent, at start.
func (t *telemetry) startChild(parent trace.Span, name string, start time.Time) trace.Span {
	_, sp := t.tracer.Start(trace.ContextWithSpan(context.Background(), parent), name,
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithTimestamp(start))
	return sp
}

// traceAppend records, after the fact, the append of a record the log
// committed at offset in commit c: a span from began (the append call) to
// end (the ack), under the server span, with a child span for the fsync it
// waited for.
func (t *telemetry) traceAppend(server trace.Span, id shardmap.ShardID, began, end time.Time, offset uint64, c wal.Commit) {
	if !server.SpanContext().IsValid() {
		return
	}
	sp := t.startChild(server, "append "+id.String(), began)
	if sp.IsRecording() {
		sp.SetAttributes(msgtrace.Offset.Int64(int64(offset)),
			msgtrace.MessageID.String(id.String()+"/"+strconv.FormatUint(offset, 10)))
		if !c.Start.IsZero() {
			fs := t.startChild(sp, "fsync "+id.String(), c.Start)
			fs.SetAttributes(msgtrace.BatchSize.Int(c.Records))
			fs.End(trace.WithTimestamp(c.Start.Add(c.Sync)))
		}
	}
	sp.End(trace.WithTimestamp(end))
}
