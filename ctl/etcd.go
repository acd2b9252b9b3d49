package ctl

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/membership"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/felix-broker/felix/internal/freeport"
	"github.com/felix-broker/felix/transport"
)

// EtcdConfig says where ctl keeps its state. With no Endpoints, ctl runs
// an embedded etcd member in DataDir/etcd (a single-member cluster unless
// InitialCluster names more members); with Endpoints, it uses that
// existing etcd cluster and runs none of its own.
type EtcdConfig struct {
	// Endpoints are the client URLs of an existing etcd cluster
	// ("https://10.0.0.1:2379"). Empty: embedded etcd.
	Endpoints []string
	// TLS is the client TLS config for Endpoints (mTLS to etcd); nil
	// means plaintext. Ignored for the embedded etcd, which ctl reaches
	// with CertFile, KeyFile and CAFile.
	TLS *tls.Config
	// Cluster names the Felix cluster: its keys live under
	// /felix/<Cluster>/, so several clusters may share one etcd. Default
	// "default".
	Cluster string

	// The embedded member (Endpoints empty):

	// Name is the embedded member's name. Default "ctl".
	Name string
	// ClientURL is where the embedded member serves etcd clients (this
	// ctl, the other ctls asking for its health, and etcdctl for an
	// operator, each with a ctl certificate); a host name in it is
	// listened on as 0.0.0.0. Default https://127.0.0.1 on a free port,
	// chosen on first start and kept in DataDir/etcd-urls.json (a
	// plaintext URL kept there by an earlier version is taken as https
	// unless Insecure).
	ClientURL string
	// PeerURL is where the embedded member listens for and is reached by
	// its peers. Default https://127.0.0.1 on a free port, chosen and
	// kept as ClientURL (a single member has no peers to reach it).
	PeerURL string
	// Revocations is the cluster's certificate revocation list (see
	// transport.WatchCRL): the embedded member refuses every request
	// from a ctl certificate it lists, on its client port, checked per
	// request (a connection made before the revocation included). Nil:
	// Config.Transport.Revocations. Its peer port (the other members)
	// checks certificates at their handshake only, against no list.
	Revocations *transport.Revocations
	// InitialCluster lists every member of a new embedded cluster as
	// name=peerURL,... (etcd's --initial-cluster). Default Name=PeerURL:
	// a single-member cluster. A member with data keeps the membership
	// it has (etcd reads the initial cluster only to create a cluster):
	// given then, InitialCluster must name that membership, the same
	// names and peer URLs, or the start is refused (errMembership). A
	// member is only ever started as one of a new cluster, never added
	// to a running one: a control plane cannot grow in place.
	InitialCluster string
	// InitialClusterToken tells clusters apart on first start. Default
	// "felix-<Cluster>".
	InitialClusterToken string
	// StartTimeout bounds the wait for the embedded member to be ready
	// (for a multi-member cluster: to find a quorum). Default 60s;
	// negative: as long as it takes.
	StartTimeout time.Duration
	// CertFile, KeyFile and CAFile are the ctl's own certificate (role
	// felix-ctl) and key and the cluster CA, as PEM files (etcd reads them
	// itself, at every handshake). They secure the embedded member's
	// https:// peer and client URLs, and ctl's own connection to it: see
	// etcdtls.go. Required for the embedded member, whose URLs are https
	// unless Insecure and given as http://.
	CertFile, KeyFile, CAFile string
	// Insecure allows http:// URLs for the embedded member: on loopback,
	// a client port any local user can read and rewrite the state on
	// (etcd's authentication is off: ctl's certificate is its only
	// credential); off loopback or between members, traffic anyone on
	// the network can read, and a member port anyone can join. Default
	// false: refused.
	Insecure bool
	// TickMs and ElectionMs are etcd's heartbeat interval and election
	// timeout. Default 100 and 1000 (etcd's defaults) for a member of a
	// cluster, 10 and 100 for a single member (which elects itself at
	// start only); a lower election timeout shortens failover of the
	// etcd leader.
	TickMs, ElectionMs uint

	// quotaBytes is the embedded member's backend quota, from
	// Knobs.EtcdQuotaBytes; 0: etcd's default.
	quotaBytes int64
	// standalone is set for a member with no ctl beside it
	// (StartEtcdMember): its default URLs are http:// on loopback, and
	// plaintext loopback URLs are allowed, as its clients are its
	// operator's to secure.
	standalone bool
}

// DefaultCluster is the default EtcdConfig.Cluster.
const DefaultCluster = "default"

// etcdURLsFile records the embedded member's URLs in DataDir, so a
// restart listens where its peers and its data expect it.
const etcdURLsFile = "etcd-urls.json"

type etcdURLs struct {
	Client string `json:"client"`
	Peer   string `json:"peer"`
}

// etcdOpTimeout bounds one etcd request of the control plane.
const etcdOpTimeout = 5 * time.Second

// maxEtcdRequest bounds one etcd request: the embedded member's
// MaxRequestBytes and the client's send limit (an external etcd keeps
// its own, 1.5 MiB by default).
const maxEtcdRequest = 10 << 20

// etcdConn is ctl's connection to its etcd, and the embedded member when
// ctl runs one.
type etcdConn struct {
	cli      *clientv3.Client
	embedded *embed.Etcd // nil with Config.Etcd.Endpoints
	quiet    *atomic.Bool
	// clientURL is where the embedded member serves clients ("" with
	// Endpoints).
	clientURL string
}

// close closes the client and stops the embedded member, whose logs stop
// first (its shutdown is loud about listeners it closes on purpose).
func (c *etcdConn) close() {
	c.quiet.Store(true)
	c.cli.Close()
	if c.embedded != nil {
		stopEmbedded(c.embedded)
	}
}

// stopEmbedded stops an embedded etcd member. A leader first hands its
// leadership to another voting member, as etcd's own Close does, so the
// others need not wait an election timeout; but for one election timeout
// at most, where etcd's Close waits up to its request timeout (5 s and two
// election timeouts). When every member stops at once, as when a whole
// control plane is restarted, no member can take the leadership, and that
// wait alone took 7 s of docker stop's 10 s grace here. Stopped hard after
// that, the server's Close skips its own transfer: its peers' connections
// are closed by then.
func stopEmbedded(e *embed.Etcd) {
	s := e.Server
	if self := s.MemberID(); s.Leader() == self {
		ctx, cancel := context.WithTimeout(context.Background(), s.Cfg.ElectionTimeout())
		for _, m := range s.Cluster().Members() {
			if m.ID != self && !m.IsLearner && s.MoveLeader(ctx, uint64(self), uint64(m.ID)) == nil {
				break
			}
		}
		cancel()
	}
	s.HardStop()
	e.Close()
}

// openEtcd connects to the etcd of cfg: an existing cluster, or an
// embedded member it starts first.
//
// ctx is the client's own context (clientv3.Config.Context), which the
// server cancels first thing in Close. etcd's concurrency package makes
// its clean-up requests with it: a Campaign whose context is canceled
// resigns with client.Ctx(), which has no deadline, and the client retries
// that write up to 100 times, each for etcd's request timeout (over 5s),
// when etcd has no quorum, as when the last ctl of a cluster closes: nine
// minutes in Close. Canceled, the clean-up gives up at once; the election
// key it would have deleted goes with its session's lease.
func openEtcd(ctx context.Context, cfg Config, log *slog.Logger) (*etcdConn, error) {
	ec := cfg.Etcd
	if ec.Revocations == nil {
		ec.Revocations = cfg.Transport.Revocations
	}
	ec.quotaBytes = cfg.Knobs.EtcdQuotaBytes
	c := &etcdConn{quiet: new(atomic.Bool)}
	if len(ec.Endpoints) > 0 {
		cli, err := clientv3.New(clientv3.Config{
			Context:            ctx,
			Endpoints:          ec.Endpoints,
			TLS:                ec.TLS,
			DialTimeout:        etcdOpTimeout,
			MaxCallSendMsgSize: maxEtcdRequest,
			Logger:             zap.New(slogCore{log: log.With("component", "etcd-client"), quiet: c.quiet}),
		})
		if err != nil {
			return nil, fmt.Errorf("ctl: connect to etcd %s: %w", strings.Join(ec.Endpoints, ","), err)
		}
		c.cli = cli
		return c, nil
	}
	e, clientTLS, err := startEmbedded(cfg.DataDir, ec, slogCore{log: log.With("component", "etcd"), quiet: c.quiet}, log)
	if err != nil {
		return nil, err
	}
	c.embedded, c.clientURL = e, e.Config().AdvertiseClientUrls[0].String()
	c.cli, err = clientv3.New(clientv3.Config{
		Context:            ctx,
		Endpoints:          []string{c.clientURL},
		TLS:                clientTLS,
		DialTimeout:        etcdOpTimeout,
		MaxCallSendMsgSize: maxEtcdRequest,
		Logger:             zap.NewNop(),
	})
	if err != nil {
		c.quiet.Store(true)
		e.Close()
		return nil, fmt.Errorf("ctl: connect to embedded etcd: %w", err)
	}
	return c, nil
}

// startEmbedded starts the embedded etcd member of dir and waits until it
// serves. It returns the client TLS config to reach it with (nil when its
// client URL is http).
func startEmbedded(dir string, ec EtcdConfig, core slogCore, log *slog.Logger) (*embed.Etcd, *tls.Config, error) {
	urls, err := embeddedURLs(dir, ec)
	if err != nil {
		return nil, nil, err
	}
	if err := checkPlaintext(ec, urls); err != nil {
		return nil, nil, err
	}
	cu, err := url.Parse(urls.Client)
	if err != nil {
		return nil, nil, fmt.Errorf("ctl: etcd client url %q: %w", urls.Client, err)
	}
	pu, err := url.Parse(urls.Peer)
	if err != nil {
		return nil, nil, fmt.Errorf("ctl: etcd peer url %q: %w", urls.Peer, err)
	}
	name := ec.Name
	if name == "" {
		name = "ctl"
	}
	c := embed.NewConfig()
	c.Name = name
	c.Dir = filepath.Join(dir, "etcd")
	c.ListenClientUrls, c.AdvertiseClientUrls = []url.URL{listenURL(*cu)}, []url.URL{*cu}
	c.ListenPeerUrls, c.AdvertisePeerUrls = []url.URL{listenURL(*pu)}, []url.URL{*pu}
	c.InitialCluster = ec.InitialCluster
	if c.InitialCluster == "" {
		c.InitialCluster = name + "=" + pu.String()
	}
	c.InitialClusterToken = ec.InitialClusterToken
	if c.InitialClusterToken == "" {
		c.InitialClusterToken = "felix-" + clusterName(ec)
	}
	if ec.InitialCluster == "" {
		// A single member has no peer to hear its heartbeats or to race
		// in an election: short ticks only make it elect itself, at
		// every start, in tens of milliseconds instead of half a second.
		c.TickMs, c.ElectionMs = 10, 100
	}
	if ec.TickMs > 0 {
		c.TickMs = ec.TickMs
	}
	if ec.ElectionMs > 0 {
		c.ElectionMs = ec.ElectionMs
	}
	// Keep an hour of history for watches and CAS, compacting hourly.
	c.AutoCompactionMode = embed.CompactorModePeriodic
	c.AutoCompactionRetention = "1h"
	// Importing a large state file puts every stream in one transaction
	// (the client's send limit is raised to match, see openEtcd); 10 MiB
	// is the most etcd recommends.
	c.MaxTxnOps = 1 << 16
	c.MaxRequestBytes = maxEtcdRequest
	// etcd's quota (2 GiB by default) bounds the database file, which
	// only a defragmentation shrinks: ctl keeps it so (etcdspace.go).
	c.QuotaBackendBytes = ec.quotaBytes
	c.Metrics = "basic"
	lg := zap.New(core)
	c.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	clientTLS, err := secureEmbedded(c, ec, lg)
	if err != nil {
		return nil, nil, err
	}
	existed := wal.Exist(filepath.Join(c.Dir, "member", "wal"))
	e, err := embed.StartEtcd(c)
	if err != nil {
		err = fmt.Errorf("ctl: start embedded etcd in %s (client %s, peer %s): %w", c.Dir, cu, pu, err)
		if errors.Is(err, syscall.EADDRINUSE) {
			err = fmt.Errorf("%w (the ports unless set are those kept in %s since the first start: free the one taken)", err, filepath.Join(dir, etcdURLsFile))
		}
		return nil, nil, err
	}
	if existed && ec.InitialCluster != "" {
		if err := checkMembership(c.Dir, e.Server.Cluster().Members(), ec.InitialCluster); err != nil {
			core.quiet.Store(true)
			e.Server.HardStop()
			e.Close()
			return nil, nil, err
		}
	}
	timeout := ec.StartTimeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	var expired <-chan time.Time // nil: no end to the wait
	if timeout > 0 {
		expired = time.After(timeout)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		core.quiet.Store(true)
		e.Close()
		return nil, nil, fmt.Errorf("ctl: embedded etcd in %s: %w", c.Dir, err)
	case <-expired:
		core.quiet.Store(true)
		e.Server.Stop()
		e.Close()
		return nil, nil, fmt.Errorf("ctl: embedded etcd in %s not ready within %v (initial cluster %s: are a majority of its members up and reachable?)", c.Dir, timeout, c.InitialCluster)
	}
	log.Info("embedded etcd ready", "name", name, "client", cu.String(), "peer", pu.String(), "dir", c.Dir)
	return e, clientTLS, nil
}

// errMembership is the error of a member whose data belongs to another
// etcd cluster than its initial cluster names.
var errMembership = errors.New("ctl: embedded etcd data of another cluster than the initial cluster")

// checkMembership refuses a member that restarts on data (in dir) of
// another etcd cluster than initial names. etcd uses the initial cluster
// only to create a new cluster, and ignores it once its member has data:
// a ctl that ran alone and is restarted as one of three would stay a
// one-member cluster of its own with the old state, while the other two,
// starting empty, formed a new cluster with a quorum of their own; two
// control planes, each electing a leader. members are the member's
// stored membership; names are compared where known (a member that never
// started has none).
func checkMembership(dir string, members []*membership.Member, initial string) error {
	want, err := types.NewURLsMap(initial)
	if err != nil {
		return fmt.Errorf("ctl: etcd initial cluster %q: %w", initial, err)
	}
	byURLs := map[string]string{} // peer URLs -> name, as initial lists them
	for name, urls := range want {
		byURLs[urls.String()] = name
	}
	same := len(members) == len(want)
	stored := make([]string, 0, len(members))
	for _, m := range members {
		urls, err := types.NewURLs(m.PeerURLs)
		if err != nil {
			return fmt.Errorf("ctl: embedded etcd in %s: member %s has peer URLs %v: %w", dir, m.ID, m.PeerURLs, err)
		}
		name := m.Name
		if name == "" {
			name = "(never started, id " + m.ID.String() + ")"
		}
		for _, u := range urls {
			stored = append(stored, name+"="+u.String())
		}
		if w, ok := byURLs[urls.String()]; !ok || m.Name != "" && m.Name != w {
			same = false
		}
	}
	if same {
		return nil
	}
	slices.Sort(stored)
	return fmt.Errorf("%w: %s holds a member of an etcd cluster of %d member(s) (%s), not of the initial cluster given (%s). "+
		"etcd ignores the initial cluster once a member has data: this member would stay in its old cluster while members starting empty formed another, each with a Felix leader. "+
		"Start it with the initial cluster it was created with, or with none. "+
		"A running control plane cannot grow: felix ctl has no way to add a member to a running etcd cluster (etcd member add, initial cluster state existing); "+
		"see \"The control plane's etcd\" in deploy/README.md. "+
		"Ctls that started empty with this initial cluster formed a new, empty cluster: stop them and empty their data directories",
		errMembership, dir, len(members), strings.Join(stored, ","), want.String())
}

// listenURL is u with its host replaced by an address when the host is a
// name (etcd listens on IP addresses only): localhost listens on
// 127.0.0.1, and any other name on the wildcard address: a member
// advertised as https://ctl-0:2380 listens on https://0.0.0.0:2380. Its
// URLs are https unless EtcdConfig.Insecure (etcdtls.go).
func listenURL(u url.URL) url.URL {
	switch host := u.Hostname(); {
	case net.ParseIP(host) != nil:
	case loopbackHost(host):
		u.Host = net.JoinHostPort("127.0.0.1", u.Port())
	default:
		u.Host = net.JoinHostPort("0.0.0.0", u.Port())
	}
	return u
}

// embeddedURLs returns the embedded member's URLs: those configured, else
// those recorded in dir by an earlier start, else free loopback ports
// (recorded for the next start), https unless ec.standalone. A recorded
// http:// loopback URL (the default of earlier versions) is taken as
// https:// on the same port, unless ec.Insecure or ec.standalone allow
// it as it is.
func embeddedURLs(dir string, ec EtcdConfig) (etcdURLs, error) {
	path := filepath.Join(dir, etcdURLsFile)
	var rec etcdURLs
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &rec); err != nil {
			return rec, fmt.Errorf("ctl: read %s: %w", path, err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return rec, fmt.Errorf("ctl: read %s: %w", path, err)
	}
	urls := etcdURLs{Client: ec.ClientURL, Peer: ec.PeerURL}
	var missing []*string
	for _, u := range []struct {
		dst *string
		rec string
	}{{&urls.Client, rec.Client}, {&urls.Peer, rec.Peer}} {
		switch {
		case *u.dst != "":
		case u.rec != "":
			*u.dst = u.rec
			if !ec.Insecure && !ec.standalone {
				*u.dst = upgradeLoopback(u.rec)
			}
		default:
			missing = append(missing, u.dst)
		}
	}
	ports, err := freeTCPPorts(len(missing))
	if err != nil {
		return urls, err
	}
	scheme := "https://"
	if ec.standalone {
		scheme = "http://"
	}
	for i, dst := range missing {
		*dst = scheme + "127.0.0.1:" + strconv.Itoa(ports[i])
	}
	if urls != rec {
		b, _ := json.Marshal(urls)
		if err := writeFileAtomic(path, append(b, '\n')); err != nil {
			return urls, fmt.Errorf("ctl: record etcd urls: %w", err)
		}
	}
	return urls, nil
}

// upgradeLoopback returns raw, a recorded URL, as https:// when it is an
// http:// loopback URL, as earlier versions chose by default; any other
// URL as it is.
func upgradeLoopback(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" || !loopbackHost(u.Hostname()) {
		return raw
	}
	u.Scheme = "https"
	return u.String()
}

// freeTCPPorts returns n distinct free loopback ports, below the
// kernel's ephemeral range (see package freeport): they are recorded and
// listened on again at every start, and one of that range could be
// taken meanwhile by any outgoing connection (felix dev killed -9 once
// failed to start again so, its etcd client port taken).
func freeTCPPorts(n int) ([]int, error) {
	ports, err := freeport.TCP("127.0.0.1", n)
	if err != nil {
		return nil, fmt.Errorf("ctl: a port for etcd: %w", err)
	}
	return ports, nil
}

func clusterName(ec EtcdConfig) string {
	if ec.Cluster == "" {
		return DefaultCluster
	}
	return ec.Cluster
}

// etcdNoise are warnings the embedded etcd logs at every start that say
// nothing a Felix operator can act on: they describe how ctl embeds it
// (client gRPC and HTTP on one port, no etcd authentication: only
// holders of a ctl certificate talk to it), and, on a new data dir, the
// schema version it sets a moment later. slogCore logs them at Debug.
var etcdNoise = map[string]bool{
	"Running http and grpc server on single port. This is not recommended for production.": true,
	"simple token is not cryptographically signed":                                         true,
	"Failed to detect schema version":                                                      true,
	"failed to update storage version":                                                     true,
}

// slogCore is a zap core writing etcd's warnings and errors to slog, and
// its info at Debug (etcd's debug, one line per raft step, is dropped).
// Once quiet, it drops everything.
type slogCore struct {
	log    *slog.Logger
	quiet  *atomic.Bool
	fields []zapcore.Field
}

func (c slogCore) Enabled(l zapcore.Level) bool {
	return l >= zapcore.InfoLevel && !c.quiet.Load() && c.log.Enabled(context.Background(), slogLevel(l))
}

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l >= zapcore.ErrorLevel:
		return slog.LevelError
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

func (c slogCore) With(fs []zapcore.Field) zapcore.Core {
	return slogCore{log: c.log, quiet: c.quiet, fields: append(c.fields[:len(c.fields):len(c.fields)], fs...)}
}

func (c slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if etcdNoise[e.Message] && e.Level > zapcore.InfoLevel {
		e.Level = zapcore.InfoLevel // logged at Debug
	}
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c slogCore) Write(e zapcore.Entry, fs []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fs {
		f.AddTo(enc)
	}
	args := make([]any, 0, 2*len(enc.Fields))
	for k, v := range enc.Fields {
		args = append(args, k, v)
	}
	c.log.Log(context.Background(), slogLevel(e.Level), e.Message, args...)
	return nil
}

func (c slogCore) Sync() error { return nil }
