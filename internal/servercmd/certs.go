package servercmd

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"

	"github.com/felix-broker/felix/transport"
)

// Certs writes a development PKI: the cluster CA, one certificate per node
// (the control plane is the node "ctl") and a client certificate. It
// reuses a CA already in the directory, so adding a node keeps the others
// valid. --host adds names a node is dialed by (a Kubernetes pod's DNS
// name, say); such a node's certificate is issued anew with them.
type Certs struct {
	Dir   string   `help:"Directory to write ca.crt, <node>.crt/.key and client.crt/.key into." default:"certs" type:"path"`
	Nodes []string `help:"Node ids to issue certificates for (each is also a DNS name in its certificate)." default:"ctl,broker-0,broker-1,broker-2"`
	Host  []string `help:"Extra name for a node's certificate, as NODE=NAME (repeatable), e.g. broker-0=broker-0.felix-broker." placeholder:"NODE=NAME"`
}

func (c *Certs) Run(log *slog.Logger) error {
	extra := map[string][]string{}
	for _, h := range c.Host {
		node, name, ok := strings.Cut(h, "=")
		if !ok || node == "" || name == "" {
			return fmt.Errorf("--host %q: want NODE=NAME", h)
		}
		if !slices.Contains(c.Nodes, node) {
			return fmt.Errorf("--host %q: %s is not one of --nodes %v", h, node, c.Nodes)
		}
		extra[node] = append(extra[node], name)
	}
	if err := transport.GenerateDevCerts(c.Dir, c.Nodes...); err != nil {
		return err
	}
	if len(extra) > 0 {
		ca, err := transport.LoadCAKeyPair(filepath.Join(c.Dir, "ca.crt"), filepath.Join(c.Dir, "ca.key"))
		if err != nil {
			return err
		}
		for _, node := range c.Nodes {
			hosts := extra[node]
			if len(hosts) == 0 {
				continue
			}
			cert, err := ca.Issue(transport.RoleNode, node, append([]string{"localhost", "127.0.0.1", "::1"}, hosts...)...)
			if err != nil {
				return fmt.Errorf("issuing %s with %v: %w", node, hosts, err)
			}
			if err := transport.WriteKeyPair(cert, filepath.Join(c.Dir, node+".crt"), filepath.Join(c.Dir, node+".key")); err != nil {
				return err
			}
		}
	}
	fmt.Printf("wrote the cluster CA and certificates for %v in %s\n", c.Nodes, c.Dir)
	return nil
}
