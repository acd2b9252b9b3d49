package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/felix-broker/felix/internal/msgtrace"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// maxForwardAttempts bounds how often one publish is re-routed after owners
// answer NotOwner (each time with a newer map).
const maxForwardAttempts = 4

// dialTimeout bounds connecting to a peer broker.
const dialTimeout = 3 * time.Second

// peerPool keeps one QUIC connection per peer broker; every forwarding
// lane to that peer is a stream on it.
type peerPool struct {
	tls *tls.Config
	cfg transport.Config
	log *slog.Logger

	// mu guards conns; dialing happens outside it, one dial per peer at a
	// time through the entry's ready channel.
	mu struct {
		sync.Mutex
		closed bool
		conns  map[string]*peerConn
	}
}

type peerConn struct {
	addr  string
	ready chan struct{} // closed once conn or err is set
	conn  *quic.Conn
	err   error
}

func newPeerPool(tlsConf *tls.Config, cfg transport.Config, log *slog.Logger) *peerPool {
	p := &peerPool{tls: tlsConf, cfg: cfg, log: log}
	p.mu.conns = map[string]*peerConn{}
	return p
}

var errPoolClosed = errors.New("broker: peer pool closed")

// conn returns the connection to node, dialing it if there is none or the
// one there has died or points at an old address.
func (p *peerPool) conn(ctx context.Context, node shardmap.Node) (*quic.Conn, error) {
	p.mu.Lock()
	if p.mu.closed {
		p.mu.Unlock()
		return nil, errPoolClosed
	}
	pc := p.mu.conns[node.ID]
	if pc != nil {
		select {
		case <-pc.ready:
			if pc.err != nil || pc.conn.Context().Err() != nil || pc.addr != node.Addr {
				pc = nil
			}
		default:
		}
	}
	if pc == nil {
		pc = &peerConn{addr: node.Addr, ready: make(chan struct{})}
		p.mu.conns[node.ID] = pc
		p.mu.Unlock()
		dctx, cancel := context.WithTimeout(ctx, dialTimeout)
		// Only node.ID's own node certificate will do: an address taken
		// over by another node, or by a client, is refused.
		pc.conn, pc.err = transport.Dial(dctx, node.Addr, transport.VerifyPeer(p.tls, transport.RoleNode, node.ID), p.cfg)
		cancel()
		close(pc.ready)
	} else {
		p.mu.Unlock()
	}
	select {
	case <-pc.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return pc.conn, pc.err
}

// dropDown closes connections to peers the map says are down, so forwards
// waiting on them fail now rather than at the QUIC idle timeout.
func (p *peerPool) dropDown(m *shardmap.Map) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, pc := range p.mu.conns {
		if n, ok := m.Node(id); ok && n.Live {
			continue
		}
		select {
		case <-pc.ready:
			if pc.conn != nil {
				pc.conn.CloseWithError(quic.ApplicationErrorCode(transport.CodeUnavailable), "peer is down in the shard map")
				p.log.Warn("peer down in the shard map; connection to it closed", "peer", id, "epoch", m.Epoch)
			}
			delete(p.mu.conns, id)
		default:
		}
	}
}

func (p *peerPool) close() {
	p.mu.Lock()
	p.mu.closed = true
	conns := p.mu.conns
	p.mu.conns = nil
	p.mu.Unlock()
	for _, pc := range conns {
		<-pc.ready
		if pc.conn != nil {
			pc.conn.CloseWithError(0, "broker shutting down")
		}
	}
}

// lane carries the records one publisher stream forwards to one owner, on
// one stream of the pooled peer connection, so they reach the owner in the
// order they were routed. Its reader relays the owner's answers.
type lane struct {
	p     *pubSession
	owner string
	s     *quic.Stream
	w     *transport.Writer // written under p.dispatchMu

	// Precomputed metric attributes (peer=owner).
	forwardDur []metric.RecordOption
	forwards   []metric.AddOption

	// mu guards the forwards awaiting the owner's answer, by Seq.
	mu struct {
		sync.Mutex
		pending map[uint64]forwarded
		dead    bool
	}
}

type forwarded struct {
	in      inbound
	attempt int
	span    trace.Span   // the forward's client span once started, else nil
	spanID  trace.SpanID // its ID, reserved before the send; zero if not
	sent    time.Time    // zero when telemetry is off
}

// clientSpan returns the forward's client span, starting it (at fw.sent,
// with its reserved ID) if need be; nil when the forward is not traced.
func (fw *forwarded) clientSpan(p *pubSession) trace.Span {
	if fw.span != nil || !fw.spanID.IsValid() {
		return fw.span
	}
	ctx := trace.ContextWithSpan(context.Background(), p.serverSpan(&fw.in))
	if !p.b.tel.ids.Refused() {
		ctx = msgtrace.Reserve(ctx, fw.spanID)
	}
	_, fw.span = p.b.tel.tracer.Start(ctx, "forward "+fw.in.pub.Stream,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(fw.sent))
	return fw.span
}

// end gives the forward's client span its attributes (and the offset the
// owner wrote the record at, when it did) and ends it with the owner's
// refusal, if any.
func (fw *forwarded) end(p *pubSession, err *transport.Error, offset uint64, opts ...trace.SpanEndOption) {
	sp := fw.clientSpan(p)
	if sp == nil {
		return
	}
	if sp.IsRecording() {
		b, pub := p.b, fw.in.pub
		sp.SetAttributes(msgtrace.System, msgtrace.OpSend, msgtrace.OpNameForward,
			msgtrace.Destination.String(pub.Stream), msgtrace.Partition.String(strconv.Itoa(fw.in.shard)),
			b.tel.node, msgtrace.Peer.String(fw.in.owner), msgtrace.Via.String(b.cfg.NodeID), msgtrace.Forwarded.Bool(true),
			msgtrace.BodySize.Int(len(pub.Value)))
		if pub.ProducerID != "" {
			sp.SetAttributes(msgtrace.ClientID.String(pub.ProducerID))
		}
		// The peer's address as the map has it now (the span ends after
		// the answer; an address seldom changes in between).
		if m := b.currentMap(); m != nil {
			if n, ok := m.Node(fw.in.owner); ok {
				sp.SetAttributes(msgtrace.Server(n.Addr)...)
			}
		}
		if err == nil {
			sp.SetAttributes(msgtrace.Offset.Int64(int64(offset)))
		}
	}
	endSpan(sp, err, opts...)
}

// forward sends pub to the shard's owner on this session's lane to it. The
// caller holds dispatchMu.
func (p *pubSession) forward(in inbound, m *shardmap.Map, shard int, owner string, attempt int) {
	b, pub := p.b, in.pub
	node, ok := m.Node(owner)
	if !ok || !node.Live {
		p.fail(in, &transport.Error{Code: transport.CodeUnavailable, Owner: owner, Epoch: m.Epoch,
			Message: fmt.Sprintf("%s/%d is owned by %s, which is down; it is unavailable until %s returns", pub.Stream, shard, owner, owner)})
		return
	}
	l, err := p.lane(node)
	if err != nil {
		p.fail(in, &transport.Error{Code: transport.CodeUnavailable, Owner: owner, Epoch: m.Epoch,
			Message: fmt.Sprintf("%s (%s), the owner of %s/%d, is not reachable from %s: %v", owner, node.Addr, pub.Stream, shard, b.cfg.NodeID, err)})
		return
	}
	fwd := *pub
	fwd.Shard = int32(shard)
	fwd.Epoch = m.Epoch
	fwd.Via = b.cfg.NodeID
	fw := forwarded{in: in, attempt: attempt, sent: b.tel.now()}
	// Only what the owner needs goes before the write: the context of the
	// forward's client span, the parent of the owner's server span.
	if in.traced {
		fw.spanID = msgtrace.NewSpanID()
		if b.tel.ids.Honoured() && in.parent.IsValid() {
			// The provider takes reserved IDs: the spans are started once
			// the record is answered (forwarded.end). The hop carries the
			// producer's sampling decision, which a parent-based sampler
			// (the SDK's default) keeps.
			if fw.in.span == nil && !fw.in.spanID.IsValid() {
				fw.in.spanID = msgtrace.NewSpanID()
			}
			fwd.Headers = msgtrace.WithHop(trace.NewSpanContext(trace.SpanContextConfig{
				TraceID: in.parent.TraceID(), SpanID: fw.spanID,
				TraceFlags: in.parent.TraceFlags(), TraceState: in.parent.TraceState(),
			}), pub.Headers)
		} else {
			// Start them now, asking for the reserved ID all the same: the
			// first forward learns whether the provider honours it.
			sp := fw.clientSpan(p)
			b.tel.ids.Learn(sp, fw.spanID)
			fwd.Headers = msgtrace.WithHop(sp.SpanContext(), pub.Headers)
		}
	}
	if !l.add(fw) {
		fw.end(p, nil, 0)
		p.fail(fw.in, &transport.Error{Code: transport.CodeInvalid,
			Message: fmt.Sprintf("seq %d is already in flight on this stream; sequence numbers must be unique", pub.Seq)})
		return
	}
	if err := l.w.Write(&fwd); err != nil {
		l.kill(fmt.Errorf("writing to %s: %w", owner, err))
		delete(p.lanes, owner)
	}
	b.tel.forwards.Add(context.Background(), 1, l.forwards...)
}

// lane returns this session's lane to node, opening it if need be. The
// caller holds dispatchMu.
func (p *pubSession) lane(node shardmap.Node) (*lane, error) {
	if l := p.lanes[node.ID]; l != nil && !l.isDead() {
		return l, nil
	}
	ctx, cancel := context.WithTimeout(p.ctx, dialTimeout)
	defer cancel()
	conn, err := p.b.peers.conn(ctx, node)
	if err != nil {
		return nil, err
	}
	s, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return nil, err
	}
	l := &lane{p: p, owner: node.ID, s: s, w: transport.NewWriter(s)}
	peer := attribute.String("peer", node.ID)
	l.forwardDur = recordOpt(peer)
	l.forwards = addOpt(peer)
	l.mu.pending = map[uint64]forwarded{}
	p.lanes[node.ID] = l
	p.workers.Add(1)
	go l.read()
	return l, nil
}

func (l *lane) add(fw forwarded) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	seq := fw.in.pub.Seq
	if _, dup := l.mu.pending[seq]; dup {
		return false
	}
	l.mu.pending[seq] = fw
	return true
}

func (l *lane) take(seq uint64) (forwarded, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, ok := l.mu.pending[seq]
	delete(l.mu.pending, seq)
	return f, ok
}

func (l *lane) isDead() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.dead
}

// read relays the owner's answers to the publisher until the lane ends.
func (l *lane) read() {
	defer l.p.workers.Done()
	r := transport.NewReader(l.s, l.p.b.cfg.Transport.MaxFrame)
	for {
		f, err := r.Read()
		if err != nil {
			l.kill(err)
			return
		}
		switch f := f.(type) {
		case *transport.Ack:
			if fw, ok := l.take(f.Seq); ok {
				var answered time.Time // taken before the ack leaves, so spans nest
				if !fw.sent.IsZero() {
					answered = time.Now()
				}
				l.p.acks.answer(f, fw.in.charge)
				l.p.done()
				if !answered.IsZero() { // telemetry is on
					offset := f.Offset
					l.p.b.tel.later.Add(func() { l.acked(&fw, offset, answered) })
				}
			}
		case *transport.Error:
			fw, ok := l.take(f.Seq)
			if !ok {
				// A stream-level error from the owner: nothing more will
				// come on this lane.
				l.kill(f)
				return
			}
			l.p.answer(fw, f)
		}
	}
}

// acked records a forward the owner acknowledged (writing the record at
// offset) and this broker answered at answered.
func (l *lane) acked(fw *forwarded, offset uint64, answered time.Time) {
	t := l.p.b.tel
	t.forwardDur.Record(context.Background(), answered.Sub(fw.sent).Seconds(), l.forwardDur...)
	t.publishDur.Record(context.Background(), answered.Sub(fw.in.start).Seconds(), t.forwarded...)
	fw.end(l.p, nil, offset, trace.WithTimestamp(answered))
	l.p.endServer(&fw.in, nil, offset, trace.WithTimestamp(answered))
}

// answer handles an owner's refusal of a forwarded record: NotOwner means
// the map moved, so catch up and route again (bounded); anything else goes
// back to the publisher.
func (p *pubSession) answer(fw forwarded, e *transport.Error) {
	fw.end(p, e, 0)
	if e.Code != transport.CodeNotOwner || fw.attempt+1 >= maxForwardAttempts {
		e.Seq = fw.in.pub.Seq
		p.acks.answer(e, fw.in.charge)
		p.b.tel.countError(e.Code)
		p.endServer(&fw.in, e, 0)
		p.done()
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.b.cfg.ForwardTimeout)
	_, err := p.b.member.Refresh(ctx, e.Epoch)
	cancel()
	if err != nil {
		p.fail(fw.in, &transport.Error{Code: transport.CodeUnavailable,
			Message: fmt.Sprintf("%s was refused by %s (not the owner at epoch %d) and could not get that map: %v", p.b.cfg.NodeID, e.Owner, e.Epoch, err)})
		return
	}
	in := fw.in
	in.last = false // re-routed from the lane's reader: queue, never commit inline here
	p.dispatchMu.Lock()
	p.dispatch(in, fw.attempt+1)
	p.dispatchMu.Unlock()
}

// kill ends the lane and fails every forward still waiting on it: the owner
// may or may not have written them, and the publisher must be told so.
func (l *lane) kill(cause error) {
	l.mu.Lock()
	if l.mu.dead {
		l.mu.Unlock()
		return
	}
	l.mu.dead = true
	pending := l.mu.pending
	l.mu.pending = nil
	l.mu.Unlock()
	l.s.CancelRead(quic.StreamErrorCode(transport.CodeUnavailable))
	l.s.CancelWrite(quic.StreamErrorCode(transport.CodeUnavailable))
	for _, fw := range pending {
		e := &transport.Error{Code: transport.CodeUnavailable, Owner: l.owner,
			Message: fmt.Sprintf("lost %s before it acknowledged; the record may or may not have been written (%v)", l.owner, cause)}
		fw.end(l.p, e, 0)
		l.p.fail(fw.in, e)
	}
}

func (l *lane) close() { l.kill(errors.New("publisher stream closed")) }
