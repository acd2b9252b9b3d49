package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/ctl/ctlclient"
	"github.com/felix-broker/felix/internal/dirlock"
	"github.com/felix-broker/felix/internal/logonce"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// ErrClosed is returned by Start on a closed broker.
var ErrClosed = errors.New("broker: closed")

// Broker is one Felix broker. Create it with New, run it with Start, stop
// it with Close.
type Broker struct {
	cfg    Config
	log    *slog.Logger
	shards *shardSet
	peers  *peerPool
	quic   quicAccount // what the broker's QUIC connections sent and lost (quicstats.go)
	raft   *raftNet    // raft messages of the replicated shards (raft.go)
	// leaders holds, by shardmap.ShardID, the node a replica last named
	// as the leader of a replicated shard (a string), for routing from a
	// broker outside its replica set; forgotten when that node refuses a
	// record knowing no leader, or cannot be reached (noteRefusal).
	leaders sync.Map
	tel     *telemetry
	subs    subRegistry
	limits  *limits // client resource limits (limits.go)
	// disk is the data directory's free space (diskspace.go); diskErr
	// remembers that reading it failed, to log that once.
	disk    diskSpace
	diskErr logonce.Set

	// joined is the control plane membership once Start has it; ready is
	// set once the first map is applied (its logs open) and cleared by
	// Close. Both are read by health checks from any goroutine.
	joined atomic.Pointer[ctlclient.Member]
	ready  atomic.Bool
	// started is when Start set ready; replicasSettled is set once
	// readiness stops waiting for the hosted replicas to catch up
	// (replicahealth.go).
	started         time.Time
	replicasSettled atomic.Bool
	// gate holds the connections accepted before Start serves
	// (awaitServing).
	gate startGate
	// lock keeps other processes off the data directory until Close.
	lock *dirlock.Lock
	// applied is the last map applyMap applied, whose replicas the
	// replica report speaks of (replicaReport).
	applied atomic.Pointer[shardmap.Map]

	// ctx is cancelled when Close begins; every goroutine the broker starts
	// watches it and is counted in wg.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// closed is closed when the first Close has finished, with closeErr
	// its result, which a later Close waits for and returns.
	closed   chan struct{}
	closeErr error

	ln     *transport.Listener
	member *ctlclient.Member
	// missed is the last catch-up to a map epoch that failed (catchup.go).
	missed catchUpMiss
	// clients is the one catch-up at a time that what clients send may
	// start (catchup.go).
	clients clientCatchUp

	// refusals and denials remember which certificate was refused on which
	// protocol and which principal was denied what, so each is logged once.
	refusals, denials logonce.Set

	// mu guards the set of live sessions so Close can drain them.
	mu struct {
		sync.Mutex
		closing bool
		conns   map[*quic.Conn]struct{}
		pubs    map[*pubSession]struct{}
	}
}

// New validates cfg and returns a broker that has not started yet.
func New(cfg Config) (*Broker, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	// Before anything touches the data directory: a second broker on it
	// would overwrite this one's records (internal/dirlock).
	lock, err := dirlock.Take(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("broker %s: %w", cfg.NodeID, err)
	}
	b, err := newBroker(cfg)
	if err != nil {
		lock.Release()
		return nil, err
	}
	b.lock = lock
	return b, nil
}

// newBroker is New once the data directory is locked.
func newBroker(cfg Config) (*Broker, error) {
	var err error
	b := &Broker{cfg: cfg, log: cfg.Logger.With("node", cfg.NodeID)}
	b.disk.free.Store(-1)
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.closed = make(chan struct{})
	b.gate = startGate{ended: make(chan struct{}), outage: make(chan struct{})}
	b.peers = newPeerPool(cfg.PeerTLS, cfg.Transport, b.log, &b.quic)
	b.mu.conns = map[*quic.Conn]struct{}{}
	b.mu.pubs = map[*pubSession]struct{}{}
	if b.limits, err = newLimits(&b.cfg, b.log); err != nil {
		return nil, fmt.Errorf("broker %s: metrics: %w", cfg.NodeID, err)
	}
	if b.tel, err = newTelemetry(b, cfg.TracerProvider, cfg.MeterProvider); err != nil {
		return nil, fmt.Errorf("broker %s: metrics: %w", cfg.NodeID, err)
	}
	if b.shards, err = newShardSet(cfg, b.log, b.tel); err != nil {
		b.tel.close() // its metrics callback holds b
		return nil, fmt.Errorf("broker %s: %w", cfg.NodeID, err)
	}
	b.raft = newRaftNet(cfg.NodeID, cfg.RaftTick, cfg.RaftElectionTicks, entryBytes(cfg), cfg.Knobs.RaftSimplex, closeTakes(cfg), b.peers, b.currentMap, b.log)
	b.raft.handBack = cfg.Knobs.HandLeadersBack
	b.shards.raft = b.raft
	b.raft.diskFull = &b.disk.low
	b.raft.toCtl = func(ctx context.Context, req *transport.Request) (*transport.Response, error) {
		m := b.joined.Load()
		if m == nil {
			return nil, errNoMap
		}
		return m.Request(ctx, req)
	}
	b.raft.startRetention(cfg.RetentionCheck, b.shards.replaceFailed)
	b.shards.startSweep(cfg.RetentionCheck)
	return b, nil
}

// Start listens, registers with the control plane, waits for the first
// shard map, opens (and recovers) the logs of the shards it owns, and then
// serves clients and peers until Close. ctx bounds the start-up only.
//
// A Close meanwhile ends the start-up (a join still waiting for the
// control plane gives up) and waits for Start to return, which returns an
// error matching ErrClosed: nothing Start began runs after Close returns.
func (b *Broker) Start(ctx context.Context) error {
	b.mu.Lock()
	if b.mu.closing {
		b.mu.Unlock()
		return ErrClosed
	}
	b.wg.Add(1) // Close waits for Start, as for the goroutines it starts
	b.mu.Unlock()
	defer b.wg.Done()
	defer b.gate.end() // after ready is set, or not at all
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(b.ctx, cancel)() // Close cancels b.ctx

	ln, err := transport.Listen(b.cfg.Listen, b.cfg.ServerTLS, b.cfg.Transport)
	if err != nil {
		return fmt.Errorf("broker %s: listen on %s: %w", b.cfg.NodeID, b.cfg.Listen, err)
	}
	// Accept from now on: a connection accepted before the broker serves
	// waits for it (awaitServing) instead of sitting unanswered in the
	// listener's queue for as long as the control plane is out of reach.
	// Close takes ln to close from here.
	b.mu.Lock()
	if b.mu.closing {
		b.mu.Unlock()
		ln.Close()
		return ErrClosed
	}
	b.ln = ln
	b.wg.Add(1)
	b.mu.Unlock()
	go b.acceptLoop(ln)
	failed := func() {
		// ln is Close's to close once closing is set; else Start's.
		b.mu.Lock()
		closing := b.mu.closing
		if !closing {
			b.ln = nil
		}
		b.mu.Unlock()
		if !closing {
			ln.Close() // acceptLoop returns
		}
	}
	advertise := b.cfg.Advertise
	if advertise == "" {
		advertise = ln.Addr().String()
	}
	clusterID, err := readClusterID(b.cfg.DataDir)
	if err != nil {
		failed()
		return fmt.Errorf("broker %s: %w", b.cfg.NodeID, err)
	}
	member, err := ctlclient.Join(ctx, ctlclient.MemberConfig{
		CtlAddrs:  b.cfg.ctlAddrs(), // any ctl member will do
		TLS:       b.cfg.CtlTLS,
		Transport: b.cfg.Transport,
		Node:      transport.Register{NodeID: b.cfg.NodeID, Addr: advertise, Admin: b.cfg.Admin},
		LeaseTTL:  b.cfg.LeaseTTL,
		Logger:    b.cfg.Logger, // the member names the node itself
		Cluster:   clusterID,
		OnCluster: func(id string) error { return writeClusterID(b.cfg.DataDir, id) },
		Report:    b.replicaReport,
		// An outage, not a slow first address: connections waiting for
		// the broker to serve are refused from now until it has a map.
		JoinRoundFailed: b.gate.ctlOutage,
	})
	if err != nil {
		failed()
		if b.ctx.Err() != nil {
			return fmt.Errorf("broker %s: closed while joining the control plane: %w", b.cfg.NodeID, ErrClosed)
		}
		return fmt.Errorf("broker %s: join control plane at %s: %w", b.cfg.NodeID, b.cfg.CtlAddr, err)
	}
	b.joined.Store(member)
	if err := b.applyMap(member.Map()); err != nil {
		member.Close()
		failed()
		return err
	}
	b.checkDisk() // before the first publish

	// Close takes member to close once it has set closing; until then it
	// is Start's to close.
	b.mu.Lock()
	if b.mu.closing {
		b.mu.Unlock()
		member.Close()
		return fmt.Errorf("broker %s: closed while starting: %w", b.cfg.NodeID, ErrClosed)
	}
	b.member = member
	b.started = time.Now()
	b.replicasSettled.Store(b.cfg.ReadyReplicaWait < 0)
	b.ready.Store(true) // after member: serveConn reads it once ready
	b.wg.Add(2)
	b.mu.Unlock()
	b.log.Info("broker serving", "addr", advertise, "epoch", member.Map().Epoch)
	go b.mapLoop()
	go b.watchDisk()
	return nil
}

// Addr returns the address the broker listens on.
func (b *Broker) Addr() net.Addr { return b.ln.Addr() }

// routingMap returns the map to route a publish by.
func (b *Broker) routingMap() *shardmap.Map {
	m := b.member.Map()
	if k := b.cfg.Knobs.RouteMap; k != nil {
		return k(m)
	}
	return m
}

// Map returns the latest shard map the broker holds.
func (b *Broker) Map() *shardmap.Map { return b.member.Map() }

// Ready reports whether the broker is registered with the control plane,
// holds a map, has opened (recovered) the logs of its shards and, since
// Start, its replicas of replicated shards have caught up with their
// leaders (see "Replica health" in replicahealth.go); see
// [Broker.Readiness] for why not. Safe to call from any goroutine.
func (b *Broker) Ready() bool { return b.Readiness() == nil }

// ErrNotReady is matched by every error [Broker.Readiness] returns.
var ErrNotReady = errors.New("broker: not ready")

// Readiness returns nil when the broker is ready to serve (a readiness
// probe), or an error saying what it waits for. Safe to call from any
// goroutine.
func (b *Broker) Readiness() error {
	b.mu.Lock()
	closing := b.mu.closing // from Close's first step: it no longer accepts, and drains
	b.mu.Unlock()
	switch {
	case closing || b.ctx.Err() != nil:
		return fmt.Errorf("%w: shutting down", ErrNotReady)
	case b.joined.Load() == nil:
		return fmt.Errorf("%w: not registered with the control plane at %s", ErrNotReady, b.cfg.CtlAddr)
	case b.joined.Load().Map() == nil:
		return fmt.Errorf("%w: no shard map yet", ErrNotReady)
	case b.joined.Load().Unlinked() > b.joined.Load().LeaseTTL():
		// Its lease has run out: the control plane shows it down, and
		// no other broker forwards to it.
		return fmt.Errorf("%w: no link to the control plane for %v, longer than the lease (%v)", ErrNotReady,
			b.joined.Load().Unlinked().Round(time.Millisecond), b.joined.Load().LeaseTTL())
	case !b.ready.Load():
		return fmt.Errorf("%w: shard logs not recovered yet", ErrNotReady)
	}
	return b.replicasCaughtUp()
}

// currentMap returns the map held, or nil before Start has joined.
func (b *Broker) currentMap() *shardmap.Map {
	if m := b.joined.Load(); m != nil {
		return m.Map()
	}
	return nil
}

// NodeID returns the broker's node id.
func (b *Broker) NodeID() string { return b.cfg.NodeID }

// acceptLoop accepts connections on ln until Close, or until Start fails
// and closes ln.
func (b *Broker) acceptLoop(ln *transport.Listener) {
	defer b.wg.Done()
	for {
		conn, err := ln.Accept(b.ctx)
		if err != nil {
			if b.ctx.Err() == nil && !errors.Is(err, quic.ErrServerClosed) {
				b.log.Error("accept failed; broker stops accepting", "err", err)
			}
			return
		}
		b.wg.Add(1)
		go b.serveConn(conn)
	}
}

// mapLoop applies every map the control plane pushes: it opens logs of
// newly owned shards and closes logs of shards no longer owned.
func (b *Broker) mapLoop() {
	defer b.wg.Done()
	var applied *shardmap.Map // Start applied one; applying it again is harmless
	for {
		// Changed is taken before Map is read, so that a map arriving
		// while another is applied is applied next, not missed.
		changed := b.member.Changed()
		if m := b.member.Map(); m.NewerThan(applied) {
			if err := b.applyMap(m); err != nil {
				b.log.Error("applying shard map", "epoch", m.Epoch, "err", err)
			}
			applied = m
			continue
		}
		select {
		case <-b.ctx.Done():
			return
		case <-changed:
		}
	}
}

// applyMap makes the broker's shard logs follow m (see shardSet.apply):
// first the logs of shards no longer owned are closed and the data of
// deleted streams removed, whatever fails; then owned shards are opened
// one by one within the open-log budget, the rest on first use. A shard
// that fails to open fails only its own publishes and subscriptions (with
// an unavailable error naming it) and is retried on the next map or on a
// use a second later. Each kind of event is logged once per map, with
// counts and the first few shards, never once per shard.
func (b *Broker) applyMap(m *shardmap.Map) error {
	m, r := b.shards.apply(m)
	b.applied.Store(m)
	if mb := b.joined.Load(); mb != nil {
		mb.Report() // the replicas of m, opened
	}
	b.peers.dropDown(m)
	b.raft.noteDown(m)
	if len(r.deleted) > 0 {
		b.log.Info("streams deleted; their data removed", "epoch", m.Epoch, "streams", firstFew(r.deleted))
	}
	if len(r.deleteErr) > 0 {
		b.log.Error("closing logs or removing data of deleted streams failed", "epoch", m.Epoch,
			"failures", len(r.deleteErr), "first", r.deleteErr[0])
	}
	if len(r.refused) > 0 {
		b.log.Warn("streams refused: this broker would hold more than MaxShards shards", "epoch", m.Epoch,
			"max_shards", b.cfg.MaxShards, "streams", len(r.refused), "shards", r.refusedShards, "first", firstFew(r.refused))
	}
	if r.failed > 0 {
		ids := make([]string, len(r.failedIDs))
		for i, id := range r.failedIDs {
			ids[i] = id.String()
		}
		b.log.Error("shard logs failed to open; their publishes fail until a retry succeeds", "epoch", m.Epoch,
			"failed", r.failed, "shards", ids, "first_err", r.failedErr)
	}
	b.log.Info("shard map applied", "epoch", m.Epoch, "owned_shards", r.owned, "open_logs", r.open,
		"opened", r.opened, "closed", r.closed, "open_on_first_use", r.deferred, "failed", r.failed)
	return nil
}

// lingerForAnswers waits while the last answers of the drained
// publisher streams leave. They are in quic-go's send buffers, or in the
// receiver's, not yet read: closing a connection discards both (a
// forwarder then answered "may or may not have been written" for a record
// committed and acked here), and quic-go tells no one when a stream's
// data has been read. A forwarding peer says so itself: its lanes read
// to the end of their streams, and the last one hangs up the connection
// (peerPool.release). So the broker waits for its forwarders to hang up,
// for at most closePeerWait (one of an earlier version never does), and
// gives a client closeLinger: a client reads its answers at once.
func (b *Broker) lingerForAnswers(pubs []*pubSession) {
	linger := time.NewTimer(closeLinger)
	defer linger.Stop()
	<-linger.C
	giveUp := time.NewTimer(closePeerWait - closeLinger)
	defer giveUp.Stop()
	waited := map[*quic.Conn]bool{}
	for _, p := range pubs {
		c := p.from.conn
		if p.peerID == "" || waited[c] {
			continue
		}
		waited[c] = true
		select {
		case <-c.Context().Done():
		case <-giveUp.C:
			b.log.Warn("shutdown: a forwarding peer did not hang up; closing its connection may lose answers it has not read", "peer", p.peerID, "waited", closePeerWait)
			return
		}
	}
}

// caller is who a connection's streams act for: a forwarding peer (a
// broker, by its node certificate) or a client principal (by its client
// certificate). Exactly one of the two is set.
type caller struct {
	peerID    string     // the peer broker's node id
	principal string     // the client's principal name
	use       *connUse   // what the client connection holds (limits.go); nil for a peer
	conn      *quic.Conn // the connection the streams are on
}

// identify checks that conn's certificate may speak the ALPN it chose: a
// node certificate on the peer protocol, a client certificate on the
// client protocol. Roles are separate: a client cannot act as a peer, and
// a broker's or the control plane's certificate is no client principal.
func identify(conn *quic.Conn) (caller, error) {
	id, err := transport.PeerIdentity(conn)
	if err != nil {
		return caller{}, err
	}
	switch alpn := conn.ConnectionState().TLS.NegotiatedProtocol; {
	case alpn == transport.ALPNPeer && id.Role == transport.RoleNode:
		return caller{peerID: id.Name}, nil
	case alpn == transport.ALPNPeer:
		return caller{}, transport.Errorf(transport.CodeUnauthorized, "peer connections need a broker's node certificate, not a %s certificate (%q)", id.Role, id.Name)
	case id.Role == transport.RoleClient:
		return caller{principal: id.Name}, nil
	default:
		return caller{}, transport.Errorf(transport.CodeUnauthorized, "client connections need a client certificate, not a %s certificate (%q)", id.Role, id.Name)
	}
}

// serveConn accepts streams on one client or peer connection.
func (b *Broker) serveConn(conn *quic.Conn) {
	defer b.wg.Done()
	from, err := identify(conn)
	if err != nil {
		if b.refusals.First(err.Error()) { // once per certificate and protocol
			b.log.Warn("connection refused", "remote", conn.RemoteAddr(), "err", err)
		}
		conn.CloseWithError(quic.ApplicationErrorCode(transport.CodeUnauthorized), err.Error())
		return
	}
	from.conn = conn
	if werr := b.awaitServing(conn); werr != nil {
		// Nothing on it was read: the client (or peer) knows that
		// nothing it sent was processed.
		conn.CloseWithError(quic.ApplicationErrorCode(werr.Code), werr.Message)
		return
	}
	peerID := from.peerID
	if peerID == "" { // peers count against no client limit
		use, lerr := b.limits.admitConn(from.principal)
		if lerr != nil {
			conn.CloseWithError(quic.ApplicationErrorCode(lerr.Code), lerr.Message)
			return
		}
		defer b.limits.releaseConn(use)
		from.use = use
	}
	if !b.track(conn) {
		conn.CloseWithError(quic.ApplicationErrorCode(transport.CodeShuttingDown), "broker shutting down")
		return
	}
	defer b.untrack(conn)
	qkind := kindClient
	if peerID != "" {
		qkind = kindPeer
	}
	b.quic.watch(conn, qkind) // also felix_connections{type}
	for {
		s, err := conn.AcceptStream(b.ctx)
		if err != nil {
			return
		}
		if from.use != nil && !b.limits.admitStream(from.use, s) {
			continue
		}
		b.wg.Add(1)
		go b.serveStream(s, from)
	}
}

// startGate is what a connection accepted before the broker serves waits
// on (awaitServing): Start's end, and the control plane found out of
// reach while Start joins it.
type startGate struct {
	ended     chan struct{} // closed when Start returns
	endOnce   sync.Once
	outage    chan struct{} // closed once Join has failed a full round of ctl addresses
	outageErr error         // that round's last error; set before outage is closed
	once      sync.Once
	held      atomic.Int64 // connections awaitServing holds now
}

// end marks Start's return.
func (g *startGate) end() { g.endOnce.Do(func() { close(g.ended) }) }

// ctlOutage is Join's JoinRoundFailed: every configured ctl address failed
// in a round.
func (g *startGate) ctlOutage(err error) {
	g.once.Do(func() {
		g.outageErr = err
		close(g.outage)
	})
}

// awaitServing returns nil once the broker serves conn, accepted as it
// starts, or why it refuses it. A broker accepts from Start's listen, but
// serves only once it has joined the control plane and applied its
// first map (opened its logs): until then it cannot route, authorize or
// answer anything. A connection accepted meanwhile waits, for at most
// ForwardTimeout, and is served once Start completes: a broker restarted
// (kill -9) while the control plane is up joins within milliseconds (up
// to a ctl handshake timeout when its first ctl address is down), and
// the forwards and publishes its peers and clients send meanwhile are
// answered, not refused. Once Join has failed a full round of the ctl
// addresses (an outage), and until it has joined, a connection is
// refused unavailable at once, and those waiting are released so: the
// broker has no map for as long as the control plane is out of reach,
// and a connection left unanswered made every publish, request and
// forward to it wait out its caller's deadline. Nothing on a refused
// connection is read, so its caller knows nothing it sent was
// processed. A broker closing refuses with shutting_down.
func (b *Broker) awaitServing(conn *quic.Conn) *transport.Error {
	if b.ready.Load() {
		return nil
	}
	// Held connections count against no limit yet (admitConn comes once
	// served), and the listener's bound on handshakes no longer covers
	// them once accepted: at most MaxConns are held, the rest refused.
	if n := b.gate.held.Add(1); n > int64(b.cfg.MaxConns) {
		b.gate.held.Add(-1)
		return transport.Errorf(transport.CodeUnavailable, "%s is starting and already holds %d connections until it serves (MaxConns); nothing was read; retry shortly", b.cfg.NodeID, b.cfg.MaxConns)
	}
	defer b.gate.held.Add(-1)
	bound := time.NewTimer(b.cfg.ForwardTimeout)
	defer bound.Stop()
	outage := b.gate.outage
	for waiting := true; waiting; {
		if b.joined.Load() != nil {
			outage = nil // through to the control plane: opening its first map's logs
		}
		select {
		case <-outage:
			waiting = b.joined.Load() != nil
		case <-b.gate.ended:
			waiting = false
		case <-b.ctx.Done():
			waiting = false
		case <-conn.Context().Done():
			waiting = false
		case <-bound.C:
			waiting = false
		}
	}
	b.mu.Lock()
	closing := b.mu.closing
	b.mu.Unlock()
	switch {
	case closing || b.ctx.Err() != nil:
		return &transport.Error{Code: transport.CodeShuttingDown, Message: "broker shutting down"}
	case b.ready.Load():
		return nil
	case b.joined.Load() == nil && isClosed(b.gate.outage):
		return transport.Errorf(transport.CodeUnavailable, "no shard map: not through to the control plane since start: "+
			"%s reached none of its control plane addresses (%s; last: %v); nothing was read; "+
			"use another broker, or retry once the control plane is back", b.cfg.NodeID, strings.Join(b.cfg.ctlAddrs(), ","), b.gate.outageErr)
	case isClosed(b.gate.ended):
		return transport.Errorf(transport.CodeUnavailable, "%s failed to start; nothing was read", b.cfg.NodeID)
	}
	return transport.Errorf(transport.CodeUnavailable, "%s is still starting after %v (ForwardTimeout); nothing was read; retry shortly", b.cfg.NodeID, b.cfg.ForwardTimeout)
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (b *Broker) track(conn *quic.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.closing {
		return false
	}
	b.mu.conns[conn] = struct{}{}
	return true
}

func (b *Broker) untrack(conn *quic.Conn) {
	b.mu.Lock()
	delete(b.mu.conns, conn)
	b.mu.Unlock()
}

// serveStream reads the first frame of a stream and hands the stream to the
// path it opens.
func (b *Broker) serveStream(s *quic.Stream, from caller) {
	defer b.wg.Done()
	if from.use != nil {
		defer from.use.streams.Add(-1) // admitted by serveConn
	}
	r := transport.NewReader(s, b.cfg.Transport.MaxFrame)
	if from.peerID != "" {
		// A peer forwards records its own limit let through, which may be
		// over this broker's (a rolling change of --max-record-bytes):
		// each is skipped and refused alone, whatever its size. A skipped
		// frame holds no memory.
		r.SetMaxSkip(math.MaxInt)
	}
	handedOff := false // a subscription's credit reader releases r (serveSubscribe)
	if from.use != nil {
		r.SetHolder(frameHolder{budget: from.use.use.publish, stop: b.ctx.Done(), done: s.Context().Done()})
		defer func() {
			if !handedOff {
				r.Release()
			}
		}()
	}
	s.SetReadDeadline(time.Now().Add(b.cfg.FirstFrameTimeout))
	f, err := r.Read()
	s.SetReadDeadline(time.Time{})
	var skipped *transport.Error
	if errors.Is(err, transport.ErrSkipped) && errors.As(err, &skipped) {
		// A publish over the record limit, skipped whole: the stream is a
		// publisher's, which goes on after that record's refusal.
		f, err = (*transport.Publish)(nil), nil
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			b.limits.hit(limitFirstFrame, from.principal+from.peerID, "")
			err = &transport.Error{Code: transport.CodeTimeout,
				Message: fmt.Sprintf("no frame within %v of opening the stream (FirstFrameTimeout)", b.cfg.FirstFrameTimeout)}
		}
		b.refuse(s, err)
		return
	}
	ctx := context.Background()
	switch f := f.(type) {
	case *transport.Publish:
		b.tel.streams.Add(ctx, 1, b.tel.pubStream...)
		defer b.tel.streams.Add(ctx, -1, b.tel.pubStream...)
		b.servePublish(s, r, f, skipped, from)
	case *transport.Subscribe:
		b.tel.streams.Add(ctx, 1, b.tel.subStream...)
		defer b.tel.streams.Add(ctx, -1, b.tel.subStream...)
		handedOff = true
		b.serveSubscribe(s, r, f, from)
	case *transport.Request:
		b.tel.streams.Add(ctx, 1, b.tel.reqStream...)
		defer b.tel.streams.Add(ctx, -1, b.tel.reqStream...)
		b.serveRequest(s, f, from)
	case *transport.Raft:
		b.serveRaft(s, r, f, from)
	default:
		b.refuse(s, &transport.Error{Code: transport.CodeUnexpectedFrame,
			Message: fmt.Sprintf("a stream must start with publish, subscribe or request, not %T", f)})
	}
}

// refuse answers a stream that cannot go on with one Error frame (when err
// is not a clean end of stream) and closes it.
func (b *Broker) refuse(s *quic.Stream, err error) {
	var werr *transport.Error
	if !errors.As(err, &werr) {
		s.CancelRead(0)
		s.Close()
		return
	}
	b.tel.countError(werr.Code)
	s.SetWriteDeadline(time.Now().Add(time.Second))
	transport.NewWriter(s).Write(werr)
	s.CancelRead(quic.StreamErrorCode(werr.Code))
	s.Close()
}

// closeLinger is how long Close lets the last answers of the publisher
// streams it drained leave before it closes the connections;
// closePeerWait bounds its wait for forwarding peers to hang up (see
// lingerForAnswers).
const (
	closeLinger   = 50 * time.Millisecond
	closePeerWait = 5 * time.Second
)

// closeDrainReads bounds how long Close reads on the publisher streams of
// clients that have not ended their side, refusing what it reads
// (pubSession.drain), within the drain's bound (ForwardTimeout): a client
// told its broker is leaving ends its side at once; one that is not
// publishing, or an older SDK, never does, and Close stops reading it
// after this.
const closeDrainReads = 500 * time.Millisecond

// closeTakes bounds how long a Close takes from its hand-over of the
// leaderships until it leaves the map (resignWait, the drain, and the
// wait for peers), with room to spare: a leadership handed over by a
// closing broker is not handed back to it before then (preferOwners).
func closeTakes(cfg Config) time.Duration {
	return resignWait(cfg) + cfg.ForwardTimeout + closeLinger + closePeerWait + 10*time.Second
}

// resignWait bounds the wait at Close for the hand-over of the
// leaderships this broker holds: two election timeouts, for all groups
// at once (raft abandons a transfer that does not end within one, and the
// group tries another voter).
func resignWait(cfg Config) time.Duration {
	return 2 * time.Duration(cfg.RaftElectionTicks) * cfg.RaftTick
}

// Close shuts the broker down gracefully: it hands over the leaderships
// of its replicated shards, stops accepting, refuses new publishes
// (shutting_down, not written) until their clients end their streams or
// closeDrainReads passes, commits and acknowledges what was already received, then
// leaves the control plane, closes connections and closes every log.
// A Close while another runs waits for it and returns its error.
func (b *Broker) Close() error {
	b.mu.Lock()
	if b.mu.closing {
		b.mu.Unlock()
		<-b.closed
		return b.closeErr
	}
	b.mu.closing = true
	// Set by a Start that has finished; a Start still running closes its
	// own when it sees closing, and Close waits for it (wg).
	ln, member := b.ln, b.member
	pubs := make([]*pubSession, 0, len(b.mu.pubs))
	for p := range b.mu.pubs {
		pubs = append(pubs, p)
	}
	b.mu.Unlock()

	// Hand over the leadership of every replicated shard this broker
	// leads first, while it still takes publishes: the records proposed
	// before the hand-over are committed by the new leader (acked here),
	// those that arrive during it are routed to the new leader. A group
	// whose transfer does not end in time is closed below as before, and
	// its followers elect a leader once it falls silent.
	if n := b.raft.resign(resignWait(b.cfg)); n > 0 {
		b.log.Warn("shutdown: still leading replicated shards after handing them over; their followers elect a leader once this broker is gone", "shards", n)
	}
	if ln != nil {
		ln.StopAccepting()
	}
	// Drain the publisher sessions: each finishes what it took in (local
	// appends are committed and acked, forwards answered or failed) and
	// refuses what it reads from now on, until its client ends its side
	// or, after closeDrainReads, it stops reading (pubSession.drain).
	for _, p := range pubs {
		p.drain()
	}
	drained := make(chan struct{})
	go func() {
		for _, p := range pubs {
			p.waitIdle()
		}
		close(drained)
	}()
	drainBound := time.NewTimer(b.cfg.ForwardTimeout)
	defer drainBound.Stop()
	select {
	case <-drained:
	case <-time.After(min(closeDrainReads, b.cfg.ForwardTimeout)):
		for _, p := range pubs {
			p.stopReading()
		}
		select {
		case <-drained:
		case <-drainBound.C:
			b.log.Warn("shutdown: gave up waiting for in-flight publishes; records a raft group has not committed fail with an unknown outcome", "sessions", len(pubs))
			b.shards.stopGroups() // so that no session waits on a group that cannot commit
		}
	}

	if len(pubs) > 0 {
		b.lingerForAnswers(pubs)
	}
	b.ready.Store(false)
	b.cancel()
	var errs []error
	// Leave the control plane before closing the connections: the map
	// then marks this broker down, so peers route around it (and give up
	// their dials to it, dropDown) instead of redialing a broker the map
	// still shows live. Everything taken in is answered by now, and the
	// groups (followers since resign) stay open until the end.
	if member != nil {
		errs = append(errs, member.Close())
	}
	// Closed with b.mu released: CloseWithError waits for each
	// connection's loop to end, and the sessions ending meanwhile take
	// b.mu to leave its sets.
	b.mu.Lock()
	conns := slices.Collect(maps.Keys(b.mu.conns))
	b.mu.Unlock()
	for _, c := range conns {
		c.CloseWithError(quic.ApplicationErrorCode(transport.CodeShuttingDown), "broker shutting down")
	}
	b.peers.close()
	if ln != nil {
		ln.Close()
	}
	b.wg.Wait()
	<-drained // every session has returned, so this is immediate
	b.raft.close()
	errs = append(errs, b.shards.close())
	b.tel.close()
	errs = append(errs, b.lock.Release())
	b.log.Info("broker stopped")
	b.closeErr = errors.Join(errs...)
	close(b.closed)
	return b.closeErr
}
