package ctlclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// MemberConfig configures a broker's membership ([Join]). The zero value
// of every field but CtlAddr, TLS and Node means its default.
type MemberConfig struct {
	// CtlAddrs are the QUIC addresses of the control plane's members; the
	// member registers with the first that answers, and moves on to the
	// next when it fails. Any ctl will do: followers hold registrations
	// and forward changes to the leader. Required (or CtlAddr).
	CtlAddrs []string
	// CtlAddr is a single control plane address, added to CtlAddrs.
	CtlAddr string
	// TLS is the client TLS config with the broker's node certificate,
	// normally transport.ClientTLS(ca, &nodeCert, "", transport.ALPNCtl).
	// Required.
	TLS *tls.Config
	// Transport tunes QUIC; zero means transport's defaults.
	Transport transport.Config
	// Node is what the broker registers as. NodeID must be the node id of
	// the TLS certificate; Addr is required. Node.Features nil means the
	// features of this build (transport.Features), which the control
	// plane needs to see before it makes a change that a broker of an
	// earlier version could not take (such as a replica move); a non-nil
	// empty list advertises none, as a broker of an earlier version.
	Node transport.Register
	// LeaseTTL is the broker lease the member starts with: heartbeats
	// are sent every LeaseTTL/3, and a ctl that answers heartbeats but
	// sent nothing (no answer, no map) for LeaseTTL/2 (at least 500ms),
	// or sends no first map within as long, is left for the next, which
	// adopts the lease. The lease is the control plane's (etcd holds it
	// for the ctl, which marks the broker down when it runs out), and a
	// ctl says its own with the maps of a registration
	// (transport.MapUpdate.LeaseTTL): the member then goes by that one
	// instead ([Member.LeaseTTL]), logging a warning when it differs from
	// this one. A longer lease than the ctl's would have the member
	// heartbeat past the time ctl gives it, shown down and registering
	// again over and over. A ctl of an earlier version says none: this
	// one is kept. Default 3s, the control plane's default.
	LeaseTTL time.Duration
	// MaxBackoff caps the delay between connection attempts, which starts
	// at 50ms and doubles (with jitter) after every round of the ctls
	// that failed and every registration that ended within LeaseTTL; it
	// starts again at 50ms once a registration lasted LeaseTTL. A
	// registration that ctl ends because another process registered as
	// this node (transport.CodeReplaced) is logged at error level and
	// made again only after MaxBackoff. Default 2s.
	MaxBackoff time.Duration
	// Logger receives one line per meaningful event. Default slog.Default().
	Logger *slog.Logger
	// Cluster is the ID of the cluster the member belongs to
	// (shardmap.Map.Cluster), as it kept it from the maps it took before;
	// "" if it took none that named one. A map of another cluster is
	// refused: Join fails, and a running member stays with the map it
	// holds while it tries again (see ErrOtherCluster).
	Cluster string
	// OnCluster, when set, is called with the cluster ID of the first map
	// that names one while the member knows none, before that map is
	// taken: the broker keeps it with its data. An error refuses the map
	// (and fails Join).
	OnCluster func(id string) error
	// Report, when set, says where the broker's replicas stand: every
	// heartbeat carries what it returns (transport.Heartbeat.Replicas),
	// and one is sent at once on each new registration and on
	// [Member.Report] when it changed. The control plane checks it before
	// it moves a replica. A member with Report and Node.Features nil
	// advertises transport.FeatureReplicaReports; one without, nothing
	// to report, does not.
	Report func() *transport.ReplicaReport
	// JoinRoundFailed, when set, is called by [Join], with the last
	// attempt's error, each time a full round of CtlAddrs has failed
	// without a registration (before its backoff): the control plane is
	// out of reach, not merely slow to answer one address. Join goes on
	// retrying as without it. It is not called once Join has returned.
	JoinRoundFailed func(err error)
}

// ErrOtherCluster is matched by the error refusing a map of another
// cluster than the member's: a control plane that lost its state and made
// a new cluster, or the control plane of another cluster. Applying it
// would treat the member's data as the new cluster's (removing what that
// cluster does not hold), so the member never takes it; the operator
// points the member at its own control plane, or, to make it a member of
// the new cluster with no data, empties its data directory.
var ErrOtherCluster = errors.New("ctl: the control plane serves another cluster")

// DefaultMaxBackoff is the default cap on reconnect delays.
const DefaultMaxBackoff = 2 * time.Second

// DefaultLeaseTTL is the default broker lease, the control plane's as
// well (ctl.DefaultLeaseTTL).
const DefaultLeaseTTL = 3 * time.Second

// MaxMapFrame bounds the frames carrying maps: what ctl writes and what
// members and admin clients read from ctl. A map of many streams with
// thousands of shards each can exceed transport's default frame limit.
// It is transport.MaxMapFrame, which brokers and the SDK use for their
// admin answers too.
const MaxMapFrame = transport.MaxMapFrame

const minBackoff = 50 * time.Millisecond

// minLeaseTTL is the shortest lease a member goes by: heartbeats are sent
// every LeaseTTL/3.
const minLeaseTTL = 3 * time.Millisecond

// opMapGet is the admin request for the current map (ctl.OpMapGet).
const opMapGet = "map.get"

// streamCodeDone is the QUIC stream error code for "nothing more to read
// or write", as ctl uses it.
const streamCodeDone quic.StreamErrorCode = 0

// The codes with which a member ends a registration it leaves for
// another ctl because this one did not answer in time (handOver): its
// registration stream (reset) and its connection. ctl (register.go,
// server.go) leaves the broker's lease to the ctl it registers with next,
// as on its own hand-over; a ctl of an earlier version reads them as the
// stream's end. Wire values: never renumber.
const (
	streamCodeHandOver quic.StreamErrorCode      = 2
	connCodeHandOver   quic.ApplicationErrorCode = 3
)

func (c MemberConfig) withDefaults() MemberConfig {
	if c.CtlAddr != "" && !slices.Contains(c.CtlAddrs, c.CtlAddr) {
		c.CtlAddrs = append(slices.Clone(c.CtlAddrs), c.CtlAddr)
	}
	if c.Node.Features == nil {
		c.Node.Features = transport.Features()
		if c.Report == nil {
			c.Node.Features = slices.DeleteFunc(c.Node.Features, func(f string) bool { return f == transport.FeatureReplicaReports })
		}
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Member is a broker's membership in the cluster: its registration with
// the control plane, kept alive by heartbeats and re-established after any
// failure (such as a ctl restart), and the latest map ctl pushed.
//
// To follow the map, take [Member.Changed] before reading [Member.Map] and
// wait on it:
//
//	for {
//		changed := m.Changed()
//		apply(m.Map())
//		select {
//		case <-changed:
//		case <-ctx.Done():
//			return
//		}
//	}
//
// Maps only move forward: a map with an epoch not above the held one is
// ignored. All methods are safe for concurrent use.
type Member struct {
	cfg MemberConfig
	log *slog.Logger

	cur atomic.Pointer[shardmap.Map] // latest map; never nil after Join

	// mu guards the change notification and the current connection, which
	// the run goroutine replaces while Changed, Request and Refresh read
	// them from any goroutine.
	mu struct {
		sync.Mutex
		changed   chan struct{} // closed when cur moves forward, then replaced
		conn      *quic.Conn    // nil while reconnecting
		connected chan struct{} // closed when conn becomes non-nil
		lost      time.Time     // when conn became nil; zero while connected
		cluster   string        // the cluster the member's maps name, once known
	}

	// next is the index in CtlAddrs of the ctl to dial next; it moves on
	// after every failed attempt. Only the run goroutine (and Join before
	// it) touches it.
	next atomic.Int64
	// backoff is the delay before the next attempt after a round of
	// failed ones or a registration that ended soon (see MaxBackoff). Only
	// the run goroutine (and Join before it) touches it.
	backoff time.Duration

	report chan struct{} // capacity 1: a report to send now (Report)

	// lease is the broker lease the member goes by (a time.Duration):
	// MemberConfig.LeaseTTL until a ctl says its own (followLease).
	lease atomic.Int64

	ctx       context.Context // canceled by Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup // the run goroutine and its heartbeat goroutine
	closeOnce sync.Once
}

// ctlLink is one registered connection to ctl.
type ctlLink struct {
	conn *quic.Conn
	str  *quic.Stream
	in   *progressReader // str as r reads it
	r    *transport.Reader
	w    *transport.Writer
	// acks is whether ctl answers heartbeats (both advertise
	// transport.FeatureHeartbeatAcks): the link is dropped when ctl has
	// sent nothing (no answer, no map) for answerTimeout.
	acks bool
}

// progressReader is a registration stream as its Reader reads it. While
// a wait is armed, the stream's read deadline is that long after the
// last bytes came, not after the last whole frame: a map that takes
// longer than the wait to arrive (a large one, a slow link), its bytes
// coming all the while, is not a ctl that sends nothing. Only the
// link's reading goroutine uses it.
type progressReader struct {
	str  *quic.Stream
	wait time.Duration // 0: no deadline
}

// arm sets the wait (0: none) and the deadline from now.
func (p *progressReader) arm(wait time.Duration) {
	p.wait = wait
	var deadline time.Time
	if wait > 0 {
		deadline = time.Now().Add(wait)
	}
	_ = p.str.SetReadDeadline(deadline)
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.str.Read(b)
	if n > 0 && p.wait > 0 {
		_ = p.str.SetReadDeadline(time.Now().Add(p.wait))
	}
	return n, err
}

// Join connects to the control plane, registers cfg.Node and waits for the
// first map, retrying with capped backoff until ctx ends. A refusal that
// retrying cannot fix (CodeUnauthorized, CodeInvalid) is returned at once
// as a *transport.Error. After Join returns, a goroutine keeps the
// registration: it heartbeats, follows map updates, and reconnects and
// re-registers after any failure until Close.
func Join(ctx context.Context, cfg MemberConfig) (*Member, error) {
	cfg = cfg.withDefaults()
	switch {
	case len(cfg.CtlAddrs) == 0:
		return nil, errors.New("ctl: join: MemberConfig.CtlAddrs is required")
	case cfg.TLS == nil:
		return nil, errors.New("ctl: join: MemberConfig.TLS is required")
	case cfg.Node.NodeID == "" || cfg.Node.Addr == "":
		return nil, fmt.Errorf("ctl: join: MemberConfig.Node needs NodeID and Addr (got %q, %q)", cfg.Node.NodeID, cfg.Node.Addr)
	case cfg.LeaseTTL < minLeaseTTL:
		return nil, fmt.Errorf("ctl: join: MemberConfig.LeaseTTL %v is too short", cfg.LeaseTTL)
	}
	// Only a control plane certificate will do: a broker's or a client's
	// cannot pose as ctl.
	cfg.TLS = transport.VerifyPeer(cfg.TLS, transport.RoleCtl, "")
	m := &Member{cfg: cfg, log: cfg.Logger.With("component", "ctl-member", "node", cfg.Node.NodeID)}
	m.mu.changed = make(chan struct{})
	m.mu.connected = make(chan struct{})
	m.mu.cluster = cfg.Cluster
	m.report = make(chan struct{}, 1)
	m.lease.Store(int64(cfg.LeaseTTL))
	m.backoff = minBackoff
	m.ctx, m.cancel = context.WithCancel(context.Background())
	link, err := m.connect(ctx, true, cfg.JoinRoundFailed)
	if err != nil {
		m.cancel()
		return nil, fmt.Errorf("ctl: join %s as %s: %w", strings.Join(cfg.CtlAddrs, ","), cfg.Node.NodeID, err)
	}
	m.log.Info("joined the cluster", "ctl", m.ctlAddr(), "epoch", m.Map().Epoch)
	m.wg.Add(1)
	go m.run(link)
	return m, nil
}

// ctlAddr is the ctl address to dial now.
func (m *Member) ctlAddr() string {
	return m.cfg.CtlAddrs[int(m.next.Load())%len(m.cfg.CtlAddrs)]
}

// NodeID returns the node id the member registered as.
func (m *Member) NodeID() string { return m.cfg.Node.NodeID }

// LeaseTTL returns the broker lease the member goes by: the one the ctl
// it registered with last says it holds, or, until one says so (a ctl of
// an earlier version says nothing), MemberConfig.LeaseTTL.
func (m *Member) LeaseTTL() time.Duration { return time.Duration(m.lease.Load()) }

// followLease makes ttl, the lease a ctl says it holds, the member's,
// logging a warning when it changes to one other than
// MemberConfig.LeaseTTL. 0 (a ctl of an earlier version) changes
// nothing, nor does a lease too short to heartbeat by.
func (m *Member) followLease(ttl time.Duration) {
	switch was := m.LeaseTTL(); {
	case ttl == 0 || ttl == was:
	case ttl < minLeaseTTL:
		m.log.Warn("the control plane's broker lease is too short to heartbeat by; keeping this one", "ctl", m.ctlAddr(), "ctl_lease_ttl", ttl, "lease_ttl", was)
	default:
		m.lease.Store(int64(ttl))
		if ttl != m.cfg.LeaseTTL {
			m.log.Warn("the control plane's broker lease differs from this broker's (--lease-ttl): going by the control plane's, which holds the lease; set both alike",
				"ctl", m.ctlAddr(), "ctl_lease_ttl", ttl, "lease_ttl", m.cfg.LeaseTTL)
		} else {
			m.log.Info("the control plane's broker lease is this broker's again", "ctl", m.ctlAddr(), "lease_ttl", ttl)
		}
	}
}

// Map returns the latest map. It is immutable; share it freely.
func (m *Member) Map() *shardmap.Map { return m.cur.Load() }

// Changed returns a channel that is closed when a map newer than the one
// Map returns now arrives. Take it before reading Map so no update is
// missed; after it fires, call Changed again.
func (m *Member) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.changed
}

// Refresh returns a map with Epoch >= minEpoch, waiting for ctl to push one
// and asking it (map.get, at most every LeaseTTL/3) meanwhile, until ctx
// ends. Brokers call it when a peer reports an epoch newer than theirs.
// ctl answers the map.get only of a member registered with
// transport.FeatureMemberMapGet (MemberConfig.Node.Features nil
// advertises it); refused, Refresh waits for a push.
func (m *Member) Refresh(ctx context.Context, minEpoch uint64) (*shardmap.Map, error) {
	poll := m.LeaseTTL() / 3
	for {
		if cur := m.Map(); cur.Epoch >= minEpoch {
			return cur, nil
		}
		resp, err := m.Request(ctx, &transport.Request{Op: opMapGet})
		if err == nil && resp.Map != nil {
			if _, err := m.adopt(resp.Map); err != nil {
				return nil, err
			}
			if resp.Map.Epoch >= minEpoch {
				continue
			}
		}
		// ctl holds no map that new yet (or did not answer): wait for it
		// to push one, asking again after poll.
		changed := m.Changed()
		if m.Map().Epoch >= minEpoch {
			continue
		}
		select {
		case <-changed:
		case <-time.After(poll):
		case <-ctx.Done():
			return nil, fmt.Errorf("ctl: refresh map to epoch %d (holding %d): %w", minEpoch, m.Map().Epoch, ctx.Err())
		}
	}
}

// Request sends an admin request to ctl on a new stream of the member's
// connection, waiting for a connection while reconnecting (bounded by
// ctx). A refusal comes back as a *transport.Error.
func (m *Member) Request(ctx context.Context, req *transport.Request) (*transport.Response, error) {
	for {
		m.mu.Lock()
		conn, connected := m.mu.conn, m.mu.connected
		m.mu.Unlock()
		if conn != nil {
			return Request(ctx, conn, req)
		}
		select {
		case <-connected:
		case <-ctx.Done():
			return nil, fmt.Errorf("ctl: request %s: not connected to ctl: %w", req.Op, ctx.Err())
		case <-m.ctx.Done():
			return nil, fmt.Errorf("ctl: request %s: member closed", req.Op)
		}
	}
}

// Close ends the registration (ctl marks the node down at once) and stops
// the member's goroutines.
func (m *Member) Close() error {
	m.closeOnce.Do(func() {
		m.cancel()
		m.wg.Wait()
		m.log.Info("left the cluster")
	})
	return nil
}

// adopt makes mp the current map if it is newer, and reports whether it
// was. A map of another cluster is refused with an error matching
// ErrOtherCluster and transport.ErrInvalid.
func (m *Member) adopt(mp *shardmap.Map) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkClusterLocked(mp); err != nil {
		return false, err
	}
	cur := m.cur.Load()
	if !mp.NewerThan(cur) {
		if mp.Epoch < cur.Epoch {
			m.log.Warn("ctl sent an older map than the one held; ignored (was ctl's state lost?)", "epoch", mp.Epoch, "held", cur.Epoch)
		}
		return false, nil
	}
	m.cur.Store(mp)
	close(m.mu.changed)
	m.mu.changed = make(chan struct{})
	return true, nil
}

// checkClusterLocked refuses mp if it names another cluster than the
// member's, and makes the cluster of the first map that names one the
// member's, handing it to MemberConfig.OnCluster first. A map naming none
// (a control plane older than cluster IDs) passes. m.mu is held.
func (m *Member) checkClusterLocked(mp *shardmap.Map) error {
	switch {
	case mp.Cluster == "" || mp.Cluster == m.mu.cluster:
		return nil
	case !transport.ValidID(mp.Cluster):
		// Kept with the data and compared on every start: never one that
		// would not read back the same (control planes make 26 base32
		// letters and digits).
		return transport.Errorf(transport.CodeMalformed, "map of epoch %d names cluster %.80q: want up to %d letters, digits, '-' and '_'", mp.Epoch, mp.Cluster, transport.MaxIDLen)
	case m.mu.cluster != "":
		return transport.Errorf(transport.CodeInvalid, "%w: its map (epoch %d) is of cluster %s, and %s belongs to cluster %s with its data: point it at its own control plane, or empty its data directory to make it a new member of this cluster",
			ErrOtherCluster, mp.Epoch, mp.Cluster, m.cfg.Node.NodeID, m.mu.cluster)
	}
	if f := m.cfg.OnCluster; f != nil {
		if err := f(mp.Cluster); err != nil {
			return fmt.Errorf("keep the ID of cluster %s: %w", mp.Cluster, err)
		}
	}
	m.mu.cluster = mp.Cluster
	m.log.Info("member of cluster "+mp.Cluster, "epoch", mp.Epoch)
	return nil
}

func (m *Member) setConn(conn *quic.Conn) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case conn != nil && m.mu.conn == nil:
		close(m.mu.connected)
		m.mu.lost = time.Time{}
	case conn == nil && m.mu.conn != nil:
		m.mu.connected = make(chan struct{})
		m.mu.lost = time.Now()
	}
	m.mu.conn = conn
}

// Unlinked returns how long the member has been without its registration
// link to a ctl, 0 while it has one. Past the lease, the control plane
// sees this node down. A link to a ctl that answers heartbeats but sent
// nothing for half a lease is dropped (see MemberConfig.LeaseTTL),
// so a stuck ctl does not count as one.
func (m *Member) Unlinked() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mu.conn != nil || m.mu.lost.IsZero() {
		return 0
	}
	return time.Since(m.mu.lost)
}

// connect dials and registers until it succeeds or ctx ends, trying each
// ctl in turn and sleeping the backoff after each round. With
// stopOnRefusal, a refusal retrying cannot fix ends it at once.
// roundFailed, if not nil, is called after each round that failed.
func (m *Member) connect(ctx context.Context, stopOnRefusal bool, roundFailed func(error)) (*ctlLink, error) {
	for attempt := 1; ; attempt++ {
		link, err := m.register(ctx)
		if err == nil {
			return link, nil
		}
		if stopOnRefusal && (errors.Is(err, transport.ErrUnauthorized) || errors.Is(err, transport.ErrInvalid)) {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (after %d attempts; last: %v)", ctx.Err(), attempt, err)
		}
		level := slog.LevelDebug
		if attempt == 1 || attempt%30 == 0 {
			level = slog.LevelWarn
		}
		m.log.Log(ctx, level, "ctl unreachable; retrying", "ctl", m.ctlAddr(), "attempt", attempt, "err", err)
		m.next.Add(1)
		if int(m.next.Load())%len(m.cfg.CtlAddrs) != 0 {
			continue // try the next ctl at once; back off after a full round
		}
		if roundFailed != nil {
			roundFailed(err)
		}
		if m.sleepBackoff(ctx) != nil {
			return nil, fmt.Errorf("%w (after %d attempts; last: %v)", ctx.Err(), attempt, err)
		}
	}
}

// sleepBackoff sleeps half to all of the backoff, which then doubles up
// to MaxBackoff, or until ctx ends (returning its error).
func (m *Member) sleepBackoff(ctx context.Context) error {
	delay := m.backoff/2 + rand.N(m.backoff/2+1)
	m.backoff = min(2*m.backoff, m.cfg.MaxBackoff)
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ctlTransport is the QUIC config of the link to ctl: MemberConfig's,
// with the idle and handshake timeouts cut to half a lease (at least a
// second) and keep-alives three times as often. A ctl that dies without
// closing (kill -9, its machine lost) is then noticed, and the member
// re-registers with another and adopts its lease, before that lease runs
// out: a ctl failover marks no broker down. (The data path's default is
// 5s, longer than the default lease.)
func (m *Member) ctlTransport() transport.Config {
	tc := m.cfg.Transport
	idle := max(m.LeaseTTL()/2, time.Second)
	if tc.MaxIdleTimeout <= 0 || tc.MaxIdleTimeout > idle {
		tc.MaxIdleTimeout = idle
	}
	if tc.KeepAlivePeriod == 0 || tc.KeepAlivePeriod > tc.MaxIdleTimeout/3 {
		tc.KeepAlivePeriod = tc.MaxIdleTimeout / 3
	}
	if tc.HandshakeTimeout <= 0 || tc.HandshakeTimeout > tc.MaxIdleTimeout {
		tc.HandshakeTimeout = tc.MaxIdleTimeout
	}
	return tc
}

// answerTimeout is how long the member waits for ctl to answer: for the
// first map of a registration, and, from a ctl that answers heartbeats,
// for the next answer. Half the lease, as ctl's own hand-over, leaving
// the other half to register with the next ctl and adopt the lease there
// before it runs out; at least half a second (etcd holds leases in whole
// seconds, and a loaded machine may be late by a heartbeat).
func (m *Member) answerTimeout() time.Duration {
	return max(m.LeaseTTL()/2, 500*time.Millisecond)
}

// register makes one attempt: dial, open the registration stream, send
// Register, and read the first map, waiting for it answerTimeout at most
// (a ctl whose registrations are stuck sends none). A registration given
// up on for want of its first map is ended as handed over (handOver):
// ctl may have registered the broker by then.
func (m *Member) register(ctx context.Context) (link *ctlLink, err error) {
	conn, err := transport.Dial(ctx, m.ctlAddr(), m.cfg.TLS, m.ctlTransport())
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	// Closing the connection unblocks the reads below if ctx ends first.
	stop := context.AfterFunc(ctx, func() { conn.CloseWithError(0, "") })
	defer func() {
		if !stop() && err == nil {
			link, err = nil, ctx.Err() // closed just as we finished
		}
		if err != nil {
			conn.CloseWithError(0, "")
			return
		}
		m.setConn(conn)
	}()
	str, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return nil, fmt.Errorf("open registration stream: %w", ctxErr(ctx, err))
	}
	in := &progressReader{str: str}
	link = &ctlLink{conn: conn, str: str, in: in, r: transport.NewReader(in, MaxMapFrame), w: transport.NewWriter(str)}
	reg := m.cfg.Node
	m.mu.Lock()
	reg.Cluster = m.mu.cluster // a control plane of another cluster refuses it
	m.mu.Unlock()
	if err := link.w.Write(&reg); err != nil {
		return nil, fmt.Errorf("send register: %w", ctxErr(ctx, err))
	}
	wait := m.answerTimeout()
	in.arm(wait)
	f, err := link.r.Read()
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// ctl may have registered the broker meanwhile (etcd slow):
			// its lease is left for the next ctl to adopt.
			handOver(link)
			return nil, fmt.Errorf("read first map: none within %v: %w", wait, err)
		}
		return nil, fmt.Errorf("read first map: %w", ctxErr(ctx, err))
	}
	in.arm(0)
	switch f := f.(type) {
	case *transport.MapUpdate:
		if f.Map == nil {
			return nil, transport.Errorf(transport.CodeMalformed, "map update without a map")
		}
		if _, err := m.adopt(f.Map); err != nil {
			return nil, err
		}
		m.followLease(f.LeaseTTL)
		link.acks = slices.Contains(reg.Features, transport.FeatureHeartbeatAcks) && slices.Contains(f.Features, transport.FeatureHeartbeatAcks)
	case *transport.Error:
		return nil, f
	default:
		return nil, transport.Errorf(transport.CodeUnexpectedFrame, "ctl answered a registration with a %v frame", f.Type())
	}
	return link, nil
}

// run keeps the registration until Close: it serves a link until it
// fails, then reconnects (getting the current map first) and serves again.
// A link that lasted a lease is made again at once (the backoff starts
// over); one that ended sooner only after the backoff, so that a link
// ctl ends as soon as it is made is not made again in a loop; one that
// another registration of this node replaced, after MaxBackoff.
func (m *Member) run(link *ctlLink) {
	defer m.wg.Done()
	for {
		linked := time.Now()
		err := m.serve(link)
		m.setConn(nil)
		link.conn.CloseWithError(0, "")
		if m.ctx.Err() != nil {
			return
		}
		lasted := time.Since(linked)
		switch {
		case errors.Is(err, transport.ErrReplaced):
			m.backoff = m.cfg.MaxBackoff
			m.log.Error("registration replaced by another process registering as this node; stop the one that should not run. Registering again after the longest backoff",
				"ctl", m.ctlAddr(), "backoff", m.backoff, "err", err)
		case lasted >= m.LeaseTTL():
			m.backoff = minBackoff
			m.log.Warn("ctl connection lost; reconnecting", "ctl", m.ctlAddr(), "err", err)
		default:
			m.log.Warn("ctl connection lost soon after registering; reconnecting after a backoff", "ctl", m.ctlAddr(), "lasted", lasted.Round(time.Millisecond), "err", err)
		}
		m.next.Add(1) // a ctl that failed is tried last
		if lasted < m.LeaseTTL() || errors.Is(err, transport.ErrReplaced) {
			if m.sleepBackoff(m.ctx) != nil {
				return // Close was called
			}
		}
		if link, err = m.connect(m.ctx, false, nil); err != nil {
			return // only when Close was called
		}
		m.log.Info("re-registered with ctl", "ctl", m.ctlAddr(), "epoch", m.Map().Epoch)
	}
}

// serve heartbeats on link from a second goroutine while it reads map
// updates and ctl's answers to heartbeats, until the link fails or the
// member closes. From a ctl that answers heartbeats, nothing (no answer,
// no map) for answerTimeout fails the link: that ctl is not keeping the
// registration (its goroutines stuck while its QUIC stack still answers,
// or its answers delayed past the time left to move), and the member
// ends the link as handed over (handOver) and registers with the next
// before the lease runs out, adopting it there.
func (m *Member) serve(link *ctlLink) error {
	stop := context.AfterFunc(m.ctx, func() { link.conn.CloseWithError(0, "member closing") })
	defer stop()
	hbStop, hbDone := make(chan struct{}), make(chan struct{})
	m.wg.Add(1)
	go m.heartbeat(link, hbStop, hbDone)
	defer func() {
		close(hbStop)
		link.str.CancelWrite(streamCodeDone) // unblock a heartbeat stuck in Write
		<-hbDone
	}()
	wait := m.answerTimeout()
	if link.acks {
		// Any bytes from ctl move the deadline on: an answer, or a map
		// pushed, however long it takes to arrive.
		link.in.arm(wait)
	}
	for {
		f, err := link.r.Read()
		if err != nil {
			if link.acks && errors.Is(err, os.ErrDeadlineExceeded) {
				handOver(link)
				return fmt.Errorf("ctl sent nothing for %v (no answer to a heartbeat): its registration is not kept (is it hung?): %w", wait, err)
			}
			return err
		}
		switch f := f.(type) {
		case *transport.Heartbeat:
			// ctl's answer: its bytes moved the deadline on.
		case *transport.MapUpdate:
			if f.Map == nil {
				return transport.Errorf(transport.CodeMalformed, "map update without a map")
			}
			adopted, err := m.adopt(f.Map)
			if err != nil {
				return err
			}
			if adopted {
				m.log.Debug("map received", "epoch", f.Map.Epoch)
			}
		case *transport.Error:
			return f
		default:
			return transport.Errorf(transport.CodeUnexpectedFrame, "ctl sent a %v frame on the registration stream", f.Type())
		}
	}
}

// handOver ends link as one this member leaves for another ctl, with
// the codes that tell ctl so: ctl keeps the broker's lease for the ctl it
// registers with next to adopt, instead of deleting its live/ key as for
// a broker gone (the node would be shown down, then live again: two maps
// for every broker and client). Both codes are sent, the stream's first:
// whichever reaches ctl first ends the registration there.
func handOver(link *ctlLink) {
	link.str.CancelWrite(streamCodeHandOver)
	link.conn.CloseWithError(connCodeHandOver, "member registers with another ctl")
}

// heartbeat sends a Heartbeat every LeaseTTL/3 (the lease the member
// goes by when the link is served) until stop closes, and,
// with MemberConfig.Report, one at once and on Report when the report
// changed. A failed write ends the link's reads too.
func (m *Member) heartbeat(link *ctlLink, stop <-chan struct{}, done chan<- struct{}) {
	defer m.wg.Done()
	defer close(done)
	t := time.NewTicker(m.LeaseTTL() / 3)
	defer t.Stop()
	var sent *transport.ReplicaReport
	send := func(always bool) bool {
		hb := &transport.Heartbeat{NodeID: m.cfg.Node.NodeID, Epoch: m.Map().Epoch}
		if m.cfg.Report != nil {
			hb.Replicas = m.cfg.Report()
		}
		if !always && hb.Replicas.Equal(sent) {
			return true
		}
		if err := link.w.Write(hb); err != nil {
			link.str.CancelRead(streamCodeDone)
			return false
		}
		sent = hb.Replicas
		return true
	}
	if m.cfg.Report != nil && !send(true) {
		return
	}
	for {
		select {
		case <-t.C:
			if !send(true) {
				return
			}
		case <-m.report:
			if !send(false) {
				return
			}
		case <-stop:
			return
		}
	}
}

// Report sends the broker's replica report (MemberConfig.Report) with a
// heartbeat now, if it changed since the last one sent; a no-op without
// MemberConfig.Report. It never blocks.
func (m *Member) Report() {
	select {
	case m.report <- struct{}{}:
	default:
	}
}
