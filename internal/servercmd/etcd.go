package servercmd

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/felix-broker/felix/ctl"
	"github.com/felix-broker/felix/internal/cluster"
)

// Etcd runs one member of an etcd cluster for `felix ctl --etcd-endpoints`,
// from the etcd server built into felix (ctl.StartEtcdMember): an
// external store where no etcd binary or image is at hand. With https://
// URLs it is secured as ctl's embedded members are: a ctl certificate of
// the cluster CA for the member (felix certs ctl NAME, which names it
// NAME.felix-ctl.invalid) in --certs, peers holding one too, clients a
// felix-ctl certificate. Hidden from --help: in
// production, run etcd itself.
type Etcd struct {
	Data           string `help:"Data directory (the member's data in <data>/etcd)." required:"" type:"path" env:"FELIX_DATA"`
	Name           string `help:"Member name, unique in the cluster." required:"" env:"FELIX_ETCD_NAME"`
	ClientURL      string `help:"Where the member serves clients, e.g. https://10.0.0.5:2379 (a host name listens on all addresses)." required:"" env:"FELIX_ETCD_CLIENT_URL" placeholder:"URL"`
	PeerURL        string `help:"Where the member is reached by its peers, e.g. https://10.0.0.5:2380." required:"" env:"FELIX_ETCD_PEER_URL" placeholder:"URL"`
	InitialCluster string `help:"Every member of a new cluster as name=peerURL,... (etcd's --initial-cluster). Once the member has data, the start is refused unless this names the members it has (a running cluster cannot grow). Default: this member alone." env:"FELIX_ETCD_INITIAL_CLUSTER" placeholder:"NAME=URL,..."`
	Token          string `help:"Initial cluster token, the same on every member of one cluster." default:"felix-etcd" env:"FELIX_ETCD_TOKEN"`
	Certs          string `help:"Directory with this member's certificate (NAME.crt/NAME.key, else ctl.crt/ctl.key) and the cluster CA (ca.crt), for https:// URLs, and crl.pem when certificates are revoked (see felix certs revoke; re-read when it changes)." type:"path" env:"FELIX_CERTS"`
	Insecure       bool   `help:"Allow http:// URLs off loopback and between members: the traffic carries all of ctl's state unencrypted and unauthenticated. Only for a network nothing else shares." env:"FELIX_ETCD_INSECURE"`
	ElectionMs     uint   `help:"Election timeout in ms (heartbeat: a tenth). Default etcd's 1000 (100 for a single member)." env:"FELIX_ETCD_ELECTION_MS"`
}

func (c *Etcd) Run(log *slog.Logger) error {
	ec := ctl.EtcdConfig{Name: c.Name, ClientURL: c.ClientURL, PeerURL: c.PeerURL,
		InitialCluster: c.InitialCluster, InitialClusterToken: c.Token, Insecure: c.Insecure}
	if c.Certs != "" {
		ec.CertFile, ec.KeyFile = cluster.CtlCertFiles(c.Certs, c.Name)
		ec.CAFile = filepath.Join(c.Certs, "ca.crt")
		// A ctl certificate on the cluster's revocation list is refused
		// on the client port, per request.
		crl, err := cluster.WatchCRL(c.Certs, log)
		if err != nil {
			return err
		}
		defer crl.Close()
		ec.Revocations = crl
	}
	if c.ElectionMs > 0 {
		ec.ElectionMs, ec.TickMs = c.ElectionMs, max(1, c.ElectionMs/10)
	}
	if err := os.MkdirAll(c.Data, 0o700); err != nil {
		return fmt.Errorf("etcd: create data dir: %w", err)
	}
	sw := watchShutdown(log, "etcd")
	defer sw.end()
	m, err := ctl.StartEtcdMember(c.Data, ec, log)
	if err != nil {
		return err
	}
	defer m.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	select {
	case <-ctx.Done():
		sw.begin(stop)
		return nil // m.Close, deferred
	case err := <-m.Err():
		return fmt.Errorf("etcd member %s: %w", c.Name, err)
	}
}
