package ctl

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/ctl/ctlclient"
	"github.com/felix-broker/felix/internal/dirlock"
	"github.com/felix-broker/felix/internal/logonce"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// Config configures a control-plane [Server]. The zero value of every
// field but DataDir and TLS means its default.
type Config struct {
	// Addr is the QUIC listen address. Default "127.0.0.1:7000"; port 0
	// picks a free port (see [Server.Addr]).
	Addr string
	// DataDir holds the embedded etcd's data (DataDir/etcd) and the URLs
	// it listens on; a state file of an earlier version found there is
	// imported into etcd on first start. Required; created if missing,
	// readable by its owner only (made so if it is not).
	DataDir string
	// Etcd says where the state lives: by default an embedded
	// single-member etcd in DataDir, on https://127.0.0.1 ports secured
	// by Etcd.CertFile, KeyFile and CAFile (the ctl's certificate and the
	// cluster CA as files, required).
	Etcd EtcdConfig
	// TLS is the server TLS config, normally
	// transport.ServerTLS(cert, ca, transport.ALPNCtl). Required by Start.
	TLS *tls.Config
	// Transport tunes QUIC; zero means transport's defaults. Its
	// MaxHandshakes and RetryHandshakes bound the connections in their
	// handshake, as on a broker (see transport.Listen).
	Transport transport.Config
	// LeaseTTL is how long a broker stays Live without a heartbeat.
	// Default 3s; brokers heartbeat every LeaseTTL/3: ctl says it with
	// the maps of each registration (transport.MapUpdate.LeaseTTL), and
	// a broker goes by it whatever its own (ctlclient.MemberConfig.LeaseTTL).
	LeaseTTL time.Duration
	// Superusers are the client principals (certificate common names)
	// authorized for everything, as Kafka's super.users: the operators who
	// grant everyone else their permissions. Default none. The leader's
	// are the cluster's: it records them with the state, and followers
	// push its list, not their own.
	Superusers []string
	// Name is this ctl's name among the control plane's members. Default
	// the embedded etcd member's name, else the host name.
	Name string
	// Advertise is the QUIC address other ctls (forwarding changes to the
	// leader) and operators reach this ctl at. Default the bound address.
	Advertise string
	// PeerTLS is the client TLS config this ctl forwards changes to the
	// leader with; it must present a control plane certificate. Default
	// built from TLS (its certificate and client CAs).
	PeerTLS *tls.Config
	// CtlTTL is the lease of this ctl's election session: a leader that
	// cannot renew it (dead, or cut off from a quorum of etcd) is replaced
	// after about this long. Whole seconds; default 3s.
	CtlTTL time.Duration
	// OnEtcdRoundTrip, if set, is called with the duration of every etcd
	// request ctl makes (op: load, commit, live, keepalive); for metrics.
	OnEtcdRoundTrip func(op string, d time.Duration)
	// Logger receives one line per meaningful event. Default slog.Default().
	Logger *slog.Logger
	// MaxShardsTotal bounds the shards of all streams together: a stream
	// create that would pass it is refused with CodeLimitExceeded
	// (matching ErrLimitExceeded). Every shard is a log on some broker
	// and an owner in every map pushed to every broker and client, so
	// the bound keeps both within what brokers hold by default (see
	// broker.Config.MaxShards, whose default is the same). Default
	// DefaultMaxShardsTotal (16384: four streams of shardmap.MaxShards,
	// or a thousand of 16).
	MaxShardsTotal int
	// MaxGrants bounds the grants of the policy: a grant that would pass
	// it is refused with CodeLimitExceeded (matching ErrLimitExceeded);
	// revokes always go through. Every grant is in the map pushed to
	// every broker, up to 552 bytes each (a principal and a pattern of
	// 256 bytes). Default DefaultMaxGrants (16384: at most 9 MiB of
	// every map). Whatever the bound, an admin change that would make
	// the map too large to push is refused too (MapTooLargeError).
	MaxGrants int
	// Knobs are testing knobs; the zero value is production behaviour.
	Knobs Knobs
}

// Knobs are ctl's testing knobs (Config.Knobs).
type Knobs struct {
	// MaxMapBytes lowers the largest map frame an admin change may make
	// (see MapTooLargeError), for a test to reach it with a small map.
	// Default, and most: ctlclient.MaxMapFrame less a sixteenth (60 MiB),
	// a margin for the changes ctl cannot refuse (members joining).
	MaxMapBytes int
	// EtcdQuotaBytes is the embedded etcd member's backend quota
	// (etcd's --quota-backend-bytes), for a test to fill it. Default
	// etcd's, 2 GiB.
	EtcdQuotaBytes int64
	// EtcdCheckEvery is how often ctl checks etcd's database size and
	// alarms (see etcdspace.go). Default DefaultEtcdCheckEvery.
	EtcdCheckEvery time.Duration
	// StartBound, if set, is called by Start once it has bound its
	// socket, before it serves on it: a test closes the server there.
	StartBound func()
}

// DefaultAddr is the default control-plane listen address.
const DefaultAddr = "127.0.0.1:7000"

// DefaultMaxShardsTotal is the default Config.MaxShardsTotal.
const DefaultMaxShardsTotal = 16384

// DefaultMaxGrants is the default Config.MaxGrants.
const DefaultMaxGrants = 16384

// DefaultLeaseTTL is the default broker lease (the members' default too).
const DefaultLeaseTTL = ctlclient.DefaultLeaseTTL

// DefaultCtlTTL is the default Config.CtlTTL.
const DefaultCtlTTL = 3 * time.Second

// mapFrameMax bounds the frames carrying maps: what ctl writes and what
// members and admin clients read from ctl (ctlclient.MaxMapFrame). What
// ctl reads from peers (registrations, heartbeats, requests) is small and
// bounded by Config.Transport.MaxFrame instead.
const mapFrameMax = ctlclient.MaxMapFrame

// Connection error codes ctl closes connections with. (A member closes
// one with connCodeHandOver: register.go.)
const (
	connCodeShuttingDown  quic.ApplicationErrorCode = 1
	connCodeWrongProtocol quic.ApplicationErrorCode = 2
)

// firstFrameTimeout bounds how long a new stream may take to send its
// first frame.
const firstFrameTimeout = 10 * time.Second

func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.CtlTTL <= 0 {
		c.CtlTTL = DefaultCtlTTL
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MaxShardsTotal <= 0 {
		c.MaxShardsTotal = DefaultMaxShardsTotal
	}
	if c.MaxGrants <= 0 {
		c.MaxGrants = DefaultMaxGrants
	}
	return c
}

// limits are the limits of the configuration the core enforces.
func (s *Server) limits() stateLimits {
	return stateLimits{maxShardsTotal: s.cfg.MaxShardsTotal, maxGrants: s.cfg.MaxGrants, maxMapBytes: s.cfg.Knobs.MaxMapBytes}
}

// Server is the control plane. Create it with [New], start it with
// [Server.Start], stop it with [Server.Close].
type Server struct {
	cfg  Config
	log  *slog.Logger
	lock *dirlock.Lock // keeps other processes off DataDir until Close

	// current is the latest map, for readers that need no lock; changed
	// is closed when it is replaced (WatchMap).
	current atomic.Pointer[shardmap.Map]
	changed atomic.Pointer[chan struct{}]

	// mu serializes every change to the state: registrations, heartbeats,
	// lease expiry, stream changes, from many goroutines. A change, the
	// write of the state file and the push of the new map happen under it,
	// so maps are persisted and pushed strictly in epoch order.
	mu struct {
		sync.Mutex
		st          *state
		sessions    map[string]*session // current registration per node id
		nextSession uint64
		closed      bool
		// leader is whether this ctl is the elected leader, which alone
		// commits changes (its writes fenced by its election key).
		leader bool
		// graceUntil is the end of the registration grace after this
		// ctl took over (see takeOver); zero once it ended.
		graceUntil time.Time
		// unsaved names a liveness change made to st that could not be
		// committed yet (etcd slow or unreachable, this ctl still the
		// leader); "" when st is committed. Such a map is never pushed:
		// retryCommit commits it, or a later change's commit records it.
		unsaved string
		// retrying is whether retryCommit runs.
		retrying bool
	}

	// mapGetConns holds the connections carrying a registration made
	// with transport.FeatureMemberMapGet (*quic.Conn to its *session),
	// on which the broker's own map.get is answered (memberMapGet). Not
	// under mu: a commit holds mu across its etcd write, and map.get
	// answers from the current map without waiting for one.
	mapGetConns sync.Map

	// lost tells the election loop a fenced write failed: this ctl is no
	// longer the leader. Capacity 1.
	lost chan struct{}

	// cutOff is when this ctl found etcd out of reach (UnixNano), 0
	// while it reaches it (see cutoff.go).
	cutOff atomic.Int64

	// stats count events for metrics.
	stats struct {
		leaderChanges atomic.Int64
		leaseExpiries atomic.Int64
	}

	// fwd is the connection to the leader changes are forwarded on.
	fwd forwarder
	// el is the election session under way.
	el election

	// store is the state in etcd; only changes made under mu use it.
	store *store
	etcd  *etcdConn
	// space watches etcd's database size and NOSPACE alarm (etcdspace.go).
	space *etcdSpace

	// unsendable is the newest epoch whose map a registration's writer
	// could not encode, logged once (mapNotSent).
	unsendable atomic.Uint64

	// mapFrame is the newest map a registration's writer sent, encoded
	// once for every broker (mapFrameOf).
	mapFrame atomic.Pointer[encodedMap]

	// denials remembers which principal was denied which op, to log each
	// once, not once per retry.
	denials logonce.Set

	ctx    context.Context // canceled by Close; every goroutine watches it
	cancel context.CancelFunc
	wg     sync.WaitGroup      // every goroutine the server starts
	ln     *transport.Listener // set by Start
	addrMu sync.Mutex          // guards addr, which Start sets while the election loop reads it
	addr   string
	// regToken tells this process's registrations from those of an
	// earlier run of the same ctl.
	regToken string

	startOnce, closeOnce sync.Once
}

// New opens the state in etcd (starting the embedded etcd in
// cfg.DataDir unless cfg.Etcd names an existing cluster; importing a
// state file of an earlier version found in cfg.DataDir) and loads it as
// stored; it changes nothing. The ctl that wins the election brings the
// members' liveness up to date and commits it at the next epoch
// (takeOver), so epochs never repeat across restarts.
func New(cfg Config) (*Server, error) {
	cfg = cfg.withDefaults()
	if cfg.DataDir == "" {
		return nil, errors.New("ctl: new server: Config.DataDir is required")
	}
	log := cfg.Logger.With("component", "ctl")
	if err := privateDir(cfg.DataDir, log); err != nil {
		return nil, fmt.Errorf("ctl: new server: %w", err)
	}
	// One ctl per data directory: its embedded etcd member's files are
	// there (internal/dirlock).
	lock, err := dirlock.Take(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("ctl: new server: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	etcd, err := openEtcd(ctx, cfg, log)
	if err != nil {
		cancel()
		lock.Release()
		return nil, err
	}
	s := &Server{cfg: cfg, log: log, etcd: etcd, lost: make(chan struct{}, 1), ctx: ctx, cancel: cancel, lock: lock}
	s.changed.Store(new(make(chan struct{})))
	s.store = newStore(etcd.cli, clusterName(cfg.Etcd))
	s.store.rtt = cfg.OnEtcdRoundTrip
	s.space = &etcdSpace{cli: etcd.cli, embedded: etcd.embedded != nil, epochKey: s.store.epochKey()}
	if etcd.embedded != nil {
		s.space.quota = embeddedQuota(etcd.embedded.Server.Cfg.QuotaBackendBytes)
	}
	s.regToken = strconv.FormatInt(time.Now().UnixNano(), 36)
	rev, err := s.load()
	if err != nil {
		s.cancel()
		etcd.close()
		lock.Release()
		return nil, err
	}
	s.wg.Add(3)
	go s.watchLoop(rev)
	go s.electLoop()
	go s.keepEtcd()
	s.awaitLeader(cfg.Etcd.StartTimeout)
	return s, nil
}

// privateDir creates dir readable by its owner only, or makes it so if it
// is readable by others: it holds the state and where etcd listens. A
// directory this process may not change (a volume whose root another
// user owns) is logged and used as it is: etcd keeps its own data in a
// directory of its own that only its owner can read.
func privateDir(dir string, log *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	if mode := fi.Mode().Perm(); mode&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			log.Warn("data dir is open to other users and could not be made private", "dir", dir, "mode", mode.String(), "err", err)
		} else {
			log.Info("data dir made private", "dir", dir, "was", mode.String())
		}
	}
	return nil
}

// load reads the state from etcd, importing a state file first if there
// is one, and returns the revision to watch from. The state is the one
// the leader last committed, as a follower holds it until elected.
func (s *Server) load() (int64, error) {
	if _, err := s.store.load(s.ctx); err != nil {
		return 0, err
	}
	if err := importStateFile(s.ctx, s.cfg.DataDir, s.store, s.log); err != nil {
		return 0, err
	}
	snap, rev := s.store.snap, s.store.rev
	st := restoreState(snap, s.cfg.Superusers, s.limits())
	s.mu.st = st
	s.mu.sessions = map[string]*session{}
	s.setCurrent(st.Map())
	s.log.Info("ctl state loaded", "etcd", s.store.prefix, "epoch", st.epoch, "members", len(snap.Members), "streams", len(snap.Streams), "grants", len(snap.Grants))
	return rev, nil
}

// awaitLeader waits, up to timeout (default 5s), until a leader is known:
// this ctl, or another. A single ctl elects itself in milliseconds.
func (s *Server) awaitLeader(timeout time.Duration) {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if s.IsLeader() {
			return
		}
		if info, ok := s.leaderInfo(s.ctx); ok && info.ID != s.regToken {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// IsLeader reports whether this ctl is the elected leader now.
func (s *Server) IsLeader() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.leader
}

// name is this ctl's name among the control plane's members.
func (s *Server) name() string {
	switch {
	case s.cfg.Name != "":
		return s.cfg.Name
	case s.cfg.Etcd.Name != "":
		return s.cfg.Etcd.Name
	}
	h, _ := os.Hostname()
	if h == "" {
		h = "ctl"
	}
	return h
}

// advertise is the QUIC address other ctls reach this one at.
func (s *Server) advertise() string {
	if s.cfg.Advertise != "" {
		return s.cfg.Advertise
	}
	if a := s.Addr(); a != "" {
		return a
	}
	return s.cfg.Addr
}

// Start listens on cfg.Addr and serves brokers and admin requests until
// Close. Its goroutines belong to the server.
func (s *Server) Start() error {
	err := errors.New("ctl: start: already started")
	s.startOnce.Do(func() { err = s.start() })
	return err
}

func (s *Server) start() error {
	if s.cfg.TLS == nil {
		return errors.New("ctl: start: Config.TLS is required")
	}
	s.mu.Lock()
	closed := s.mu.closed
	s.mu.Unlock()
	if closed {
		return errors.New("ctl: start: server closed")
	}
	// transport's listener, as a broker's: it bounds the connections in
	// their handshake (Transport.MaxHandshakes, with a Retry past
	// Transport.RetryHandshakes) and owns its socket, which its Close
	// releases before returning, so a ctl restarted in the same process
	// binds its address again.
	ln, err := transport.Listen(s.cfg.Addr, s.cfg.TLS, s.cfg.Transport)
	if err != nil {
		return fmt.Errorf("ctl: start: %w", err)
	}
	if k := s.cfg.Knobs.StartBound; k != nil {
		k()
	}
	// Under mu, as Close sets closed and then takes them: a Close
	// meanwhile has not seen the socket, so it is closed here.
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		ln.Close()
		return errors.New("ctl: start: server closed")
	}
	s.ln = ln
	s.wg.Add(1) // before Close's Wait, which comes after closed is set
	s.mu.Unlock()
	s.addrMu.Lock()
	s.addr = ln.Addr().String()
	s.addrMu.Unlock()
	s.log.Info("ctl listening", "addr", s.Addr(), "lease_ttl", s.cfg.LeaseTTL)
	s.announce()
	go s.acceptLoop()
	return nil
}

// Addr returns the address the server listens on (the actual port when
// cfg.Addr had port 0), or "" before Start.
func (s *Server) Addr() string {
	s.addrMu.Lock()
	defer s.addrMu.Unlock()
	return s.addr
}

// Map returns the current map. It is immutable; share it freely.
func (s *Server) Map() *shardmap.Map { return s.current.Load() }

// WatchMap returns the current map and a channel closed once a newer one
// is current: a reader that waits on it and reads again at once sees
// every map but those replaced within the moment it takes to wake.
func (s *Server) WatchMap() (*shardmap.Map, <-chan struct{}) {
	ch := s.changed.Load()
	return s.current.Load(), *ch
}

func (s *Server) setCurrent(m *shardmap.Map) {
	s.current.Store(m)
	ch := make(chan struct{})
	if old := s.changed.Swap(&ch); old != nil {
		close(*old)
	}
}

// Streams returns the registered streams, sorted by name.
func (s *Server) Streams() []shardmap.StreamConfig {
	m := s.Map()
	out := make([]shardmap.StreamConfig, len(m.Streams))
	for i, st := range m.Streams {
		out[i] = st.StreamConfig
	}
	return out
}

// CreateStream registers a stream, persists the registry and pushes the
// new map. Errors are *transport.Error values (CodeInvalid,
// CodeStreamExists, CodeLimitExceeded, CodeInternal) that also match
// ErrInvalid, ErrStreamExists, ErrLimitExceeded. On a follower the
// change is made by the leader.
func (s *Server) CreateStream(c shardmap.StreamConfig) error {
	return s.createStream(origin{principal: ctlPrincipal}, c)
}

func (s *Server) createStream(o origin, c shardmap.StreamConfig) error {
	req := &transport.Request{Op: OpStreamCreate, Stream: c, Principal: o.principal, ID: o.id}
	err := s.change("stream created", req, func(st *state) error { return st.createStream(c) })
	if err != nil {
		return err
	}
	s.log.Info("stream created", "stream", c.Name, "shards", c.Shards, "epoch", s.Map().Epoch)
	return nil
}

// DeleteStream removes a stream from the registry, persists it and pushes
// the new map. Errors are *transport.Error values (CodeUnknownStream,
// CodeInternal) that also match ErrUnknownStream.
func (s *Server) DeleteStream(name string) error {
	return s.deleteStream(origin{principal: ctlPrincipal}, name)
}

func (s *Server) deleteStream(o origin, name string) error {
	req := &transport.Request{Op: OpStreamDelete, Stream: shardmap.StreamConfig{Name: name}, Principal: o.principal, ID: o.id}
	err := s.change("stream deleted", req, func(st *state) error { return st.deleteStream(name) })
	if err != nil {
		return err
	}
	s.log.Info("stream deleted", "stream", name, "epoch", s.Map().Epoch)
	return nil
}

// Grant adds g to the policy, persists it and pushes the new map. Granting
// what is already granted succeeds and changes nothing.
func (s *Server) Grant(g auth.Grant) error { return s.grant(origin{principal: ctlPrincipal}, g) }

func (s *Server) grant(o origin, g auth.Grant) error {
	changed := false
	req := &transport.Request{Op: OpACLGrant, Grant: g, Principal: o.principal, ID: o.id}
	err := s.change("permission granted", req, func(st *state) (err error) {
		changed, err = st.grant(g)
		return err
	})
	if err == nil && changed {
		s.log.Info("permission granted", "principal", g.Principal, "action", g.Action, "pattern", g.Pattern, "epoch", s.Map().Epoch)
	}
	return err
}

// Revoke removes g from the policy, persists it and pushes the new map.
// Errors match ErrUnknownGrant when the policy does not hold g.
func (s *Server) Revoke(g auth.Grant) error { return s.revoke(origin{principal: ctlPrincipal}, g) }

func (s *Server) revoke(o origin, g auth.Grant) error {
	req := &transport.Request{Op: OpACLRevoke, Grant: g, Principal: o.principal, ID: o.id}
	err := s.change("permission revoked", req, func(st *state) error { return st.revoke(g) })
	if err == nil {
		s.log.Info("permission revoked", "principal", g.Principal, "action", g.Action, "pattern", g.Pattern, "epoch", s.Map().Epoch)
	}
	return err
}

// origin is who asks for an admin change: the principal it is authorized
// as, and the ID of its request (transport.Request.ID; "" for none).
type origin struct{ principal, id string }

// requestWhat describes the change fwd asks for, as an appliedRequest
// records it: a request sent again must describe the same change. Every
// field is named here, never formatted from a struct, so that a version
// that adds a field still describes a recorded request as the one before
// it did.
func requestWhat(fwd *transport.Request) string {
	what := fmt.Sprintf("%s principal=%q", fwd.Op, fwd.Principal)
	switch fwd.Op {
	case OpStreamCreate:
		c := fwd.Stream
		what += fmt.Sprintf(" stream=%q shards=%d replicas=%d retention_bytes=%d retention_age=%d", c.Name, c.Shards, c.Replicas, c.RetentionBytes, c.RetentionAge)
	case OpACLGrant, OpACLRevoke:
		what += fmt.Sprintf(" principal=%q action=%q pattern=%q", fwd.Grant.Principal, fwd.Grant.Action, fwd.Grant.Pattern)
	case OpClusterRemove:
		what += fmt.Sprintf(" node=%q", fwd.NodeID)
	default:
		what += fmt.Sprintf(" stream=%q", fwd.Stream.Name)
	}
	if mv := fwd.Move; mv != nil {
		what += fmt.Sprintf(" shard=%d from=%q to=%q id=%d", mv.Shard, mv.From, mv.To, mv.ID)
	}
	return what
}

// answerAgain answers fwd, a request whose change r was made already (its
// first answer lost, or not waited for): as the first answer did, with
// the broker a replica moved to, and without changing anything. The same
// ID with another request is refused. s.mu is held.
func (s *Server) answerAgain(reason string, fwd *transport.Request, what string, r appliedRequest) (*transport.Response, error) {
	if r.What != what {
		return nil, transport.Errorf(transport.CodeInvalid, "%s: request id %q names another change, made at epoch %d (%s)", reason, fwd.ID, r.Epoch, r.What)
	}
	s.log.Info("admin request sent again: answered as the first time, its change was made at epoch "+strconv.FormatUint(r.Epoch, 10),
		"op", fwd.Op, "id", fwd.ID, "principal", fwd.Principal)
	resp := &transport.Response{}
	if fwd.Move != nil {
		mv := *fwd.Move
		mv.To = r.Result
		resp.Moved = &mv
	}
	return resp, nil
}

// change applies an admin change (streams or policy), persists it, and
// pushes the map; if the state cannot be written the change is undone. A
// change that leaves the epoch as it was is neither persisted nor pushed.
//
// On a follower the change is not made here: fwd, the request that makes
// it, is forwarded to the leader, and change returns once this ctl holds
// the map the leader answered with.
func (s *Server) change(reason string, fwd *transport.Request, change func(*state) error) error {
	_, err := s.changeOrForward(reason, fwd, change)
	return err
}

// changeOrForward is change, and returns the leader's answer when the
// change was forwarded to it (nil when it was made here): for what only
// the leader knows, such as the broker it chose for a replica move.
func (s *Server) changeOrForward(reason string, fwd *transport.Request, change func(*state) error) (*transport.Response, error) {
	s.mu.Lock()
	if !s.mu.leader && !s.mu.closed {
		s.mu.Unlock()
		return s.forward(fwd)
	}
	defer s.mu.Unlock()
	if s.mu.closed {
		return nil, transport.Errorf(transport.CodeShuttingDown, "ctl is closed")
	}
	what := requestWhat(fwd)
	if fwd.ID != "" {
		if r, ok := s.mu.st.answered(fwd.ID); ok {
			return s.answerAgain(reason, fwd, what, r)
		}
	}
	cp := s.mu.st.checkpoint()
	if err := change(s.mu.st); err != nil {
		return nil, wireError(err)
	}
	if s.mu.st.epoch == cp.epoch {
		return nil, nil
	}
	// Every admin change comes here: one that would make the map too
	// large to push to the brokers is undone before it is committed.
	if err := s.mu.st.checkMapSize(cp.cur); err != nil {
		s.mu.st.rollback(cp)
		s.log.Warn("admin change refused: the map would be too large", "reason", reason, "principal", fwd.Principal, "err", err)
		return nil, wireError(err)
	}
	if fwd.ID != "" {
		r := appliedRequest{ID: fwd.ID, What: what}
		if fwd.Move != nil {
			r.Result = fwd.Move.To // the change closure's choice
		}
		s.mu.st.remember(r)
	}
	if err := s.store.save(s.ctx, s.mu.st.snapshot()); err != nil {
		epoch := s.mu.st.epoch
		s.mu.st.rollback(cp)
		if errors.Is(err, ErrConflict) {
			s.lostLeadershipLocked()
			return nil, transport.Errorf(transport.CodeUnavailable, "%s: this ctl lost its leadership; retry: %w", reason, err)
		}
		if errors.Is(err, errEtcdRefused) {
			// etcd answered that it did not apply the transaction: the
			// outcome is known, and nothing is in doubt.
			s.log.Warn("admin change refused by etcd", "reason", reason, "principal", fwd.Principal, "err", err)
			if errors.Is(err, rpctypes.ErrNoSpace) {
				return nil, transport.Errorf(transport.CodeLimitExceeded, "%s: %s: %w", reason, noSpaceAdvice(s.space.embedded), err)
			}
			return nil, transport.Errorf(transport.CodeLimitExceeded, "%s: not made: %w", reason, err)
		}
		s.store.giveUp(epoch)
		s.log.Error("admin change not committed: etcd did not answer, and it may have made it", "reason", reason, "err", err)
		return nil, transport.Errorf(transport.CodeUnavailable, "%s: not committed to etcd, and it may have been made (send it again with its request ID to learn which): %w", reason, err)
	}
	s.publishLocked(reason)
	return nil, nil
}

// commitLocked persists and pushes a liveness change already made to the
// state. A map is pushed only once etcd has committed it, so the brokers
// see one map history: if the write fails for another reason than a
// conflict (etcd slow or out of quorum), the change stays in the state,
// unpushed, and retryCommit tries again until it is committed, a later
// change's commit records it, or this ctl stops leading (the next leader
// re-reads the broker leases). s.mu must be held.
func (s *Server) commitLocked(reason string) {
	if err := s.store.save(s.ctx, s.mu.st.snapshot()); err != nil {
		switch {
		case s.ctx.Err() != nil:
			return // closing
		case errors.Is(err, ErrConflict):
			// Another leader wrote: this one's view is stale. Step down;
			// the new leader re-reads the broker leases.
			s.log.Warn("liveness change not committed: no longer the leader", "reason", reason, "err", err)
			s.lostLeadershipLocked()
			return
		}
		s.log.Error("liveness change not committed yet; the map is pushed once it is", "reason", reason, "err", err)
		if s.mu.unsaved != "" {
			reason = s.mu.unsaved + ", " + reason
		}
		s.mu.unsaved = reason
		if !s.mu.retrying {
			s.mu.retrying = true
			s.wg.Add(1)
			go s.retryCommit()
		}
		return
	}
	s.publishLocked(reason)
}

// retryCommit commits the state's unsaved liveness change, with backoff,
// and pushes its map. It ends once nothing is unsaved, this ctl no longer
// leads, or the server closes.
func (s *Server) retryCommit() {
	defer s.wg.Done()
	backoff := 100 * time.Millisecond
	for {
		select {
		case <-time.After(backoff):
		case <-s.ctx.Done():
			s.mu.Lock()
			s.mu.retrying = false
			s.mu.Unlock()
			return
		}
		backoff = min(2*backoff, 2*time.Second)
		s.mu.Lock()
		if s.mu.unsaved == "" || !s.mu.leader || s.mu.closed {
			s.mu.retrying = false
			s.mu.unsaved = ""
			s.mu.Unlock()
			return
		}
		reason := s.mu.unsaved
		s.mu.unsaved = ""
		s.mu.retrying = false
		s.commitLocked(reason) // restarts retryCommit if it fails again
		s.mu.Unlock()
		return
	}
}

// publishLocked makes the state's map current and hands it to every
// registered broker's writer. s.mu must be held.
func (s *Server) publishLocked(reason string) {
	s.mu.unsaved = "" // the map pushed is committed, with any change made before it
	m := s.mu.st.Map()
	s.setCurrent(m)
	for _, ss := range s.mu.sessions {
		ss.push(m)
	}
	s.log.Info("map pushed", "epoch", m.Epoch, "brokers", len(s.mu.sessions), "reason", reason, "live", s.mu.st.liveIDs())
}

// mapNotSent logs, at error level and once per epoch (not once per
// broker, nor per registration the brokers make again), that the map m
// could not be encoded for node's registration, whose writer then ends
// it. err is what the writer's Write returned; a write that failed
// (the stream's end, which the reader reports) is not logged.
// checkMapSize keeps admin changes from making such a map; only the
// changes it cannot refuse (members joining) could, past its margin.
func (s *Server) mapNotSent(node string, m *shardmap.Map, err error) {
	var te *transport.Error
	if !errors.As(err, &te) || (te.Code != transport.CodeFrameTooLarge && te.Code != transport.CodeInvalid) {
		return
	}
	for {
		last := s.unsendable.Load()
		if m.Epoch <= last {
			return
		}
		if s.unsendable.CompareAndSwap(last, m.Epoch) {
			break
		}
	}
	s.log.Error("map not sent: it does not encode in a map frame, so no broker can be sent it and each registration ends; revoke grants or delete streams",
		"epoch", m.Epoch, "node", node, "limit_bytes", mapFrameMax, "err", err)
}

// wireError turns a core error into the *transport.Error sent for it,
// keeping err for errors.Is on this side.
func wireError(err error) *transport.Error {
	var we *transport.Error
	switch {
	case errors.As(err, &we):
		return we
	case errors.Is(err, ErrStreamExists):
		return transport.Errorf(transport.CodeStreamExists, "%w", err)
	case errors.Is(err, ErrUnknownGrant):
		return transport.Errorf(transport.CodeInvalid, "%w", err)
	case errors.Is(err, ErrUnknownStream):
		return transport.Errorf(transport.CodeUnknownStream, "%w", err)
	case errors.Is(err, ErrTooFewMembers):
		return transport.Errorf(transport.CodeReplicationFactor, "%w", err)
	case errors.Is(err, ErrLimitExceeded):
		return transport.Errorf(transport.CodeLimitExceeded, "%w", err)
	case errors.Is(err, ErrInvalid):
		return transport.Errorf(transport.CodeInvalid, "%w", err)
	}
	return transport.Errorf(transport.CodeInternal, "%w", err)
}

// acceptLoop accepts connections until Close.
func (s *Server) acceptLoop() {
	defer s.wg.Done()
	for {
		conn, err := s.ln.Accept(s.ctx)
		if err != nil {
			if s.ctx.Err() == nil {
				s.log.Error("ctl accept failed; no longer accepting connections", "err", err)
			}
			return
		}
		s.wg.Add(1)
		go s.serveConn(conn)
	}
}

// serveConn accepts the streams of one connection, each served by its own
// goroutine, until the connection or the server closes. Only brokers
// (node certificates) and other ctls (ctl certificates) are served: a
// client certificate's connection is closed at once with
// CodeUnauthorized (see connRefusal).
func (s *Server) serveConn(conn *quic.Conn) {
	defer s.wg.Done()
	if alpn := conn.ConnectionState().TLS.NegotiatedProtocol; alpn != transport.ALPNCtl {
		s.log.Warn("connection refused: not the ctl protocol", "remote", conn.RemoteAddr().String(), "alpn", alpn)
		conn.CloseWithError(connCodeWrongProtocol, "this is the ctl endpoint: use ALPN "+transport.ALPNCtl)
		return
	}
	if err := connRefusal(conn); err != nil {
		if s.denials.First("\x00conn\x00" + err.Message) {
			s.log.Warn("connection refused", "remote", conn.RemoteAddr().String(), "err", err.Message)
		}
		conn.CloseWithError(quic.ApplicationErrorCode(err.Code), err.Message)
		return
	}
	defer func() {
		if s.ctx.Err() != nil {
			conn.CloseWithError(connCodeShuttingDown, "ctl shutting down")
		} else {
			conn.CloseWithError(0, "")
		}
	}()
	for {
		str, err := conn.AcceptStream(s.ctx)
		if err != nil {
			return
		}
		s.wg.Add(1)
		go s.serveStream(conn, str)
	}
}

// connRefusal returns why ctl refuses conn, nil if it serves it: it
// serves brokers (node certificates: registrations, and the admin
// requests they relay for their clients' principals) and other ctls (ctl
// certificates: forwarded changes). A client certificate is refused
// (CodeUnauthorized): no client or tool dials ctl (felixctl and the SDK
// make admin requests through a broker), and each stream a connection
// opens holds a goroutine and a read buffer until its first frame, for
// firstFrameTimeout, which brokers and ctls are trusted with and any
// holder of a client certificate is not.
func connRefusal(conn *quic.Conn) *transport.Error {
	id, err := transport.PeerIdentity(conn)
	if err != nil {
		var we *transport.Error
		if errors.As(err, &we) {
			return we
		}
		return transport.Errorf(transport.CodeUnauthorized, "%v", err)
	}
	switch id.Role {
	case transport.RoleNode, transport.RoleCtl:
		return nil
	}
	return transport.Errorf(transport.CodeUnauthorized,
		"ctl serves brokers and ctl members only, not a %s certificate (%q): make admin requests through a broker (felixctl, or the SDK's admin calls)", id.Role, id.Name)
}

// serveStream reads the first frame of a stream and dispatches on it: a
// Register makes it a registration stream, a Request an admin exchange.
// Anything else gets an Error and the stream is closed; the connection and
// its other streams are unaffected.
func (s *Server) serveStream(conn *quic.Conn, str *quic.Stream) {
	defer s.wg.Done()
	r := transport.NewReader(str, s.cfg.Transport.MaxFrame)
	w := transport.NewWriter(str)
	w.SetMaxFrame(mapFrameMax)
	str.SetReadDeadline(time.Now().Add(firstFrameTimeout))
	f, err := r.Read()
	str.SetReadDeadline(time.Time{})
	if err != nil {
		s.refuse(str, w, err)
		return
	}
	switch f := f.(type) {
	case *transport.Register:
		s.serveRegistration(conn, str, r, w, f)
	case *transport.Request:
		s.serveAdmin(conn, str, w, f)
	default:
		s.refuse(str, w, transport.Errorf(transport.CodeUnexpectedFrame, "a ctl stream must start with a register or request frame, not %v", f.Type()))
	}
}

// refuse answers a stream with an Error frame (if err is one a peer should
// see) and closes it.
func (s *Server) refuse(str *quic.Stream, w *transport.Writer, err error) {
	var we *transport.Error
	if errors.As(err, &we) {
		_ = w.Write(we)
		s.log.Debug("ctl stream refused", "stream", str.StreamID(), "err", err)
	}
	str.CancelRead(0)
	str.Close()
}

// Close stops listening, ends every registration and connection, and waits
// for every goroutine the server started. The state stays in etcd as last
// committed.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		// Cancel first: a goroutine holding s.mu across an etcd request
		// (takeOver, followState, resync) then returns at once instead of
		// when the request times out, which without an etcd quorum it
		// always does.
		s.cancel()
		s.mu.Lock()
		s.mu.closed = true
		ln := s.ln // a Start from now on closes its own
		s.mu.Unlock()
		if ln != nil {
			ln.StopAccepting()
		}
		s.wg.Wait() // every connection is closed
		s.fwd.close()
		if ln != nil {
			ln.Close() // and its socket
		}
		s.etcd.close()
		s.lock.Release()
		s.log.Info("ctl closed", "epoch", s.Map().Epoch)
	})
	return nil
}

// registered returns the ids of the nodes with a current registration
// stream, sorted.
func (s *Server) registered() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for id := range s.mu.sessions {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}
