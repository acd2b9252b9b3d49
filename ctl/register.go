package ctl

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// Stream error codes ctl uses when it abandons a stream.
const (
	streamCodeDone     quic.StreamErrorCode = 0 // nothing more to read
	streamCodeReplaced quic.StreamErrorCode = 1 // a newer registration of the node replaced this one
)

// session is one registration stream of one broker. Its reader runs in the
// goroutine serving the stream; its writer goroutine is the only one that
// writes to the stream, sending the latest map whenever push signals it.
type session struct {
	id   uint64
	node string
	str  *quic.Stream

	latest     atomic.Pointer[shardmap.Map] // newest map to send
	notify     chan struct{}                // capacity 1: latest changed
	stop       chan struct{}                // closed by close
	stopOnce   sync.Once
	failure    atomic.Pointer[transport.Error] // sent to the broker before the stream closes
	writerDone chan struct{}
}

func newSession(node string, str *quic.Stream) *session {
	return &session{node: node, str: str, notify: make(chan struct{}, 1), stop: make(chan struct{}), writerDone: make(chan struct{})}
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

// close stops the writer, which sends failure (if set) and closes the
// send side.
func (ss *session) close(failure *transport.Error) {
	ss.stopOnce.Do(func() {
		if failure != nil {
			ss.failure.Store(failure)
		}
		close(ss.stop)
	})
}

// serveRegistration runs one broker's registration stream: it checks the
// broker's identity, registers it, starts the writer that pushes maps, and
// reads heartbeats until the stream ends, when the node is marked down
// (unless a newer registration replaced this one).
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
	ss := newSession(reg.NodeID, str)
	node := shardmap.Node{ID: reg.NodeID, Addr: reg.Addr, Admin: reg.Admin}

	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		s.refuse(str, w, transport.Errorf(transport.CodeShuttingDown, "ctl is closing"))
		return
	}
	s.mu.nextSession++
	ss.id = s.mu.nextSession
	changed, joined, err := s.mu.st.register(node, ss.id, s.cfg.now())
	if err != nil {
		s.mu.Unlock()
		s.refuse(str, w, wireError(err))
		return
	}
	old := s.mu.sessions[node.ID]
	s.mu.sessions[node.ID] = ss
	ss.push(s.mu.st.Map()) // the current map first, changed or not
	if changed {
		s.commitLocked("node registered " + node.ID)
	}
	epoch := s.mu.st.Map().Epoch
	s.mu.Unlock()
	s.wakeLeases()

	if old != nil {
		old.close(nil)
		old.str.CancelRead(streamCodeReplaced)
		s.log.Warn("registration replaced by a newer one", "node", node.ID, "remote", conn.RemoteAddr().String())
	}
	s.log.Info("node registered", "node", node.ID, "addr", node.Addr, "admin", node.Admin, "new_member", joined, "epoch", epoch)

	s.wg.Add(1)
	go s.writeMaps(ss, w)
	reason := s.readHeartbeats(ss, r)

	s.mu.Lock()
	if s.mu.sessions[node.ID] == ss {
		delete(s.mu.sessions, node.ID)
	}
	// While ctl closes, every registration ends; the next start marks
	// everyone down anyway, so record nothing.
	down := !s.mu.closed && s.mu.st.end(node.ID, ss.id)
	if down {
		s.commitLocked("node down " + node.ID)
	}
	s.mu.Unlock()

	var failure *transport.Error
	if errors.As(reason, &failure) && s.ctx.Err() == nil {
		s.log.Warn("registration stream failed", "node", node.ID, "err", reason)
	} else {
		failure = nil
	}
	ss.close(failure)
	str.CancelRead(streamCodeDone)
	<-ss.writerDone
	if down {
		s.log.Info("node down: registration ended", "node", node.ID, "reason", reason)
	}
}

// readHeartbeats renews the session's lease on every heartbeat until the
// stream fails or the broker sends something else, and returns why it
// stopped. A returned *transport.Error is one to tell the broker.
func (s *Server) readHeartbeats(ss *session, r *transport.Reader) error {
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
		s.mu.Lock()
		changed, err := s.mu.st.heartbeat(ss.node, ss.id, s.cfg.now())
		if changed {
			s.commitLocked("node live again " + ss.node)
		}
		s.mu.Unlock()
		if err != nil {
			return err
		}
		if changed {
			s.log.Info("node live again: heartbeat after its lease expired", "node", ss.node)
			s.wakeLeases()
		}
	}
}

// writeMaps sends the newest map pushed to ss whenever it changes, until
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
			if err := w.Write(&transport.MapUpdate{Map: m}); err != nil {
				// The reader sees the stream fail too; make sure it does.
				ss.str.CancelRead(streamCodeDone)
				return
			}
			sent = m.Epoch
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
