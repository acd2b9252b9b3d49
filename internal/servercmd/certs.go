package servercmd

import (
	"fmt"
	"log/slog"

	"github.com/felix-broker/felix/transport"
)

// Certs writes a development PKI: the cluster CA, one certificate per node
// (the control plane is the node "ctl") and a client certificate. It
// reuses a CA already in the directory, so adding a node keeps the others
// valid.
type Certs struct {
	Dir   string   `help:"Directory to write ca.crt, <node>.crt/.key and client.crt/.key into." default:"certs" type:"path"`
	Nodes []string `help:"Node ids to issue certificates for (each is also a DNS name in its certificate)." default:"ctl,broker-0,broker-1,broker-2"`
}

func (c *Certs) Run(log *slog.Logger) error {
	if err := transport.GenerateDevCerts(c.Dir, c.Nodes...); err != nil {
		return err
	}
	fmt.Printf("wrote the cluster CA and certificates for %v in %s\n", c.Nodes, c.Dir)
	return nil
}
