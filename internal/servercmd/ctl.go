package servercmd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/felix-broker/felix/ctl"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/internal/msgtrace"
	"github.com/felix-broker/felix/transport"
)

// Ctl runs the control plane until SIGINT or SIGTERM.
type Ctl struct {
	Listen    string        `help:"QUIC address to listen on." default:"127.0.0.1:7000" env:"FELIX_LISTEN"`
	Advertise string        `help:"QUIC address other ctl members reach this one at (default: the bound address)." env:"FELIX_ADVERTISE"`
	Data      string        `help:"State directory." required:"" type:"path" env:"FELIX_DATA"`
	Certs     string        `help:"Directory with ca.crt and this member's certificate: NAME.crt/NAME.key for --etcd-name NAME when present, else ctl.crt/ctl.key; and crl.pem when certificates are revoked (see felix certs revoke; re-read when it changes). It also secures the embedded etcd's https:// URLs, and this ctl's connection to it." required:"" type:"existingdir" env:"FELIX_CERTS"`
	LeaseTTL  time.Duration `help:"Broker lease: a broker silent this long is marked down. Brokers registered with this ctl heartbeat by it, whatever their own --lease-ttl." default:"3s" env:"FELIX_LEASE_TTL"`
	Superuser []string      `help:"Client principal (certificate common name) authorized for everything, who grants the others their permissions (repeatable)." env:"FELIX_SUPERUSERS" placeholder:"NAME"`
	Admin     string        `help:"HTTP admin address serving /metrics, /healthz and /readyz (empty: none). It has no authentication: keep it on loopback or a network only operators and scrapers reach." default:"127.0.0.1:0" env:"FELIX_ADMIN"`
	Pprof     bool          `help:"Also serve /debug/pprof/ on the admin listener (it has no authentication: keep it on loopback or an operator network)." env:"FELIX_PPROF"`

	// Shard bound (see ctl.Config.MaxShardsTotal).
	MaxShardsTotal int `help:"Most shards of all streams together; a stream create past it is refused with limit_exceeded." default:"16384" env:"FELIX_MAX_SHARDS_TOTAL"`
	// Grant bound (see ctl.Config.MaxGrants).
	MaxGrants int `help:"Most ACL grants in the cluster (each is in the map sent to every broker); a grant past it is refused with limit_exceeded. Any admin change that would make that map over 60 MiB is refused too." default:"16384" env:"FELIX_MAX_GRANTS"`

	// Where the state lives (ctl.EtcdConfig).
	Etcd CtlEtcd `embed:"" prefix:"etcd-" group:"State store (etcd)"`
}

// CtlEtcd are the flags of ctl.EtcdConfig. With none, ctl runs a
// single-member etcd embedded in --data on loopback ports of its own.
type CtlEtcd struct {
	Endpoints []string `help:"Client URLs of an existing etcd cluster to keep the state in (no embedded etcd)." sep:"," env:"FELIX_ETCD_ENDPOINTS" placeholder:"URL,..."`
	CA        string   `help:"CA file verifying the etcd servers of --etcd-endpoints." type:"path" env:"FELIX_ETCD_CA"`
	Cert      string   `help:"Client certificate for --etcd-endpoints (mTLS)." type:"path" env:"FELIX_ETCD_CERT"`
	Key       string   `help:"Key of --etcd-cert." type:"path" env:"FELIX_ETCD_KEY"`
	Cluster   string   `help:"Felix cluster name: keys live under /felix/<name>/." default:"default" env:"FELIX_ETCD_CLUSTER"`

	Name           string        `help:"Name of this ctl and of its embedded etcd member (unique among the ctl members)." env:"FELIX_ETCD_NAME"`
	ClientURL      string        `help:"Where the embedded etcd serves clients: this ctl, the other ctls asking for its health, etcdctl with a ctl certificate. It must be https:// (unless --etcd-insecure), with --certs' certificate and CA, and serves ctl certificates only (default: https://127.0.0.1 on a free port, kept in --data)." env:"FELIX_ETCD_CLIENT_URL" placeholder:"URL"`
	PeerURL        string        `help:"Where the embedded etcd member is reached by its peers, e.g. https://ctl-0:2380: mutual TLS with --certs' certificate and CA, which must name this address (default: https://127.0.0.1 on a free port)." env:"FELIX_ETCD_PEER_URL" placeholder:"URL"`
	InitialCluster string        `help:"Every member of a new embedded etcd cluster as name=peerURL,... (etcd's --initial-cluster); the same on every ctl. With more than one member, every peer URL must be https://. Once the member has data, the start is refused unless this names the members it has (a running control plane cannot grow). Default: this member alone." env:"FELIX_ETCD_INITIAL_CLUSTER" placeholder:"NAME=URL,..."`
	Insecure       bool          `help:"Allow http:// URLs for the embedded etcd (give them with --etcd-client-url and --etcd-peer-url; the default URLs stay https://). Refused by default because that etcd traffic carries all of ctl's state unencrypted and unauthenticated: whoever reaches the ports, on loopback any local user, can read and rewrite streams, placement and permissions, or join as a member. Only for a host and network nothing else shares." env:"FELIX_ETCD_INSECURE"`
	ElectionMs     uint          `help:"etcd election timeout in ms for a multi-member embedded cluster (heartbeat: a tenth). Default etcd's 1000." env:"FELIX_ETCD_ELECTION_MS"`
	StartTimeout   time.Duration `help:"How long the embedded etcd member may take to be ready (with several members: to find a quorum) before felix ctl gives up and exits 1; 0 waits as long as it takes (better under a supervisor whose restarts back off ever longer, as Kubernetes')." default:"60s" env:"FELIX_ETCD_START_TIMEOUT"`
}

// config returns the ctl.EtcdConfig of the flags.
func (e CtlEtcd) config() (ctl.EtcdConfig, error) {
	c := ctl.EtcdConfig{Endpoints: e.Endpoints, Cluster: e.Cluster, Name: e.Name, ClientURL: e.ClientURL,
		PeerURL: e.PeerURL, InitialCluster: e.InitialCluster, Insecure: e.Insecure}
	if e.ElectionMs > 0 {
		c.ElectionMs, c.TickMs = e.ElectionMs, max(1, e.ElectionMs/10)
	}
	c.StartTimeout = e.StartTimeout
	if e.StartTimeout == 0 {
		c.StartTimeout = -1 // as long as it takes
	}
	if e.CA == "" && e.Cert == "" {
		return c, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if e.CA != "" {
		pem, err := os.ReadFile(e.CA)
		if err != nil {
			return c, fmt.Errorf("--etcd-ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return c, fmt.Errorf("--etcd-ca %s: no certificate found", e.CA)
		}
	}
	if e.Cert != "" {
		pair, err := tls.LoadX509KeyPair(e.Cert, e.Key)
		if err != nil {
			return c, fmt.Errorf("--etcd-cert/--etcd-key: %w", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	c.TLS = tc
	return c, nil
}

func (c *Ctl) Run(log *slog.Logger) error {
	tlsConf, err := cluster.LoadCtlTLS(c.Certs, c.Etcd.Name)
	if err != nil {
		return err
	}
	crl, err := cluster.WatchCRL(c.Certs, log)
	if err != nil {
		return err
	}
	defer crl.Close()
	sw := watchShutdown(log, "ctl")
	defer sw.end()
	var started atomic.Pointer[ctl.Server]
	obs, err := startObservability("felix-ctl", "ctl", c.Admin, c.Pprof, func() error {
		s := started.Load()
		if s == nil {
			return errors.New("control plane starting")
		}
		return s.Readiness() // not while cut off from etcd's quorum
	}, log)
	if err != nil {
		return err
	}
	defer obs.close()
	if len(c.Superuser) == 0 {
		log.Warn("no --superuser: no principal can grant permissions until one is configured")
	}
	ec, err := c.Etcd.config()
	if err != nil {
		return err
	}
	// The embedded member's https:// URLs use this ctl's certificate and
	// the cluster CA.
	ec.CertFile, ec.KeyFile = cluster.CtlCertFiles(c.Certs, c.Etcd.Name)
	ec.CAFile = filepath.Join(c.Certs, "ca.crt")
	rtt, err := etcdRoundTrips(obs.prov.Meter)
	if err != nil {
		return err
	}
	s, err := ctl.New(ctl.Config{Addr: c.Listen, Advertise: c.Advertise, DataDir: c.Data, TLS: tlsConf, Transport: transport.Config{Revocations: crl}, LeaseTTL: c.LeaseTTL,
		Superusers: c.Superuser, MaxShardsTotal: c.MaxShardsTotal, MaxGrants: c.MaxGrants, Etcd: ec, Name: c.Etcd.Name, OnEtcdRoundTrip: rtt, Logger: log})
	if err != nil {
		return err
	}
	if err := s.Start(); err != nil {
		s.Close() // New started the embedded etcd and took the data directory
		return err
	}
	started.Store(s)
	reg, err := ctlMetrics(obs.prov.Meter, s)
	if err != nil {
		s.Close()
		return err
	}
	defer reg.Unregister()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	sw.begin(stop)
	return s.Close()
}

// etcdRoundTrips returns the hook recording felix_ctl_etcd_duration_seconds
// (by op) for every etcd request of the control plane.
func etcdRoundTrips(mp metric.MeterProvider) (func(string, time.Duration), error) {
	h, err := mp.Meter(msgtrace.ScopeName).Float64Histogram("felix.ctl.etcd.duration", metric.WithUnit("s"),
		metric.WithDescription("Round trip of the control plane's etcd requests, by op (load, commit, live, keepalive)."))
	if err != nil {
		return nil, err
	}
	return func(op string, d time.Duration) {
		h.Record(context.Background(), d.Seconds(), metric.WithAttributes(attribute.String("op", op)))
	}, nil
}

// ctlMetrics exposes the control plane's map: felix_map_epoch and
// felix_brokers{state="live"|"down"}; and its leadership:
// felix_ctl_leader (1 on the leader), felix_ctl_leader_changes and
// felix_ctl_lease_expiries.
func ctlMetrics(mp metric.MeterProvider, s *ctl.Server) (metric.Registration, error) {
	m := mp.Meter(msgtrace.ScopeName)
	epoch, err := m.Int64ObservableGauge("felix.map.epoch",
		metric.WithDescription("Epoch of the current shard map."))
	if err != nil {
		return nil, err
	}
	brokers, err := m.Int64ObservableGauge("felix.brokers", metric.WithUnit("{broker}"),
		metric.WithDescription("Member brokers, by state (live: lease current; down)."))
	if err != nil {
		return nil, err
	}
	leader, err := m.Int64ObservableGauge("felix.ctl.leader",
		metric.WithDescription("1 when this ctl is the elected leader, else 0."))
	if err != nil {
		return nil, err
	}
	changes, err := m.Int64ObservableCounter("felix.ctl.leader.changes",
		metric.WithDescription("Times this ctl became or stopped being the leader."))
	if err != nil {
		return nil, err
	}
	expiries, err := m.Int64ObservableCounter("felix.ctl.lease.expiries", metric.WithUnit("{lease}"),
		metric.WithDescription("Broker leases that ran out (a broker silent for the lease TTL)."))
	if err != nil {
		return nil, err
	}
	live := metric.WithAttributeSet(attribute.NewSet(attribute.String("state", "live")))
	down := metric.WithAttributeSet(attribute.NewSet(attribute.String("state", "down")))
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		mp := s.Map()
		if mp == nil {
			return nil
		}
		o.ObserveInt64(epoch, int64(mp.Epoch))
		var up, dn int64
		for _, n := range mp.Nodes {
			if n.Live {
				up++
			} else {
				dn++
			}
		}
		o.ObserveInt64(brokers, up, live)
		o.ObserveInt64(brokers, dn, down)
		st := s.Stats()
		isLeader := int64(0)
		if st.Leader {
			isLeader = 1
		}
		o.ObserveInt64(leader, isLeader)
		o.ObserveInt64(changes, st.LeaderChanges)
		o.ObserveInt64(expiries, st.LeaseExpiries)
		return nil
	}, epoch, brokers, leader, changes, expiries)
}
