package servercmd

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/felix-broker/felix/ctl"
	"github.com/felix-broker/felix/internal/cluster"
)

// Ctl runs the control plane until SIGINT or SIGTERM.
type Ctl struct {
	Listen   string        `help:"QUIC address to listen on." default:"127.0.0.1:7000" env:"FELIX_LISTEN"`
	Data     string        `help:"State directory." required:"" type:"path" env:"FELIX_DATA"`
	Certs    string        `help:"Directory with ca.crt and ctl.crt/ctl.key." required:"" type:"existingdir" env:"FELIX_CERTS"`
	LeaseTTL time.Duration `help:"Broker lease: a broker silent this long is marked down." default:"3s" env:"FELIX_LEASE_TTL"`
}

func (c *Ctl) Run(log *slog.Logger) error {
	tlsConf, err := cluster.CtlServerTLS(c.Certs)
	if err != nil {
		return err
	}
	s, err := ctl.New(ctl.Config{Addr: c.Listen, DataDir: c.Data, TLS: tlsConf, LeaseTTL: c.LeaseTTL, Logger: log})
	if err != nil {
		return err
	}
	if err := s.Start(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	return s.Close()
}
