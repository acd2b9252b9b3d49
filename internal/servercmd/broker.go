package servercmd

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/felix-broker/felix/broker"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/transport"
)

// Broker runs one broker until SIGINT or SIGTERM, then shuts it down
// gracefully.
type Broker struct {
	ID        string        `help:"Node id of this broker (must match its certificate)." required:"" env:"FELIX_NODE_ID"`
	Listen    string        `help:"QUIC address to listen on." default:"127.0.0.1:7100" env:"FELIX_LISTEN"`
	Advertise string        `help:"Address clients and peers use to reach this broker (default: the bound address)." env:"FELIX_ADVERTISE"`
	Ctl       string        `help:"Control plane QUIC address; several, comma-separated, for a control plane of several members (any will do)." default:"127.0.0.1:7000" env:"FELIX_CTL"`
	Data      string        `help:"Data directory for the shard logs." required:"" type:"path" env:"FELIX_DATA"`
	Certs     string        `help:"Directory with ca.crt and <id>.crt/<id>.key, and crl.pem when certificates are revoked (see felix certs revoke; re-read when it changes)." required:"" type:"existingdir" env:"FELIX_CERTS"`
	LeaseTTL  time.Duration `help:"Control plane lease, until the control plane says its own: the broker then goes by that one, with a warning if it differs. Set it as felix ctl's --lease-ttl." default:"3s" env:"FELIX_LEASE_TTL"`
	Admin     string        `help:"HTTP admin address serving /metrics, /healthz and /readyz, registered in the shard map (empty: none). It has no authentication, and /metrics names streams (stream names, per-shard sizes and offsets: --shard-metrics) and peer brokers: keep it on loopback or a network only operators and scrapers reach." default:"127.0.0.1:0" env:"FELIX_ADMIN"`
	// ReadyReplicaWait is broker.Config.ReadyReplicaWait.
	ReadyReplicaWait time.Duration `help:"Longest /readyz waits after start for this broker's replicas of replicated shards to catch up with their leaders (a rolling restart waits for /readyz before stopping the next broker); 0: the default (2m); negative: /readyz does not wait for them. /readyz/replicas answers 200 only while none is leaderless or behind, at any time." default:"0s" env:"FELIX_READY_REPLICA_WAIT"`
	Pprof            bool          `help:"Also serve /debug/pprof/ on the admin listener (it has no authentication: keep it on loopback or an operator network)." env:"FELIX_PPROF"`
	// AdminAdvertise is to --admin what --advertise is to --listen.
	AdminAdvertise string `help:"Admin address registered in the shard map, for felixctl cluster stats and scrapers outside this host's network (a port published on the host, say) (default: the bound admin address, an unspecified host replaced by --advertise's)." env:"FELIX_ADMIN_ADVERTISE"`
	ShardMetrics   int    `help:"Most shards the per-shard gauges (felix_shard_log_size_bytes, felix_shard_next_offset, felix_shard_records: three series per owned shard, labelled stream and shard) report, the first in stream and shard order; -1: none." default:"1024" env:"FELIX_SHARD_METRICS"`

	// Client resource limits (limits.go).
	Limits BrokerLimits `embed:"" group:"Client limits"`

	// Shard log bounds (shards.go).
	Shards BrokerShards `embed:"" group:"Shard logs"`

	// Idempotent publish bounds (producers.go).
	Producers BrokerProducers `embed:"" group:"Idempotent producers"`
}

func (c *Broker) Run(log *slog.Logger) error {
	tlsConf, err := cluster.LoadNodeTLS(c.Certs, c.ID)
	if err != nil {
		return err
	}
	crl, err := cluster.WatchCRL(c.Certs, log)
	if err != nil {
		return err
	}
	defer crl.Close()
	sw := watchShutdown(log, "broker")
	defer sw.end()
	var started atomic.Pointer[broker.Broker]
	obs, err := startObservabilityWith("felix-broker", c.ID, c.Admin, c.Pprof, func() error {
		if b := started.Load(); b != nil {
			return b.Readiness()
		}
		return fmt.Errorf("%w: starting", broker.ErrNotReady)
	}, map[string]http.Handler{"GET /readyz/replicas": replicasHandler(&started)}, log)
	if err != nil {
		return err
	}
	defer obs.close()
	host := hostOf(c.Advertise)
	if host == "" {
		host = hostOf(c.Listen)
	}
	adminAddr := obs.adminAdvertise(host)
	if c.AdminAdvertise != "" && adminAddr != "" {
		adminAddr = c.AdminAdvertise
	}
	var mp metric.MeterProvider // nil: the broker takes no timestamps for metrics
	if obs.prov.Metrics {
		mp = obs.prov.Meter
	}
	b, err := broker.New(c.Producers.apply(c.Shards.apply(c.Limits.apply(broker.Config{
		NodeID:           c.ID,
		Listen:           c.Listen,
		Advertise:        c.Advertise,
		Admin:            adminAddr,
		DataDir:          c.Data,
		ServerTLS:        tlsConf.Server,
		PeerTLS:          tlsConf.Peer,
		Transport:        transport.Config{Revocations: crl},
		CtlAddr:          c.Ctl,
		CtlTLS:           tlsConf.Ctl,
		LeaseTTL:         c.LeaseTTL,
		Logger:           log,
		TracerProvider:   obs.prov.Tracer,
		MeterProvider:    mp,
		ShardMetrics:     c.ShardMetrics,
		ReadyReplicaWait: c.ReadyReplicaWait,
	}))))
	if err != nil {
		return err
	}
	started.Store(b)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := b.Start(ctx); err != nil {
		b.Close()
		return fmt.Errorf("starting %s: %w", c.ID, err)
	}
	<-ctx.Done()
	sw.begin(stop)
	return b.Close()
}

// replicasHandler answers /readyz/replicas: 200 while the broker is
// ready and every raft group it hosts has a leader and a caught-up voter
// here, else 503 with why not (broker.ReplicaHealth). Unlike /readyz it
// is not a start-up condition: it fails whenever a hosted group is
// leaderless or this replica is behind, so it is for an operator's
// rollout script (200 on every broker before the next one is stopped),
// not for a probe that takes a broker out of service.
func replicasHandler(started *atomic.Pointer[broker.Broker]) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		b := started.Load()
		if b == nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "starting")
			return
		}
		if err := b.Readiness(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err)
			return
		}
		h := b.ReplicaHealth()
		if !h.OK() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, h)
	})
}
