package ctl

import (
	"context"
	"errors"
	"io"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// Stream error codes ctl uses when it abandons a stream.
const (
	streamCodeDone     quic.StreamErrorCode = 0 // nothing more to read
	streamCodeReplaced quic.StreamErrorCode = 1 // a newer registration of the node replaced this one
)

// The codes with which a member (ctlclient) ends a registration it leaves
// for another ctl, because this one did not answer in time: the
// registration stream's reset and the connection's close. Like this
// ctl's own hand-over, the broker's lease is left to the ctl it
// registers with next (see memberHandedOver). Wire values, as ctlclient
// sends them: never renumber.
const (
	streamCodeHandOver quic.StreamErrorCode      = 2
	connCodeHandOver   quic.ApplicationErrorCode = 3
)

// memberHandedOver reports whether err, which ended a registration
// stream's reads, is the member leaving for another ctl (see
// streamCodeHandOver), not a broker gone.
func memberHandedOver(err error) bool {
	var se *quic.StreamError
	if errors.As(err, &se) && se.Remote && se.ErrorCode == streamCodeHandOver {
		return true
	}
	var ae *quic.ApplicationError
	return errors.As(err, &ae) && ae.Remote && ae.ErrorCode == connCodeHandOver
}

// session is one registration stream of one broker. Its reader runs in the
// goroutine serving the stream; its writer goroutine is the only one that
// writes to the stream, sending the latest map whenever push signals it.
type session struct {
	id   uint64
	node string
	str  *quic.Stream
	// ctx is the context of the session's etcd requests, canceled by
	// close: a registration that ended renews nothing after.
	ctx    context.Context
	cancel context.CancelFunc
	// handedOver is whether the session was closed because this ctl
	// cannot reach etcd (handOver): the broker registers with another
	// ctl and adopts its lease there, so this one leaves the key alone.
	handedOver atomic.Bool

	latest     atomic.Pointer[shardmap.Map] // newest map to send
	notify     chan struct{}                // capacity 1: latest changed
	stop       chan struct{}                // closed by close
	stopOnce   sync.Once
	failure    atomic.Pointer[transport.Error] // sent to the broker before the stream closes
	writerDone chan struct{}

	// acks is whether the broker takes answers to its heartbeats
	// (transport.FeatureHeartbeatAcks); ack asks the writer for one
	// (capacity 1: one answer for all the heartbeats read meanwhile).
	acks bool
	ack  chan struct{}
	// mapGet is whether the broker's own map.get on the connection of
	// the registration is answered (transport.FeatureMemberMapGet; see
	// Server.mapGetConns).
	mapGet bool
}

func newSession(ctx context.Context, reg *transport.Register, str *quic.Stream) *session {
	ss := &session{node: reg.NodeID, str: str, notify: make(chan struct{}, 1), stop: make(chan struct{}), writerDone: make(chan struct{}),
		acks: slices.Contains(reg.Features, transport.FeatureHeartbeatAcks), ack: make(chan struct{}, 1),
		mapGet: slices.Contains(reg.Features, transport.FeatureMemberMapGet)}
	ss.ctx, ss.cancel = context.WithCancel(ctx)
	return ss
}

// push hands m to the session's writer. It never blocks: a writer behind
// on a slow stream skips straight to the newest map.
func (ss *session) push(m *shardmap.Map) {
	ss.latest.Store(m)
	select {
	case ss.notify <- struct{}{}:
	default:
	}
}

// answer has the writer answer the heartbeats read, if the broker takes
// answers. It never blocks.
func (ss *session) answer() {
	if !ss.acks {
		return
	}
	select {
	case ss.ack <- struct{}{}:
	default:
	}
}

// close stops the writer, which sends failure (if set) and closes the
// send side.
func (ss *session) close(failure *transport.Error) {
	ss.stopOnce.Do(func() {
		if failure != nil {
			ss.failure.Store(failure)
		}
		ss.cancel()
		close(ss.stop)
	})
}

// handOver closes the session because this ctl cannot renew its lease in
// etcd: the writer sends failure (CodeUnavailable), on which the broker
// moves to the next ctl, and the reader stops. Unlike other ends, the
// live/ key is left as it is (see serveRegistration).
func (ss *session) handOver(failure *transport.Error) {
	ss.handedOver.Store(true)
	ss.close(failure)
	ss.str.CancelRead(streamCodeDone)
}

// serveRegistration runs one broker's registration stream: it checks the
// broker's identity, takes its liveness lease in etcd (live/<node>),
// starts the writer that pushes maps, and renews the lease on every
// heartbeat until the stream ends, when the lease key is deleted (unless
// a newer registration took it over, or the registration was handed
// over, by this ctl or by the member leaving it for another, or this ctl
// is closing: then the broker re-registers elsewhere and adopts the
// lease before it runs out).
func (s *Server) serveRegistration(conn *quic.Conn, str *quic.Stream, r *transport.Reader, w *transport.Writer, reg *transport.Register) {
	certID, err := transport.PeerNodeID(conn)
	if err != nil {
		s.log.Warn("registration refused: not a node certificate", "node", reg.NodeID, "remote", conn.RemoteAddr().String(), "err", err)
		s.refuse(str, w, transport.Errorf(transport.CodeUnauthorized, "registration needs a node certificate: %v", err))
		return
	}
	if certID != reg.NodeID {
		s.log.Warn("registration refused: node id differs from certificate", "node", reg.NodeID, "cert_node", certID)
		s.refuse(str, w, transport.Errorf(transport.CodeUnauthorized, "registration as node %q with the certificate of node %q", reg.NodeID, certID))
		return
	}
	node := shardmap.Node{ID: reg.NodeID, Addr: reg.Addr, Admin: reg.Admin, Features: featureSet(reg.Features)}
	if node.ID == "" || node.Addr == "" {
		s.refuse(str, w, transport.Errorf(transport.CodeInvalid, "registration needs a node id and an address (got id %q, addr %q)", node.ID, node.Addr))
		return
	}
	if err := checkRegister(reg); err != nil {
		s.log.Warn("registration refused", "node", reg.NodeID, "err", err)
		s.refuse(str, w, err)
		return
	}
	if c := s.Map().Cluster; reg.Cluster != "" && c != "" && reg.Cluster != c {
		s.log.Warn("registration refused: the broker belongs to another cluster", "node", reg.NodeID, "its_cluster", reg.Cluster, "cluster", c)
		s.refuse(str, w, transport.Errorf(transport.CodeInvalid, "%s belongs to another cluster, %s, with its data, and this control plane serves cluster %s: a broker never joins another cluster; point it at its own control plane, or empty its data directory to make it a new member of this cluster",
			reg.NodeID, reg.Cluster, c))
		return
	}
	if err := s.cutOffErr(); err != nil {
		// Its lease could not be put: let the broker try the next ctl
		// now rather than after etcd's timeout.
		s.refuse(str, w, transport.Errorf(transport.CodeUnavailable, "ctl cannot record the registration of %s: %v", node.ID, err))
		return
	}
	ss := newSession(s.ctx, reg, str)

	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		s.refuse(str, w, transport.Errorf(transport.CodeShuttingDown, "ctl is closing"))
		return
	}
	s.mu.nextSession++
	ss.id = s.mu.nextSession
	s.mu.Unlock()

	token := s.regToken + "-" + strconv.FormatUint(ss.id, 10)
	lease, err := s.acquireLive(s.ctx, node, token, nil)
	if err != nil {
		s.log.Warn("registration refused: etcd unreachable", "node", node.ID, "err", err)
		s.refuse(str, w, transport.Errorf(transport.CodeUnavailable, "ctl cannot record the registration of %s in etcd: %v", node.ID, err))
		return
	}

	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		s.refuse(str, w, transport.Errorf(transport.CodeShuttingDown, "ctl is closing"))
		return
	}
	old := s.mu.sessions[node.ID]
	s.mu.sessions[node.ID] = ss
	if ss.mapGet {
		s.mapGetConns.Store(conn, ss)
	}
	joined := s.applyRegisterLocked(node, lease.session)
	// The current map first: the last one committed and pushed (on the
	// leader, with the node live once that is committed; publishLocked
	// pushed it to ss already). Never the state's own map, which holds
	// a change etcd may not have committed.
	ss.push(s.Map())
	epoch := s.Map().Epoch
	s.mu.Unlock()

	if old != nil {
		// Said to the broker, which re-registers only after its longest
		// backoff: two processes running as one node would otherwise
		// replace each other's registration in a loop.
		old.close(transport.Errorf(transport.CodeReplaced, "the registration of %s was replaced by a newer one from %s: is another process running as %s?",
			node.ID, conn.RemoteAddr(), node.ID))
		old.str.CancelRead(streamCodeReplaced)
		s.log.Warn("registration replaced by a newer one", "node", node.ID, "remote", conn.RemoteAddr().String())
	}
	s.log.Info("node registered", "node", node.ID, "addr", node.Addr, "admin", node.Admin, "new_member", joined, "epoch", epoch, "lease", int64(lease.lease))

	s.wg.Add(1)
	go s.writeMaps(ss, w)
	reason := s.readHeartbeats(ss, node, token, &lease, r)

	s.mu.Lock()
	if s.mu.sessions[node.ID] == ss {
		delete(s.mu.sessions, node.ID)
	}
	s.mapGetConns.CompareAndDelete(conn, ss)
	closing := s.mu.closed || s.ctx.Err() != nil // Close cancels before it locks
	s.mu.Unlock()
	// While ctl closes, every registration ends; the brokers register
	// with another ctl (or this one restarted) and adopt their leases.
	// So does a registration handed over because etcd is out of reach
	// (a delete could only land once it is back, after the broker took
	// its lease elsewhere, or just before), and one the member left for
	// another ctl because this one did not answer it in time (answers
	// delayed, or this ctl stuck): the broker did not go, and deleting
	// its key would show it down, then live again.
	handedOver := ss.handedOver.Load() || memberHandedOver(reason)
	if !closing && !handedOver && s.releaseLive(lease) {
		s.mu.Lock()
		if s.mu.leader && !s.mu.closed && s.mu.st.end(node.ID, lease.session) {
			s.commitLocked("node down " + node.ID)
		}
		s.mu.Unlock()
	}

	var failure *transport.Error
	if errors.As(reason, &failure) && s.ctx.Err() == nil {
		s.log.Warn("registration stream failed", "node", node.ID, "err", reason)
	} else {
		failure = nil
	}
	ss.close(failure)
	str.CancelRead(streamCodeDone)
	<-ss.writerDone
	if !closing {
		s.log.Info("registration ended", "node", node.ID, "handed_over", handedOver, "reason", reason)
	}
}

// Bounds of what a registration puts in etcd and in every map: a host
// name (253 bytes) and a port, and feature names as transport's are.
const (
	maxRegisterAddr     = 300
	maxRegisterFeatures = 64
)

// checkRegister refuses a registration whose address, admin address or
// features exceed what any broker sends: each is kept in etcd and in
// every map pushed to every broker, whose size admin changes are held
// to (checkMapSize) with only a small margin for members.
func checkRegister(reg *transport.Register) *transport.Error {
	switch {
	case len(reg.Addr) > maxRegisterAddr || len(reg.Admin) > maxRegisterAddr:
		return transport.Errorf(transport.CodeInvalid, "registration of %s: address of %d bytes, admin address of %d: want at most %d", reg.NodeID, len(reg.Addr), len(reg.Admin), maxRegisterAddr)
	case len(reg.Features) > maxRegisterFeatures:
		return transport.Errorf(transport.CodeInvalid, "registration of %s: %d features, want at most %d", reg.NodeID, len(reg.Features), maxRegisterFeatures)
	}
	for _, f := range reg.Features {
		if len(f) > transport.MaxIDLen {
			return transport.Errorf(transport.CodeInvalid, "registration of %s: feature name of %d bytes, want at most %d", reg.NodeID, len(f), transport.MaxIDLen)
		}
	}
	return nil
}

// checkReport refuses a replica report naming a shard no stream can
// have: it is kept in etcd (the broker's live/ key).
func checkReport(node string, r *transport.ReplicaReport) *transport.Error {
	if r == nil {
		return nil
	}
	for _, id := range r.Unready {
		if err := shardmap.ValidateStreamName(id.Stream); err != nil || id.Shard < 0 {
			return transport.Errorf(transport.CodeInvalid, "replica report of %s names shard %.80q/%d, which no stream has", node, id.Stream, id.Shard)
		}
	}
	return nil
}

// applyRegisterLocked applies a registration to the state at once when
// this ctl is the leader (the watch of live/ would, a moment later), so
// the broker's first map has it live. It reports whether the node is a
// new member. s.mu is held.
func (s *Server) applyRegisterLocked(n shardmap.Node, session uint64) (joined bool) {
	if !s.mu.leader {
		return false
	}
	changed, joined, err := s.mu.st.register(n, session)
	if err == nil && changed {
		s.commitLocked("node registered " + n.ID)
	}
	return joined
}

// readHeartbeats renews the registration's lease on every heartbeat, and
// puts a replica report that changed in its live/ key, until the stream
// fails or the broker sends something else, and returns why it stopped.
// A returned *transport.Error is one to tell the broker. A lease that
// cannot be renewed, or a report that cannot be put (etcd slow or
// unreachable), is retried at the next heartbeat: the broker is not told,
// it keeps its map and its data path. But once the lease has gone
// unrenewed for renewGrace, half the lease etcd holds, the registration
// is handed over: the broker is told CodeUnavailable and moves to the
// next ctl, which adopts its lease before it runs out. A ctl cut off
// from etcd's quorum (partitioned from the other ctls, brokers still
// reaching it) would otherwise hold its brokers until their leases
// expired, marked down by the leader for as long as the partition
// lasted while another ctl could have renewed them.
func (s *Server) readHeartbeats(ss *session, node shardmap.Node, token string, lease **liveLease, r *transport.Reader) error {
	var reported *transport.ReplicaReport // the report in the live/ key
	grace := s.renewGrace()
	renewed := time.Now() // when the last renewal that succeeded was sent (at first: the put, just done)
	// A broker heartbeats every LeaseTTL/3, and at once when its report
	// changes: heartbeats closer than minGap to the last renewal tried
	// are answered but do no etcd work, unless their report changed and
	// the report budget allows (a few in a row, as a move's replica
	// joins, catches up and votes, then one per minGap; a report held
	// back goes with the next heartbeat), so that a flood of them is not
	// a flood of etcd writes.
	minGap := s.cfg.LeaseTTL / 10
	reports := rate.NewLimiter(rate.Every(minGap), reportBurst)
	var tried time.Time
	for {
		f, err := r.Read()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return io.EOF
			}
			return err
		}
		hb, ok := f.(*transport.Heartbeat)
		if !ok {
			return transport.Errorf(transport.CodeUnexpectedFrame, "registration stream of node %q carries heartbeats only, not %v", ss.node, f.Type())
		}
		if hb.NodeID != "" && hb.NodeID != ss.node {
			return transport.Errorf(transport.CodeInvalid, "heartbeat for node %q on the registration of node %q", hb.NodeID, ss.node)
		}
		if err := checkReport(ss.node, hb.Replicas); err != nil {
			return err
		}
		if !s.currentSession(ss) {
			continue
		}
		// Answered before the renewal: the answer says this ctl holds the
		// registration and reads its heartbeats (a ctl whose goroutines
		// are stuck answers none, and the broker moves on after half a
		// lease); a renewal that etcd does not take is handed over below.
		ss.answer()
		changed := hb.Replicas != nil && !hb.Replicas.Equal(reported)
		if soon := !tried.IsZero() && time.Since(tried) < minGap; soon && (!changed || !reports.Allow()) {
			continue
		}
		tried = time.Now()
		// No renewal waits past the grace: etcd's timeout is longer
		// than the lease.
		start := time.Now()
		ctx, cancel := context.WithDeadline(ss.ctx, renewed.Add(grace))
		l, err := s.renewLive(ctx, node, token, reported, *lease)
		cancel()
		if err != nil {
			if ss.ctx.Err() != nil {
				continue // ended meanwhile; the next read says why
			}
			if since := time.Since(renewed); since >= grace {
				failure := transport.Errorf(transport.CodeUnavailable, "ctl could not renew the lease of %s in etcd for %v (the lease is %v): register with another ctl: %v",
					ss.node, since.Round(time.Millisecond), s.liveLeaseTTL(), err)
				s.log.Warn("broker lease not renewed for half its time; handing the registration over to another ctl", "node", ss.node, "since", since, "err", err)
				ss.handOver(failure)
				return failure
			}
			s.log.Warn("broker lease not renewed; retrying at the next heartbeat", "node", ss.node, "err", err)
			continue
		}
		*lease, renewed = l, start
		if hb.Replicas == nil || hb.Replicas.Equal(reported) {
			continue
		}
		if l, err = s.reportLive(ss.ctx, node, token, hb.Replicas, l); err != nil {
			s.log.Warn("broker's replica report not recorded; retrying at the next heartbeat", "node", ss.node, "err", err)
			continue
		}
		*lease, reported = l, hb.Replicas
	}
}

// reportBurst is how many changed replica reports of one broker ctl
// writes in a row, closer than a tenth of a lease apart.
const reportBurst = 8

// currentSession reports whether ss is its node's current registration
// on this ctl.
func (s *Server) currentSession(ss *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.sessions[ss.node] == ss
}

// encodedMap is a map's MapUpdate frame, encoded by the first writer that
// sends it and then shared by the others: encoding is proportional to the
// map (about 21 ms for a 3.8 MiB map here), and every broker is sent the
// same frame.
type encodedMap struct {
	m     *shardmap.Map
	once  sync.Once
	frame []byte
	err   error
}

// mapFrameOf returns m's MapUpdate frame, with this ctl's features and
// broker lease (which the broker follows: see
// ctlclient.MemberConfig.LeaseTTL), encoded once for all the writers
// that send m. The cache holds the newest map only: a
// writer still behind with an older map encodes it for itself.
func (s *Server) mapFrameOf(m *shardmap.Map) ([]byte, error) {
	e := s.mapFrame.Load()
	for e == nil || e.m != m {
		if e != nil && e.m.Epoch > m.Epoch {
			e = &encodedMap{m: m}
			break
		}
		n := &encodedMap{m: m}
		if s.mapFrame.CompareAndSwap(e, n) {
			e = n
			break
		}
		e = s.mapFrame.Load()
	}
	e.once.Do(func() {
		e.frame, e.err = transport.AppendFrame(nil, &transport.MapUpdate{Map: m, Features: transport.Features(), LeaseTTL: s.cfg.LeaseTTL})
	})
	return e.frame, e.err
}

// writeMaps sends the newest map pushed to ss whenever it changes, with
// this ctl's features, and answers heartbeats when the reader asks, until
// the session stops; then it sends the session's failure, if any, and
// closes the send side.
func (s *Server) writeMaps(ss *session, w *transport.Writer) {
	defer s.wg.Done()
	defer close(ss.writerDone)
	var sent uint64
	for {
		select {
		case <-ss.notify:
			m := ss.latest.Load()
			if m == nil || (sent != 0 && m.Epoch <= sent) {
				continue
			}
			frame, err := s.mapFrameOf(m)
			if err == nil {
				err = w.WriteEncoded(frame)
			}
			if err != nil {
				s.mapNotSent(ss.node, m, err)
				// The reader sees the stream fail too; make sure it does.
				ss.str.CancelRead(streamCodeDone)
				return
			}
			sent = m.Epoch
		case <-ss.ack:
			if err := w.Write(&transport.Heartbeat{NodeID: ss.node, Epoch: sent}); err != nil {
				ss.str.CancelRead(streamCodeDone)
				return
			}
		case <-ss.stop:
			if f := ss.failure.Load(); f != nil {
				_ = w.Write(f)
			}
			ss.str.Close()
			return
		case <-s.ctx.Done():
			ss.str.CancelWrite(streamCodeDone)
			return
		}
	}
}
