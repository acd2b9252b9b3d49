package servercmd

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/felix-broker/felix/ctl"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/internal/msgtrace"
)

// Ctl runs the control plane until SIGINT or SIGTERM.
type Ctl struct {
	Listen    string        `help:"QUIC address to listen on." default:"127.0.0.1:7000" env:"FELIX_LISTEN"`
	Data      string        `help:"State directory." required:"" type:"path" env:"FELIX_DATA"`
	Certs     string        `help:"Directory with ca.crt and ctl.crt/ctl.key." required:"" type:"existingdir" env:"FELIX_CERTS"`
	LeaseTTL  time.Duration `help:"Broker lease: a broker silent this long is marked down." default:"3s" env:"FELIX_LEASE_TTL"`
	Superuser []string      `help:"Client principal (certificate common name) authorized for everything, who grants the others their permissions (repeatable)." env:"FELIX_SUPERUSERS" placeholder:"NAME"`
	Admin     string        `help:"HTTP admin address serving /metrics, /healthz and /readyz (empty: none)." default:"127.0.0.1:0" env:"FELIX_ADMIN"`
	Pprof     bool          `help:"Also serve /debug/pprof/ on the admin listener (it has no authentication: keep it on loopback or an operator network)." env:"FELIX_PPROF"`

	// Shard bound (see ctl.Config.MaxShardsTotal).
	MaxShardsTotal int `help:"Most shards of all streams together; a stream create past it is refused with limit_exceeded." default:"16384" env:"FELIX_MAX_SHARDS_TOTAL"`
}

func (c *Ctl) Run(log *slog.Logger) error {
	tlsConf, err := cluster.CtlServerTLS(c.Certs)
	if err != nil {
		return err
	}
	var started atomic.Pointer[ctl.Server]
	obs, err := startObservability("felix-ctl", "ctl", c.Admin, c.Pprof, func() error {
		if started.Load() == nil {
			return errors.New("control plane starting")
		}
		return nil
	}, log)
	if err != nil {
		return err
	}
	defer obs.close()
	if len(c.Superuser) == 0 {
		log.Warn("no --superuser: no principal can grant permissions until one is configured")
	}
	s, err := ctl.New(ctl.Config{Addr: c.Listen, DataDir: c.Data, TLS: tlsConf, LeaseTTL: c.LeaseTTL, Superusers: c.Superuser, MaxShardsTotal: c.MaxShardsTotal, Logger: log})
	if err != nil {
		return err
	}
	if err := s.Start(); err != nil {
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
	return s.Close()
}

// ctlMetrics exposes the control plane's map: felix_map_epoch and
// felix_brokers{state="live"|"down"}.
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
		return nil
	}, epoch, brokers)
}
