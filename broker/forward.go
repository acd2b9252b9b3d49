package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
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
// lane to that peer is a stream on it, and so are the pair's raft
// messages. A connection carries at most lanesPerConn lanes, a little
// under the streams the peer lets one connection open
// (transport.Config.MaxIncomingStreams): the lanes past them go on
// overflow connections to the same peer, dialed as needed and closed
// when their last lane leaves. One publisher stream that forwards is one
// lane, and a broker's clients may hold far more publisher streams than
// one connection's streams; those past the limit once waited for a
// stream until dialTimeout and failed unavailable.
type peerPool struct {
	tls          *tls.Config
	cfg          transport.Config
	log          *slog.Logger
	acct         *quicAccount // counts what the dialed connections send and lose
	lanesPerConn int

	// ctx bounds the pool's dials: close cancels it. A dial is the
	// pool's, not its first caller's: one lane's end must not fail the
	// others that wait for the same connection.
	ctx    context.Context
	cancel context.CancelFunc
	dials  sync.WaitGroup // dials in flight, some no longer in conns (dropDown)

	// mu guards conns; dialing happens outside it, one dial per peer at a
	// time through the entry's ready channel.
	mu struct {
		sync.Mutex
		closed bool
		conns  map[string]*peerConn
		// overflow holds each peer's overflow connections, for lanes only.
		overflow map[string][]*peerConn
	}
}

type peerConn struct {
	id    string
	addr  string
	ready chan struct{} // closed once conn or err is set
	conn  *quic.Conn
	err   error
	// stopDial ends the dial in flight (dropDown); set before it starts.
	stopDial context.CancelFunc
	// answered is set once a lane on conn read a frame of the peer's: the
	// peer took the connection (see refusedAtAccept).
	answered atomic.Bool

	// overflow: one of the pool's overflow connections (lanes only).
	overflow bool

	// Guarded by the pool's mu: the forwarding lanes on conn (counted from
	// their lease, before the dial of an overflow connection ends), and
	// whether the peer ended one cleanly (see release).
	lanes   int
	retired bool
}

func newPeerPool(tlsConf *tls.Config, cfg transport.Config, log *slog.Logger, acct *quicAccount) *peerPool {
	// The peer's stream limit is taken to be this broker's (one cluster,
	// one configuration); the rest of a connection's streams are left to
	// raft's stream and a rejoin's.
	streams := int(cfg.WithDefaults().MaxIncomingStreams)
	p := &peerPool{tls: tlsConf, cfg: cfg, log: log, acct: acct, lanesPerConn: max(streams-max(streams/64, 1), 1)}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.mu.conns = map[string]*peerConn{}
	p.mu.overflow = map[string][]*peerConn{}
	return p
}

var errPoolClosed = errors.New("broker: peer pool closed")

// conn returns the connection to node, dialing it if there is none or the
// one there has died or points at an old address.
func (p *peerPool) conn(ctx context.Context, node shardmap.Node) (*quic.Conn, error) {
	pc, err := p.get(ctx, node)
	if err != nil {
		return nil, err
	}
	return pc.conn, nil
}

// lease returns a connection to node with room for a forwarding lane,
// which gives it back with release when it ends: the pooled one, or, when
// that is full, an overflow connection.
func (p *peerPool) lease(ctx context.Context, node shardmap.Node) (*peerConn, error) {
	for {
		pc, err := p.get(ctx, node)
		if err != nil {
			return nil, err
		}
		p.mu.Lock()
		if pc.retired { // and so out of the pool: the next get dials
			p.mu.Unlock()
			continue
		}
		if pc.lanes < p.lanesPerConn {
			pc.lanes++
			p.mu.Unlock()
			return pc, nil
		}
		ov := p.overflowLocked(node)
		p.mu.Unlock()
		if ov == nil {
			return nil, errPoolClosed
		}
		select {
		case <-ov.ready:
		case <-ctx.Done():
			p.release(ov, false)
			return nil, ctx.Err()
		}
		if ov.err != nil {
			p.release(ov, false)
			return nil, ov.err
		}
		return ov, nil
	}
}

// overflowLocked counts a lane on an overflow connection to node with
// room for it, dialing a new one if none has; nil once the pool is
// closed. Called with the pool's lock held.
func (p *peerPool) overflowLocked(node shardmap.Node) *peerConn {
	if p.mu.closed {
		return nil
	}
	for _, pc := range p.mu.overflow[node.ID] {
		if pc.addr != node.Addr || pc.retired || pc.lanes >= p.lanesPerConn {
			continue
		}
		select {
		case <-pc.ready:
			if pc.err != nil || pc.conn.Context().Err() != nil {
				continue // leaves with its last lane (release)
			}
		default:
		}
		pc.lanes++
		return pc
	}
	pc := p.dialLocked(node)
	pc.overflow, pc.lanes = true, 1
	p.mu.overflow[node.ID] = append(p.mu.overflow[node.ID], pc)
	return pc
}

// dialLocked returns a new entry for node whose dial has started. Called
// with the pool's lock held.
func (p *peerPool) dialLocked(node shardmap.Node) *peerConn {
	pc := &peerConn{id: node.ID, addr: node.Addr, ready: make(chan struct{})}
	ctx, cancel := context.WithTimeout(p.ctx, dialTimeout)
	pc.stopDial = cancel
	p.dials.Add(1)
	// Ends within dialTimeout; close waits for it.
	go p.dial(ctx, pc, node)
	return pc
}

// pooledLocked reports whether pc is still one of the pool's. Called with
// the pool's lock held.
func (p *peerPool) pooledLocked(pc *peerConn) bool {
	if pc.overflow {
		return slices.Contains(p.mu.overflow[pc.id], pc)
	}
	return p.mu.conns[pc.id] == pc
}

// release gives back a lane's lease on pc. ended says the peer ended the
// lane's stream cleanly, after answering everything on it: it does so
// only when it shuts down, and waits for its forwarders to hang up, since
// closing a connection discards what its receiver has not read yet. So
// pc takes no more lanes, and the last lane to leave closes it.
//
// An overflow connection leaves the pool with its last lane, and is
// closed then (by its dial, if that has not ended).
func (p *peerPool) release(pc *peerConn, ended bool) {
	p.mu.Lock()
	pc.lanes--
	if ended {
		pc.retired = true
		if p.mu.conns[pc.id] == pc {
			delete(p.mu.conns, pc.id)
		}
	}
	hangUp := pc.retired && pc.lanes == 0
	if pc.overflow && pc.lanes == 0 && !p.mu.closed { // closed: close closed it
		p.mu.overflow[pc.id] = slices.DeleteFunc(p.mu.overflow[pc.id], func(x *peerConn) bool { return x == pc })
		if len(p.mu.overflow[pc.id]) == 0 {
			delete(p.mu.overflow, pc.id)
		}
		select {
		case <-pc.ready:
			hangUp = pc.conn != nil
		default:
			hangUp = false // its dial finds it out of the pool, and closes it
		}
	}
	p.mu.Unlock()
	if hangUp {
		pc.conn.CloseWithError(quic.ApplicationErrorCode(transport.CodeShuttingDown), "every lane answered")
	}
}

// get returns node's entry in the pool once it is connected.
func (p *peerPool) get(ctx context.Context, node shardmap.Node) (*peerConn, error) {
	p.mu.Lock()
	if p.mu.closed {
		p.mu.Unlock()
		return nil, errPoolClosed
	}
	var moved *quic.Conn // to close: node's old address, with no lane on it
	pc := p.mu.conns[node.ID]
	if pc != nil {
		select {
		case <-pc.ready:
			switch {
			case pc.err != nil || pc.conn.Context().Err() != nil:
				pc = nil
			case pc.addr != node.Addr:
				// The peer moved: its lanes on the old connection go on,
				// and the last to leave closes it (release).
				pc.retired = true
				if pc.lanes == 0 {
					moved = pc.conn
				}
				pc = nil
			}
		default:
		}
	}
	if pc == nil {
		pc = p.dialLocked(node)
		p.mu.conns[node.ID] = pc
	}
	p.mu.Unlock()
	if moved != nil {
		moved.CloseWithError(quic.ApplicationErrorCode(transport.CodeUnavailable), "peer moved to another address")
	}
	select {
	case <-pc.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if pc.err != nil {
		return nil, pc.err
	}
	return pc, nil
}

// dial connects pc to node, within ctx (dialTimeout; dropDown or close
// cancel it), and closes pc.ready.
func (p *peerPool) dial(ctx context.Context, pc *peerConn, node shardmap.Node) {
	defer p.dials.Done()
	defer pc.stopDial()
	// Only node.ID's own node certificate will do: an address taken over
	// by another node, or by a client, is refused.
	conn, err := transport.Dial(ctx, node.Addr, transport.VerifyPeer(p.tls, transport.RoleNode, node.ID), p.cfg)
	// Judged and made ready under the pool's lock, which dropDown and
	// close take to look at the entry: either they see it ready, with its
	// connection, and close that, or this sees it out of the pool.
	var reject *quic.Conn
	var code quic.ApplicationErrorCode
	var why string
	p.mu.Lock()
	if err == nil {
		switch {
		case p.mu.closed:
			// close may have passed this entry by (dropDown had taken it
			// out of the pool): the connection is this dial's to close.
			reject, code, why = conn, 0, "broker shutting down"
			conn, err = nil, errPoolClosed
		case !p.pooledLocked(pc): // dropDown gave it up as it ended, or every lane that waited for it left
			reject, code, why = conn, quic.ApplicationErrorCode(transport.CodeUnavailable), "peer is down in the shard map"
			conn, err = nil, fmt.Errorf("dial %s: %w", node.ID, errPeerDown)
		}
	}
	pc.conn, pc.err = conn, err
	close(pc.ready)
	p.mu.Unlock()
	if reject != nil {
		reject.CloseWithError(code, why)
	}
	if err == nil {
		p.acct.watch(conn, kindPeer)
	}
}

// errPeerDown ends a dial to a peer that the map marked down meanwhile.
var errPeerDown = errors.New("broker: peer is down in the shard map")

// dropDown closes connections to peers the map says are down, so forwards
// waiting on them fail now rather than at the QUIC idle timeout, and gives
// up dials to them in flight, so that the lanes waiting for those route
// their records again now rather than after dialTimeout (a broker that
// shut down is marked down while its peers may still be redialing it).
// It closes at once, though a live peer marked down by a stalled control
// plane then has the answers to what was in flight lost (their records
// end of unknown outcome): a 1 s grace for them was measured to slow
// failover, kill -9 to the first ack by a new leader median 2.29 s
// against 1.42 s (docs/performance.md, "Connections to peers marked
// down").
func (p *peerPool) dropDown(m *shardmap.Map) {
	var closing []*peerConn
	down := func(pc *peerConn) {
		select {
		case <-pc.ready:
			if pc.conn != nil {
				closing = append(closing, pc)
			}
		default:
			pc.stopDial()
			p.log.Info("peer down in the shard map; dial to it given up", "peer", pc.id, "epoch", m.Epoch)
		}
	}
	live := func(id string) bool { n, ok := m.Node(id); return ok && n.Live }
	p.mu.Lock()
	for id, pc := range p.mu.conns {
		if !live(id) {
			delete(p.mu.conns, id)
			down(pc)
		}
	}
	for id, pcs := range p.mu.overflow {
		if !live(id) {
			delete(p.mu.overflow, id)
			for _, pc := range pcs {
				down(pc)
			}
		}
	}
	p.mu.Unlock()
	// Closed with the pool's lock released: CloseWithError waits for the
	// connection's loop to end, which sends first, and every lane's lease
	// and release, and raft's peer lookups, take that lock.
	for _, pc := range closing {
		pc.conn.CloseWithError(quic.ApplicationErrorCode(transport.CodeUnavailable), "peer is down in the shard map")
		p.log.Warn("peer down in the shard map; connection to it closed", "peer", pc.id, "epoch", m.Epoch)
	}
}

func (p *peerPool) close() {
	p.cancel() // dials in flight end
	p.mu.Lock()
	p.mu.closed = true
	var conns []*peerConn
	for _, pc := range p.mu.conns {
		conns = append(conns, pc)
	}
	for _, pcs := range p.mu.overflow {
		conns = append(conns, pcs...)
	}
	p.mu.conns, p.mu.overflow = nil, nil
	p.mu.Unlock()
	for _, pc := range conns {
		<-pc.ready
		if pc.conn != nil {
			pc.conn.CloseWithError(0, "broker shutting down")
		}
	}
	p.dials.Wait() // those dropDown gave up too
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

	dead atomic.Bool // set (under mu) once the lane takes no more forwards: killed or draining

	// mu guards the stream once open and the forwards awaiting the
	// owner's answer, by Seq. It is never held across a blocking call.
	mu struct {
		sync.Mutex
		s       *quic.Stream // nil while connecting: nothing has reached the owner
		pc      *peerConn    // the pooled connection s is on, leased until the lane ends
		pending map[uint64]forwarded
		killed  bool
		drain   *time.Timer // bounds a drain (see drain); stopped by kill
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
	if st, ok := m.Stream(pub.Stream); ok {
		fwd.Created = st.Created
	}
	// Only what the owner needs goes before the write: the hop context
	// (the parent of the owner's server span), if traced.
	fwd.Headers = b.tel.forwardContext(&in.ev, owner, pub.Headers)
	fw := forwarded{in: in, attempt: attempt}
	id := shardmap.ShardID{Stream: pub.Stream, Shard: shard}
	var l *lane
	for {
		if l = p.laneTo(node); l == nil {
			p.fail(fw.in, &transport.Error{Code: transport.CodeShuttingDown,
				Message: fmt.Sprintf("the publisher stream on %s is closing", b.cfg.NodeID)})
			return
		}
		if !p.onRoute(&fw.in, id, l, attempt, true) {
			return // waits behind the shard's earlier records (order.go)
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
		p.resolved(&fw.in, false)
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
	l.w = newDetachedWriter(&p.workers, l.writeFailed)
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
	s, pc, err := l.open(node)
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
		l.p.b.peers.release(pc, false)
		return
	}
	l.mu.s, l.mu.pc = s, pc
	l.mu.Unlock()
	l.w.attach(s)
	l.p.workers.Add(1)
	go l.read(s, pc)
	l.w.flush()
}

func (l *lane) open(node shardmap.Node) (*quic.Stream, *peerConn, error) {
	ctx, cancel := context.WithTimeout(l.ctx, dialTimeout)
	defer cancel()
	if k := l.p.b.cfg.Knobs.DialPeer; k != nil {
		if err := k(ctx, node.ID); err != nil {
			return nil, nil, err
		}
	}
	pc, err := l.p.b.peers.lease(ctx, node)
	if err != nil {
		return nil, nil, err
	}
	s, err := pc.conn.OpenStreamSync(ctx)
	if err != nil {
		l.p.b.peers.release(pc, false)
		return nil, nil, err
	}
	return s, pc, nil
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

// read relays the owner's answers on s, a stream on pc, to the publisher
// until the lane ends.
// It never waits for anything but the owner: refusals to re-route go to
// the session's retrier. While more answers are buffered it corks the
// publisher's stream, so answers that arrived together go out in one
// write (as a commit's acks do on the owner); it never waits in Read
// while corked (Ready: the next frame is buffered).
func (l *lane) read(s *quic.Stream, pc *peerConn) {
	defer l.p.workers.Done()
	r := transport.NewReader(s, l.p.b.cfg.Transport.MaxFrame)
	corked := false
	defer func() {
		if corked {
			l.p.acks.uncork()
		}
	}()
	for {
		if corked && !r.Ready() {
			l.p.acks.uncork()
			corked = false
		}
		f, err := r.Read()
		if err != nil {
			l.kill(err)
			return
		}
		if !pc.answered.Load() {
			pc.answered.Store(true)
		}
		if !corked && r.Ready() {
			l.p.acks.cork()
			corked = true
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
			l.p.answer(fw, f, l.owner)
		}
	}
}

// answer handles owner by's refusal of a forwarded record: NotOwner
// means the map moved, so the record goes to the session's retrier, which
// catches up and routes it again (bounded); anything else goes back to
// the publisher. It never blocks.
func (p *pubSession) answer(fw forwarded, e *transport.Error, by string) {
	id := shardmap.ShardID{Stream: fw.in.pub.Stream, Shard: fw.in.ev.shard}
	if e.Code == transport.CodeShuttingDown && e.Owner == by && fw.in.replicated() {
		// The replica this lane reached is closing and did not take the
		// record in (its own refusal names it): nothing was written, and
		// it resigns its leadership as it closes. Like a replica that
		// knows no leader: the other replicas are tried, until the
		// record's deadline.
		e = &transport.Error{Code: transport.CodeNotOwner, Epoch: e.Epoch, Message: e.Message}
	}
	if e.Code == transport.CodeNotOwner && fw.in.replicated() {
		// A replica that is not the leader: it names the leader, if it
		// knows one; if not, the other replicas are tried first
		// (noteRefusal). Routed again until the record's deadline.
		p.b.noteRefusal(&fw.in, id, by, e.Owner)
		if fw.in.expired() {
			// Unavailable, not this refusal: the publisher's map is not
			// behind, and a replica that knows no leader names no owner
			// to go to. Nothing was written.
			p.fail(fw.in, &transport.Error{Code: transport.CodeUnavailable,
				Message: fmt.Sprintf("%s found no leader of %s that took the record within %v (ForwardTimeout); nothing was written (the last replica asked: %s)", p.b.cfg.NodeID, id, p.b.cfg.ForwardTimeout, e.Message)})
			return
		}
		p.b.tel.rerouted(&fw.in.ev, e)
		r := refused{in: fw.in, attempt: fw.attempt, epoch: e.Epoch, by: by}
		if e.Owner == "" {
			r.delay = p.b.cfg.leaderWait(fw.attempt)
		}
		p.requeue(r, id)
		return
	}
	if e.Code != transport.CodeNotOwner || fw.attempt+1 >= maxForwardAttempts {
		p.fail(fw.in, e)
		return
	}
	p.b.tel.rerouted(&fw.in.ev, e) // this forward is over; the record goes on
	p.requeue(refused{in: fw.in, attempt: fw.attempt, epoch: e.Epoch, by: by}, id)
}

// writeFailed handles the failure of a write on the lane. An owner that
// stopped reading because it is shutting down (a graceful Close: it
// cancels the read side of its peer streams with shutting_down) still
// commits and answers what it read, so the lane drains; any other failure
// kills it.
func (l *lane) writeFailed(err error) {
	if stoppedShuttingDown(err) {
		l.drain(err)
		return
	}
	l.kill(fmt.Errorf("writing to %s: %w", l.owner, err))
}

// stoppedShuttingDown reports whether err is the peer's STOP_SENDING
// with shutting_down: it stopped reading the stream as it shuts down.
func stoppedShuttingDown(err error) bool {
	var se *quic.StreamError
	return errors.As(err, &se) && se.Remote && se.ErrorCode == quic.StreamErrorCode(transport.CodeShuttingDown)
}

// drain makes the lane take no more forwards (the session opens another
// lane for the next) while its reader goes on relaying the owner's
// answers to what it read, until the owner ends the stream. What is still
// unanswered then, or after ForwardTimeout, fails as unknown outcome
// (kill). Killing the lane at once threw away the owner's acks of records
// it committed during its shutdown, answering them "may or may not have
// been written".
func (l *lane) drain(cause error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead.Load() {
		return
	}
	l.dead.Store(true)
	l.p.workers.Add(1)
	l.mu.drain = time.AfterFunc(l.p.b.cfg.ForwardTimeout, func() {
		defer l.p.workers.Done()
		l.kill(fmt.Errorf("%s stopped reading (%v) and did not answer the rest within ForwardTimeout", l.owner, cause))
	})
}

// refusedAtAccept reports whether cause, a lane's end on pc, is the owner
// closing pc unavailable before any answer on it: a broker refuses so
// only as it accepts a connection, before it reads any stream (starting
// with the control plane out of reach, broker awaitServing), so nothing
// sent on pc was read.
func refusedAtAccept(cause error, pc *peerConn) bool {
	var ae *quic.ApplicationError
	return pc != nil && !pc.answered.Load() && errors.As(cause, &ae) && ae.Remote &&
		ae.ErrorCode == quic.ApplicationErrorCode(transport.CodeUnavailable)
}

// kill ends the lane and fails every forward still waiting on it: the owner
// may or may not have written them, and the publisher must be told so.
func (l *lane) kill(cause error) {
	l.mu.Lock()
	if l.mu.killed {
		l.mu.Unlock()
		return
	}
	l.mu.killed = true
	l.dead.Store(true)
	if t := l.mu.drain; t != nil && t.Stop() {
		l.p.workers.Done() // the drain's timer will not run
	}
	pending, s, pc := l.mu.pending, l.mu.s, l.mu.pc
	l.mu.pending, l.mu.pc = nil, nil
	l.mu.Unlock()
	l.cancel()
	if s != nil {
		s.CancelRead(quic.StreamErrorCode(transport.CodeUnavailable))
		s.CancelWrite(quic.StreamErrorCode(transport.CodeUnavailable))
	}
	if pc != nil {
		l.p.b.peers.release(pc, errors.Is(cause, io.EOF))
	}
	// An owner ends the stream (its FIN: io.EOF) only once it has answered
	// every forward it took in (pubSession.finish): those still pending
	// were never read, so not written, as those never sent. An owner
	// shutting down stops reading its peers' streams at once
	// (pubSession.drain), and what it left unread is refused as it
	// refuses what it reads while it drains.
	// So were the forwards on a connection the owner refused as it
	// accepted it.
	atAccept := s != nil && refusedAtAccept(cause, pc)
	unread := s == nil || errors.Is(cause, io.EOF) || atAccept
	leaving := s != nil && errors.Is(cause, io.EOF) && stoppedShuttingDown(context.Cause(s.Context()))
	for _, fw := range pending {
		if unread && fw.in.replicated() && !fw.in.expired() && l.p.ctx.Err() == nil {
			// Never sent, and a replicated shard has other replicas: one
			// of them may lead by now, and is tried first.
			id := shardmap.ShardID{Stream: fw.in.pub.Stream, Shard: fw.in.ev.shard}
			l.p.b.noteRefusal(&fw.in, id, l.owner, "")
			l.p.requeue(refused{in: fw.in.rerouted(), attempt: fw.attempt, delay: l.p.b.cfg.leaderWait(fw.attempt), by: l.owner}, id)
			continue
		}
		e := &transport.Error{Code: transport.CodeUnavailable, Owner: l.owner,
			Message: fmt.Sprintf("lost %s before it acknowledged; the record may or may not have been written (%v)", l.owner, cause)}
		switch {
		case s == nil: // never connected: nothing was sent
			e.Message = fmt.Sprintf("%s (%s), the owner of %s/%d, is not reachable from %s: %v; nothing was sent to it, so nothing was written", l.owner, l.addr, fw.in.pub.Stream, fw.in.ev.shard, l.p.b.cfg.NodeID, cause)
		case leaving:
			e = leavingRefusal(l.owner)
		case atAccept:
			e.Message = fmt.Sprintf("%s refused the connection before reading anything; nothing was written (%v)", l.owner, cause)
		case unread:
			e.Message = fmt.Sprintf("%s ended the stream without taking the record in; nothing was written", l.owner)
		}
		l.p.fail(fw.in, e)
	}
}

func (l *lane) close() { l.kill(errors.New("publisher stream closed")) }
