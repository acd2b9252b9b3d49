package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

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
// order they were routed.
//
// Nothing on a lane blocks whoever routes onto it: a new lane is returned
// at once, and its connector goroutine dials the peer and opens the
// stream while the forwards routed meanwhile wait in its writer's
// backlog, in order; once the stream is open the connector writes that
// backlog, starts the lane's reader and ends. After that a forward is
// queued in quic-go's send buffer without blocking (frameWriter), or,
// while the owner's flow-control window is full, behind the others in the
// backlog that a flusher writes. The reader relays the owner's answers,
// and hands a NotOwner refusal to the session's retrier without waiting
// for anything.
type lane struct {
	p     *pubSession
	owner string
	addr  string       // the owner's address when the lane was opened
	w     *frameWriter // forwards to the owner; detached while connecting

	// ctx bounds the connector's dial; kill cancels it.
	ctx    context.Context
	cancel context.CancelFunc

	dead atomic.Bool // set (under mu) once the lane is killed

	// mu guards the stream once open and the forwards awaiting the
	// owner's answer, by Seq. It is never held across a blocking call.
	mu struct {
		sync.Mutex
		s       *quic.Stream // nil while connecting: nothing has reached the owner
		pending map[uint64]forwarded
	}
}

// forwarded is a record on a lane, awaiting the owner's answer.
type forwarded struct {
	in      inbound
	attempt int
}

// forward sends pub to the shard's owner on this session's lane to it. It
// never blocks: the lane queues what it cannot write yet.
func (p *pubSession) forward(in inbound, m *shardmap.Map, shard int, owner string, attempt int) {
	b, pub := p.b, in.pub
	node, ok := m.Node(owner)
	if !ok || !node.Live {
		p.fail(in, &transport.Error{Code: transport.CodeUnavailable, Owner: owner, Epoch: m.Epoch,
			Message: fmt.Sprintf("%s/%d is owned by %s, which is down; it is unavailable until %s returns", pub.Stream, shard, owner, owner)})
		return
	}
	fwd := *pub
	fwd.Shard = int32(shard)
	fwd.Epoch = m.Epoch
	fwd.Via = b.cfg.NodeID
	// Only what the owner needs goes before the write: the hop context
	// (the parent of the owner's server span), if traced.
	fwd.Headers = b.tel.forwardContext(&in.ev, owner, pub.Headers)
	fw := forwarded{in: in, attempt: attempt}
	var l *lane
	for {
		if l = p.laneTo(node); l == nil {
			p.fail(fw.in, &transport.Error{Code: transport.CodeShuttingDown,
				Message: fmt.Sprintf("the publisher stream on %s is closing", b.cfg.NodeID)})
			return
		}
		added, dup := l.add(fw)
		if dup {
			p.fail(fw.in, &transport.Error{Code: transport.CodeInvalid,
				Message: fmt.Sprintf("seq %d is already in flight on this stream; sequence numbers must be unique", pub.Seq)})
			return
		}
		if added {
			break
		}
		// The lane died between lookup and add: the next lookup opens a
		// new one.
	}
	if err := l.w.send(&fwd); err != nil {
		// Not encodable: nothing was written, the lane goes on.
		if fw, ok := l.take(pub.Seq); ok {
			werr := &transport.Error{Code: transport.CodeInternal, Message: fmt.Sprintf("%s could not forward the record: %v", b.cfg.NodeID, err)}
			errors.As(err, &werr)
			p.fail(fw.in, werr)
		}
	}
}

// laneTo returns this session's lane to node, opening one (without
// waiting for it to connect) if there is none or the one there has died;
// nil once the session has closed its lanes.
func (p *pubSession) laneTo(node shardmap.Node) *lane {
	p.lanes.Lock()
	defer p.lanes.Unlock()
	if p.lanes.closed {
		return nil
	}
	if l := p.lanes.m[node.ID]; l != nil && !l.dead.Load() {
		return l
	}
	l := &lane{p: p, owner: node.ID, addr: node.Addr}
	l.w = newDetachedWriter(&p.workers, func(err error) { l.kill(fmt.Errorf("writing to %s: %w", node.ID, err)) })
	l.ctx, l.cancel = context.WithCancel(p.ctx)
	l.mu.pending = map[uint64]forwarded{}
	p.lanes.m[node.ID] = l
	p.workers.Add(1)
	go l.connect(node)
	return l
}

// connect dials the lane's owner (or takes the pooled connection to it),
// opens the lane's stream, starts its reader and writes what was routed
// to it meanwhile. It holds the lane writer's flusher role until then.
func (l *lane) connect(node shardmap.Node) {
	defer l.p.workers.Done()
	s, err := l.open(node)
	if err != nil {
		l.w.abort(err)
		l.kill(err)
		return
	}
	l.mu.Lock()
	if l.dead.Load() {
		l.mu.Unlock()
		l.w.abort(errors.New("lane closed"))
		s.CancelRead(quic.StreamErrorCode(transport.CodeUnavailable))
		s.CancelWrite(quic.StreamErrorCode(transport.CodeUnavailable))
		return
	}
	l.mu.s = s
	l.mu.Unlock()
	l.w.attach(s)
	l.p.workers.Add(1)
	go l.read(s)
	l.w.flush()
}

func (l *lane) open(node shardmap.Node) (*quic.Stream, error) {
	ctx, cancel := context.WithTimeout(l.ctx, dialTimeout)
	defer cancel()
	if k := l.p.b.cfg.Knobs.DialPeer; k != nil {
		if err := k(ctx, node.ID); err != nil {
			return nil, err
		}
	}
	conn, err := l.p.b.peers.conn(ctx, node)
	if err != nil {
		return nil, err
	}
	return conn.OpenStreamSync(ctx)
}

// add records fw as awaiting the owner's answer. It reports whether it
// did, and whether fw's Seq is already awaiting one (dup); neither when
// the lane is dead.
func (l *lane) add(fw forwarded) (added, dup bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead.Load() {
		return false, false
	}
	seq := fw.in.pub.Seq
	if _, dup := l.mu.pending[seq]; dup {
		return false, true
	}
	l.mu.pending[seq] = fw
	return true, false
}

func (l *lane) take(seq uint64) (forwarded, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, ok := l.mu.pending[seq]
	delete(l.mu.pending, seq)
	return f, ok
}

// read relays the owner's answers to the publisher until the lane ends.
// It never waits for anything but the owner: refusals to re-route go to
// the session's retrier.
func (l *lane) read(s *quic.Stream) {
	defer l.p.workers.Done()
	r := transport.NewReader(s, l.p.b.cfg.Transport.MaxFrame)
	for {
		f, err := r.Read()
		if err != nil {
			l.kill(err)
			return
		}
		switch f := f.(type) {
		case *transport.Ack:
			if fw, ok := l.take(f.Seq); ok {
				l.p.reply(&fw.in, f)
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

// answer handles an owner's refusal of a forwarded record: NotOwner means
// the map moved, so the record goes to the session's retrier, which
// catches up and routes it again (bounded); anything else goes back to
// the publisher. It never blocks.
func (p *pubSession) answer(fw forwarded, e *transport.Error) {
	if e.Code == transport.CodeNotOwner && fw.in.repl {
		// A replica that is not the leader: it names the leader, if it
		// knows one. Routed again until the record's deadline.
		p.b.noteLeader(shardmap.ShardID{Stream: fw.in.pub.Stream, Shard: fw.in.ev.shard}, e.Owner)
		if time.Now().Before(fw.in.deadline) {
			p.b.tel.rerouted(&fw.in.ev, e)
			r := refused{in: fw.in, attempt: fw.attempt, epoch: e.Epoch, by: e.Owner}
			if e.Owner == "" {
				r.delay = p.b.cfg.RaftTick
			}
			p.requeue(r)
			return
		}
	}
	if e.Code != transport.CodeNotOwner || fw.attempt+1 >= maxForwardAttempts {
		p.fail(fw.in, e)
		return
	}
	p.b.tel.rerouted(&fw.in.ev, e) // this forward is over; the record goes on
	p.requeue(refused{in: fw.in, attempt: fw.attempt, epoch: e.Epoch, by: e.Owner})
}

// requeue hands r to the session's retrier, starting it if need be. It
// never blocks.
func (p *pubSession) requeue(r refused) {
	p.retry.Lock()
	p.retry.queue = append(p.retry.queue, r)
	start := !p.retry.running
	if start {
		p.retry.running = true
		p.workers.Add(1)
	}
	p.retry.Unlock()
	if start {
		go p.retrier()
	}
}

// refused is a forward an owner refused with NotOwner at epoch.
type refused struct {
	in      inbound
	attempt int
	epoch   uint64 // the refusing owner's map epoch
	by      string // the refusing owner's id
	// delay is how long to wait before routing it again: a replicated
	// shard's record waiting for a leader to be elected.
	delay time.Duration
}

// retrier re-routes refused forwards, in the order they were refused:
// for each it catches up to the refusing owner's map (waiting for the
// control plane if need be, holding nothing) and dispatches it again.
// It runs while there are refusals to handle; the lanes' readers start
// it, so they never wait for a map.
func (p *pubSession) retrier() {
	defer p.workers.Done()
	for {
		p.retry.Lock()
		if len(p.retry.queue) == 0 {
			p.retry.running = false
			p.retry.queue = nil
			p.retry.Unlock()
			return
		}
		r := p.retry.queue[0]
		p.retry.queue = p.retry.queue[1:]
		p.retry.Unlock()

		if p.ctx.Err() != nil {
			p.fail(r.in, &transport.Error{Code: transport.CodeShuttingDown,
				Message: fmt.Sprintf("the publisher stream on %s closed before the record could be routed again; nothing was written", p.b.cfg.NodeID)})
			continue
		}
		if r.delay > 0 {
			t := time.NewTimer(r.delay)
			select {
			case <-t.C:
			case <-p.ctx.Done():
				t.Stop()
			}
		}

		ctx, cancel := context.WithTimeout(p.ctx, p.b.cfg.ForwardTimeout)
		_, err := p.b.member.Refresh(ctx, r.epoch)
		cancel()
		if err != nil {
			p.fail(r.in, &transport.Error{Code: transport.CodeUnavailable,
				Message: fmt.Sprintf("%s was refused by %s (not the owner at epoch %d) and could not get that map: %v", p.b.cfg.NodeID, r.by, r.epoch, err)})
			continue
		}
		p.dispatch(r.in.rerouted(), r.attempt+1)
	}
}

// kill ends the lane and fails every forward still waiting on it: the owner
// may or may not have written them, and the publisher must be told so.
func (l *lane) kill(cause error) {
	l.mu.Lock()
	if l.dead.Load() {
		l.mu.Unlock()
		return
	}
	l.dead.Store(true)
	pending, s := l.mu.pending, l.mu.s
	l.mu.pending = nil
	l.mu.Unlock()
	l.cancel()
	if s != nil {
		s.CancelRead(quic.StreamErrorCode(transport.CodeUnavailable))
		s.CancelWrite(quic.StreamErrorCode(transport.CodeUnavailable))
	}
	for _, fw := range pending {
		if s == nil && fw.in.repl && time.Now().Before(fw.in.deadline) && l.p.ctx.Err() == nil {
			// Never sent, and a replicated shard has other replicas: one
			// of them may lead by now.
			l.p.b.forgetLeader(shardmap.ShardID{Stream: fw.in.pub.Stream, Shard: fw.in.ev.shard}, l.owner)
			l.p.requeue(refused{in: fw.in.rerouted(), attempt: fw.attempt, delay: l.p.b.cfg.RaftTick, by: l.owner})
			continue
		}
		e := &transport.Error{Code: transport.CodeUnavailable, Owner: l.owner,
			Message: fmt.Sprintf("lost %s before it acknowledged; the record may or may not have been written (%v)", l.owner, cause)}
		if s == nil { // never connected: nothing was sent
			e.Message = fmt.Sprintf("%s (%s), the owner of %s/%d, is not reachable from %s: %v", l.owner, l.addr, fw.in.pub.Stream, fw.in.ev.shard, l.p.b.cfg.NodeID, cause)
		}
		l.p.fail(fw.in, e)
	}
}

func (l *lane) close() { l.kill(errors.New("publisher stream closed")) }
