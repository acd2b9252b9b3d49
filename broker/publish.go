package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/felix-broker/felix/internal/msgtrace"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
	"github.com/felix-broker/felix/wal"
)

// maxInFlight bounds the records one publisher stream may have taken in and
// not yet answered; past it the broker stops reading the stream, which
// pushes back on the publisher through QUIC flow control.
const maxInFlight = 4096

// pubSession serves one publisher stream, from a client or from a
// forwarding peer. Its reader goroutine decodes publishes and dispatches
// them; answers are written by whoever completes each record.
type pubSession struct {
	b      *Broker
	s      *quic.Stream
	r      *transport.Reader
	peerID string // the forwarding broker's node id; "" for a client
	acks   *ackWriter

	ctx    context.Context // cancelled when the session ends
	cancel context.CancelFunc

	slots   chan struct{}  // one per record in flight
	pending sync.WaitGroup // records in flight
	workers sync.WaitGroup // the ack flusher and lane readers
	stopped atomic.Bool    // Close asked the session to stop reading
	idle    chan struct{}  // closed when the session has answered everything

	// dispatchMu serializes routing: the reader and lane retries both
	// dispatch, and lanes are created and written under it, so the records
	// of this stream reach each owner in the order they were routed.
	dispatchMu sync.Mutex
	lanes      map[string]*lane // by owner node id; guarded by dispatchMu
}

func (b *Broker) servePublish(s *quic.Stream, r *transport.Reader, first *transport.Publish, peerID string) {
	p := &pubSession{
		b: b, s: s, r: r, peerID: peerID,
		slots: make(chan struct{}, maxInFlight),
		idle:  make(chan struct{}),
		lanes: map[string]*lane{},
	}
	p.acks = newAckWriter(s, &p.workers)
	p.ctx, p.cancel = context.WithCancel(b.ctx)
	defer p.cancel()
	defer close(p.idle)

	b.mu.Lock()
	if b.mu.closing {
		b.mu.Unlock()
		b.refuse(s, &transport.Error{Seq: first.Seq, Code: transport.CodeShuttingDown, Message: "broker is shutting down; publish through another broker"})
		return
	}
	b.mu.pubs[p] = struct{}{}
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.mu.pubs, p)
		b.mu.Unlock()
	}()

	p.handle(first)
	for {
		f, err := p.r.Read()
		if err != nil {
			var werr *transport.Error
			if errors.As(err, &werr) && !p.stopped.Load() {
				// The stream cannot be resynchronized after a bad frame:
				// answer it, finish what was taken in, close the stream.
				p.acks.send(werr)
				s.CancelRead(quic.StreamErrorCode(werr.Code))
			} else if !errors.Is(err, io.EOF) && !p.stopped.Load() {
				p.b.log.Debug("publisher stream ended", "err", err)
			}
			break
		}
		pub, ok := f.(*transport.Publish)
		if !ok {
			p.acks.send(&transport.Error{Code: transport.CodeUnexpectedFrame,
				Message: fmt.Sprintf("a publisher stream carries publish frames, not %T", f)})
			s.CancelRead(quic.StreamErrorCode(transport.CodeUnexpectedFrame))
			break
		}
		if !p.handle(pub) {
			break
		}
	}
	p.finish()
}

// inbound is one publish this broker took in, carried from its receipt to
// its answer.
//
// Its server span is started lazily, with its receipt as start time: on
// the forward path just before the forward (its client span is a child
// whose context must travel with the record), on the local path only once
// the ack is on its way, so that no span work delays the append.
type inbound struct {
	pub    *transport.Publish
	start  time.Time         // receipt; zero when telemetry is off
	traced bool              // tracing is on
	parent trace.SpanContext // the producer's or forwarder's span, if any
	span   trace.Span        // the server span once started, else nil
	spanID trace.SpanID      // its ID, if reserved before it started

	// Where dispatch routed it, for the server span; shard is -1 before.
	shard int
	owner string

	// last: no further frame was buffered on the stream when this one was
	// read, so the reader may commit it itself (wal.Log.AppendNow).
	last bool
}

// handle takes one publish in. It returns false when the session is ending.
func (p *pubSession) handle(pub *transport.Publish) bool {
	t := p.b.tel
	in := inbound{pub: pub, start: t.now(), shard: -1, last: !p.r.Ready()}
	if t.tracer != nil {
		in.traced = true
		in.parent = p.takeParent(pub) // takes the hop context off the headers
	} else {
		msgtrace.StripHop(pub.Headers) // never stored, never counted
	}
	if p.peerID == "" {
		// Only a forwarding peer may speak for an epoch or another broker.
		pub.Epoch, pub.Via = 0, ""
	}
	select {
	case p.slots <- struct{}{}:
	case <-p.ctx.Done():
		return false
	}
	p.pending.Add(1)
	if n := len(pub.Key) + len(pub.Value) + headersLen(pub.Headers); n > p.b.cfg.MaxPayload {
		p.fail(in, &transport.Error{Code: transport.CodePayloadTooLarge,
			Message: fmt.Sprintf("record of %d bytes exceeds the broker's limit of %d bytes", n, p.b.cfg.MaxPayload)})
		p.countIn(int64(len(pub.Key) + len(pub.Value)))
		return true
	}
	n := int64(len(pub.Key) + len(pub.Value))
	p.dispatchMu.Lock()
	p.dispatch(in, 0)
	p.dispatchMu.Unlock()
	p.countIn(n) // counted once the record is on its way
	return true
}

// countIn counts a publish of n key and value bytes taken in.
func (p *pubSession) countIn(n int64) {
	t := p.b.tel
	src := t.fromClient
	if p.peerID != "" {
		src = t.fromPeer
	}
	ctx := context.Background()
	t.recordsIn.Add(ctx, 1, src...)
	t.bytesIn.Add(ctx, n, src...)
}

func headersLen(h map[string]string) int {
	n := 0
	for k, v := range h {
		n += len(k) + len(v)
	}
	return n
}

// dispatch routes pub by the broker's current map: a local append when this
// broker owns the shard, a forward when it does not, a NotOwner refusal
// when a peer forwarded it here by a map this broker no longer agrees
// with. The caller holds dispatchMu.
func (p *pubSession) dispatch(in inbound, attempt int) {
	b, pub := p.b, in.pub
	m := b.routingMap()
	if pub.Epoch > m.Epoch {
		// The forwarder has seen a newer map than ours: catch up before
		// judging ownership, so a moved shard is never written twice.
		ctx, cancel := context.WithTimeout(p.ctx, b.cfg.ForwardTimeout)
		nm, err := b.member.Refresh(ctx, pub.Epoch)
		cancel()
		if err != nil {
			p.fail(in, &transport.Error{Code: transport.CodeUnavailable,
				Message: fmt.Sprintf("%s could not catch up to map epoch %d: %v", b.cfg.NodeID, pub.Epoch, err)})
			return
		}
		m = nm
	}
	st, ok := m.Stream(pub.Stream)
	if !ok {
		p.fail(in, &transport.Error{Code: transport.CodeUnknownStream, Epoch: m.Epoch,
			Message: fmt.Sprintf("stream %q does not exist; create it with `felixctl stream create %s`", pub.Stream, pub.Stream)})
		return
	}
	shard := int(pub.Shard)
	if pub.Shard < 0 {
		shard = shardmap.ShardFor(pub.Key, st.Shards)
	} else if shard >= st.Shards {
		p.fail(in, &transport.Error{Code: transport.CodeInvalid,
			Message: fmt.Sprintf("stream %q has %d shards; there is no shard %d", pub.Stream, st.Shards, shard)})
		return
	}
	owner := st.Owners[shard]
	in.shard, in.owner = shard, owner
	switch {
	case owner == b.cfg.NodeID:
		p.appendLocal(in, st.StreamConfig, shard)
	case p.peerID != "":
		p.fail(in, &transport.Error{Code: transport.CodeNotOwner, Epoch: m.Epoch, Owner: owner,
			Message: fmt.Sprintf("%s does not own %s/%d at epoch %d; %s does", b.cfg.NodeID, pub.Stream, shard, m.Epoch, owner)})
	default:
		p.forward(in, m, shard, owner, attempt)
	}
}

// appendLocal appends pub to this broker's log of the shard; the ack is
// written by the shard's committer once the record is fsynced.
func (p *pubSession) appendLocal(in inbound, cfg shardmap.StreamConfig, shard int) {
	b, pub := p.b, in.pub
	id := shardmap.ShardID{Stream: pub.Stream, Shard: shard}
	e, err := b.shards.entry(id, cfg)
	if err != nil {
		p.fail(in, &transport.Error{Code: transport.CodeUnavailable,
			Message: fmt.Sprintf("%s cannot open its log of %s: %v", b.cfg.NodeID, id, err)})
		return
	}
	via := pub.Via
	if via == "" {
		via = b.cfg.NodeID
	}
	began := b.tel.now()
	seq, stream := pub.Seq, pub.Stream
	// With no further frame buffered the reader would only wait for one,
	// so it may commit this record itself when the log is idle (saving the
	// hand-off to the committer and back); while frames are buffered it
	// queues them, so pipelined records share an fsync.
	appendFn := e.log.AppendAsync
	if in.last {
		appendFn = e.log.AppendNow
	}
	appendFn(&wal.Record{
		ProducerID:  pub.ProducerID,
		ProducerSeq: pub.ProducerSeq,
		Headers:     pub.Headers,
		Key:         pub.Key,
		Value:       pub.Value,
	}, func(offset uint64, ts int64, err error) {
		var answered time.Time // taken before the answer leaves, so spans nest
		if !in.start.IsZero() {
			answered = time.Now()
		}
		var werr *transport.Error
		if err != nil {
			code := transport.CodeInternal
			if errors.Is(err, wal.ErrClosed) {
				code = transport.CodeShuttingDown
			}
			werr = &transport.Error{Seq: seq, Code: code,
				Message: fmt.Sprintf("%s could not write %s: %v", b.cfg.NodeID, id, err)}
			p.acks.send(werr)
			b.tel.countError(code)
		} else {
			p.acks.send(&transport.Ack{Seq: seq, Stream: stream, Shard: int32(shard), Offset: offset,
				Timestamp: ts, Owner: b.cfg.NodeID, Via: via, Forwarded: via != b.cfg.NodeID})
		}
		p.done()
		if in.start.IsZero() {
			return // telemetry is off
		}
		// in is not touched by anyone else once the record is answered.
		if err != nil {
			p.endServer(&in, werr, 0) // no commit follows a failed append
			return
		}
		commit := e.last
		b.tel.later.Add(func() {
			t := b.tel
			if p.peerID == "" {
				t.publishDur.Record(context.Background(), answered.Sub(in.start).Seconds(), t.local...)
			}
			if sp := p.serverSpan(&in); sp != nil {
				t.traceAppend(sp, id, began, answered, offset, commit)
				p.endServer(&in, nil, offset, trace.WithTimestamp(answered))
			}
		})
	})
}

// fail answers pub with err and releases its slot.
func (p *pubSession) fail(in inbound, err *transport.Error) {
	err.Seq = in.pub.Seq
	p.acks.send(err)
	p.b.tel.countError(err.Code)
	p.endServer(&in, err, 0)
	p.done()
}

func (p *pubSession) done() {
	<-p.slots
	p.pending.Done()
}

// finish waits until every record taken in is answered, then closes the
// stream. A forward that cannot finish within ForwardTimeout is failed by
// closing its lane.
func (p *pubSession) finish() {
	answered := make(chan struct{})
	go func() {
		p.pending.Wait()
		close(answered)
	}()
	select {
	case <-answered:
	case <-time.After(p.b.cfg.ForwardTimeout):
		p.closeLanes() // lanes fail what they still hold
		<-answered
	}
	p.cancel()
	p.closeLanes()
	p.workers.Wait()
	p.s.Close()
}

func (p *pubSession) closeLanes() {
	p.dispatchMu.Lock()
	lanes := p.lanes
	p.lanes = map[string]*lane{}
	p.dispatchMu.Unlock()
	for _, l := range lanes {
		l.close()
	}
}

// stopReading makes the session stop taking in publishes; what it already
// took in is still answered.
func (p *pubSession) stopReading() {
	p.stopped.Store(true)
	p.s.CancelRead(quic.StreamErrorCode(transport.CodeShuttingDown))
}

// waitIdle returns once the session has answered everything it took in.
func (p *pubSession) waitIdle() { <-p.idle }
