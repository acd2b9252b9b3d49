package servercmd

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/transport"
)

// Echo serves the QUIC echo the bench measures its round-trip floor
// against: every frame received on a stream is written back. It prints
// "listening ADDR" on stdout once it is ready.
type Echo struct {
	Listen string `help:"QUIC address to listen on." default:"127.0.0.1:0"`
	Certs  string `help:"Directory with ca.crt and <id>.crt/<id>.key." required:"" type:"existingdir"`
	ID     string `help:"Certificate to serve with." default:"echo"`
}

func (c *Echo) Run(log *slog.Logger) error {
	nt, err := cluster.LoadNodeTLS(c.Certs, c.ID)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return transport.ServeEcho(ctx, c.Listen, nt.Server, transport.Config{}, func(a net.Addr) {
		fmt.Printf("listening %s\n", a)
	})
}
