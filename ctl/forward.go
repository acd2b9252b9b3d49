package ctl

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/felix-broker/felix/ctl/ctlclient"
	"github.com/felix-broker/felix/transport"
)

// forwarder holds the connection a follower forwards changes to the
// leader on, redialed when the leader changes.
type forwarder struct {
	mu     sync.Mutex // guards the cached connection; never held across a dial
	addr   string
	conn   *quic.Conn
	closed bool
}

// forwardTimeout bounds a forwarded change, including the wait for a
// leader while one is being elected.
const forwardTimeout = 10 * time.Second

// forward sends req to the leader and returns its answer once this ctl
// holds the map the answer was made at, so a read on this ctl right after
// sees the change. While no leader is elected it waits (up to
// forwardTimeout); if this ctl becomes the leader meanwhile, the request
// is handled here.
func (s *Server) forward(req *transport.Request) (*transport.Response, error) {
	ctx, cancel := context.WithTimeout(s.ctx, forwardTimeout)
	defer cancel()
	fwd := *req
	if fwd.Principal == ctlPrincipal {
		fwd.Principal = ""
	}
	if fwd.ID == "" {
		// Every attempt below sends the same ID: a leader that made the
		// change and stopped before it answered, or whose answer the
		// connection lost, leaves it recorded for the next one, which
		// answers the retry as done instead of making it twice or
		// refusing it (a stream that "exists").
		fwd.ID = newRequestID()
	}
	var last error
	for {
		if s.IsLeader() {
			own := *req
			own.ID = fwd.ID
			return s.handle(own.Principal, &own)
		}
		info, ok := s.leaderInfo(ctx)
		// A key at this ctl's own address is an earlier run's of this
		// ctl (killed, its session lease not yet run out): forwarding
		// to it would forward to this ctl, and so on, until it times out.
		if ok && info.ID != s.regToken && info.Addr != s.advertise() {
			resp, err := s.forwardTo(ctx, info.Addr, &fwd)
			var we *transport.Error
			if err == nil || (errors.As(err, &we) && we.Code != transport.CodeUnavailable && we.Code != transport.CodeShuttingDown) {
				if err == nil && resp.Map != nil {
					s.awaitEpoch(ctx, resp.Map.Epoch)
				}
				if we != nil {
					return nil, localError(we)
				}
				return resp, err
			}
			last = err
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			if last == nil {
				last = errors.New("no ctl leader elected")
			}
			return nil, transport.Errorf(transport.CodeUnavailable, "%s: the control plane has no reachable leader (is a majority of its etcd members up?): %v", req.Op, last)
		}
	}
}

// localError returns the leader's refusal we as this ctl's own would be:
// the same wire error, matching the core's sentinel of its code too
// (ErrStreamExists, ErrUnknownStream, ErrTooFewMembers, ErrLimitExceeded,
// ErrInvalid; ErrUnknownGrant, which goes as CodeInvalid, by its text), as
// the Server methods say their errors do on a follower as on the leader.
func localError(we *transport.Error) error {
	var sentinel error
	switch we.Code {
	case transport.CodeStreamExists:
		sentinel = ErrStreamExists
	case transport.CodeUnknownStream:
		sentinel = ErrUnknownStream
	case transport.CodeReplicationFactor:
		sentinel = ErrTooFewMembers
	case transport.CodeLimitExceeded:
		sentinel = ErrLimitExceeded
	case transport.CodeInvalid:
		sentinel = ErrInvalid
		if strings.Contains(we.Message, ErrUnknownGrant.Error()) {
			sentinel = ErrUnknownGrant
		}
	default:
		return we
	}
	out := transport.Errorf(we.Code, "%w", remoteCause{msg: we.Message, sentinel: sentinel})
	out.Seq, out.Epoch, out.Owner, out.From, out.To = we.Seq, we.Epoch, we.Owner, we.From, we.To
	return out
}

// remoteCause is a leader's error message, matching sentinel.
type remoteCause struct {
	msg      string
	sentinel error
}

func (r remoteCause) Error() string { return r.msg }
func (r remoteCause) Unwrap() error { return r.sentinel }

// newRequestID returns a random request ID (transport.Request.ID).
func newRequestID() string {
	return rand.Text()
}

// forwardTo makes one request to the ctl at addr.
func (s *Server) forwardTo(ctx context.Context, addr string, req *transport.Request) (*transport.Response, error) {
	conn, err := s.fwd.dial(ctx, addr, s.peerTLS(), s.cfg.Transport)
	if err != nil {
		return nil, err
	}
	resp, err := ctlclient.Request(ctx, conn, req)
	var we *transport.Error
	if err != nil && !errors.As(err, &we) {
		s.fwd.drop(conn)
	}
	return resp, err
}

func (f *forwarder) dial(ctx context.Context, addr string, tlsConf *tls.Config, cfg transport.Config) (*quic.Conn, error) {
	if conn := f.cached(addr); conn != nil {
		return conn, nil
	}
	// Dialed without the lock: a handshake with a leader that does not
	// answer must not hold up the requests that find a connection, nor
	// close.
	conn, err := transport.Dial(ctx, addr, transport.VerifyPeer(tlsConf, transport.RoleCtl, ""), cfg)
	if err != nil {
		return nil, fmt.Errorf("dial the ctl leader at %s: %w", addr, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.closed:
		conn.CloseWithError(0, "")
		return nil, transport.Errorf(transport.CodeShuttingDown, "ctl is closing")
	case f.usableLocked(addr) != nil:
		conn.CloseWithError(0, "") // another request dialed it meanwhile
		return f.conn, nil
	case f.conn != nil:
		f.conn.CloseWithError(0, "")
	}
	f.conn, f.addr = conn, addr
	return conn, nil
}

// cached returns the connection to addr, if one is open.
func (f *forwarder) cached(addr string) *quic.Conn {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.usableLocked(addr)
}

// usableLocked is cached with f.mu held.
func (f *forwarder) usableLocked(addr string) *quic.Conn {
	if f.conn != nil && f.addr == addr && f.conn.Context().Err() == nil {
		return f.conn
	}
	return nil
}

func (f *forwarder) drop(conn *quic.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn == conn {
		f.conn.CloseWithError(0, "")
		f.conn = nil
	}
}

func (f *forwarder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if f.conn != nil {
		f.conn.CloseWithError(0, "")
		f.conn = nil
	}
}

// peerTLS is the client TLS config to reach other ctls with.
func (s *Server) peerTLS() *tls.Config {
	if s.cfg.PeerTLS != nil {
		return s.cfg.PeerTLS
	}
	if s.cfg.TLS == nil || len(s.cfg.TLS.Certificates) == 0 {
		return &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{transport.ALPNCtl}}
	}
	return transport.ClientTLS(s.cfg.TLS.ClientCAs, &s.cfg.TLS.Certificates[0], "", transport.ALPNCtl)
}

// awaitEpoch waits until this ctl's map reaches epoch, or ctx ends.
func (s *Server) awaitEpoch(ctx context.Context, epoch uint64) {
	for s.Map().Epoch < epoch && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
}

// ctlMembers lists the control plane's members for cluster.status: every
// ctl with a live election session, its role, and the health of its
// embedded etcd member; and, with embedded etcd, every etcd member no
// live ctl runs, role "down" (a ctl stopped or cut off: the control plane
// is a failure closer to losing its quorum). The members' etcds are asked
// at once, each for at most probeTimeout, so that a member that does not
// answer (killed, or cut off) delays the answer by that much only.
func (s *Server) ctlMembers() []transport.CtlMember {
	ctx, cancel := context.WithTimeout(s.ctx, s.store.timeout)
	defer cancel()
	resp, err := s.store.cli.Get(ctx, s.store.ctlPrefix(), clientv3.WithPrefix())
	if err != nil {
		return []transport.CtlMember{{Name: s.name(), Addr: s.advertise(), Role: s.role(), EtcdError: err.Error()}}
	}
	leader, _ := s.leaderInfo(ctx)
	var out []transport.CtlMember
	var endpoints []string       // out[i]'s etcd client URL, to ask
	running := map[string]bool{} // the client URLs of the live ctls' etcd members
	for _, kv := range resp.Kvs {
		var info ctlInfo
		if json.Unmarshal(kv.Value, &info) != nil {
			continue
		}
		m := transport.CtlMember{Name: info.Name, Addr: info.Addr, Role: "follower", Etcd: info.Etcd}
		if info.ID == leader.ID {
			m.Role = "leader"
		}
		endpoint := info.Etcd
		if endpoint == "" && len(s.cfg.Etcd.Endpoints) > 0 {
			endpoint = s.cfg.Etcd.Endpoints[0]
		}
		running[info.Etcd] = info.Etcd != ""
		out, endpoints = append(out, m), append(endpoints, endpoint)
	}
	if len(s.cfg.Etcd.Endpoints) == 0 { // embedded: each etcd member is a ctl's
		if ml, err := s.store.cli.MemberList(ctx); err == nil {
			for _, em := range ml.Members {
				if len(em.ClientURLs) == 0 || slices.ContainsFunc(em.ClientURLs, func(u string) bool { return running[u] }) {
					continue // a member still joining, or a live ctl's
				}
				out = append(out, transport.CtlMember{Name: em.Name, Role: "down", Etcd: em.ClientURLs[0]})
				endpoints = append(endpoints, em.ClientURLs[0])
			}
		}
	}
	var wg sync.WaitGroup
	for i := range out {
		if endpoints[i] != "" {
			wg.Go(func() { s.probeEtcd(ctx, &out[i], endpoints[i]) })
		}
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// probeTimeout bounds how long cluster.status waits for one etcd member's
// status.
const probeTimeout = 500 * time.Millisecond

// probeEtcd asks the etcd member at endpoint for its status, for m.
func (s *Server) probeEtcd(ctx context.Context, m *transport.CtlMember, endpoint string) {
	sctx, cancel := context.WithTimeout(ctx, probeTimeout)
	st, err := s.store.cli.Status(sctx, endpoint)
	cancel()
	if err != nil {
		m.EtcdError = err.Error()
		return
	}
	m.EtcdHealthy = len(st.Errors) == 0
	m.EtcdLeader = st.Leader == st.Header.MemberId
	if len(st.Errors) > 0 {
		m.EtcdError = st.Errors[0]
	}
}

func (s *Server) role() string {
	if s.IsLeader() {
		return "leader"
	}
	return "follower"
}

// Stats are counters of the control plane's events since it started.
type Stats struct {
	Leader        bool  // whether this ctl leads now
	LeaderChanges int64 // times this ctl became or stopped being the leader
	LeaseExpiries int64 // broker leases that ran out (seen by the leader or the ctl holding them)

	// Of etcd, at ctl's last check (every Knobs.EtcdCheckEvery; the
	// largest of the members):
	EtcdDBBytes      int64 // the database file's size, which etcd's quota limits
	EtcdDBInUseBytes int64 // the part of it in use; the rest a defragmentation frees
	EtcdNoSpace      bool  // etcd's NOSPACE alarm is raised: every change is refused
	EtcdDefrags      int64 // members this ctl defragmented
}

// Stats returns the control plane's counters.
func (s *Server) Stats() Stats {
	return Stats{Leader: s.IsLeader(), LeaderChanges: s.stats.leaderChanges.Load(), LeaseExpiries: s.stats.leaseExpiries.Load(),
		EtcdDBBytes: s.space.dbSize.Load(), EtcdDBInUseBytes: s.space.dbInUse.Load(), EtcdNoSpace: s.space.noSpace.Load(), EtcdDefrags: s.space.defrags.Load()}
}
