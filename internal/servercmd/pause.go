package servercmd

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// Pause does nothing until it is stopped (SIGINT or SIGTERM): the process
// that holds a network namespace other containers share, as a Kubernetes
// pod's pause container does. The compose cluster's brokers share one,
// and a broker that held it would take the others' network with it when
// it restarted.
type Pause struct{}

func (c *Pause) Run(log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	return nil
}
