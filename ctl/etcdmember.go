package ctl

import (
	"log/slog"
	"sync"
	"sync/atomic"

	"go.etcd.io/etcd/server/v3/embed"
)

// EtcdMember is a standalone etcd member: the etcd server ctl embeds,
// started by the same code (startEmbedded) with the same settings, but
// with no control plane beside it. Three of them form an etcd cluster
// that ctls use as an external store (EtcdConfig.Endpoints); `felix etcd`
// runs one, so that an external etcd needs no other binary (the
// multi-host tests run it in containers built from felix alone).
type EtcdMember struct {
	e     *embed.Etcd
	quiet *atomic.Bool
	once  sync.Once
}

// StartEtcdMember starts an etcd member with its data in dir/etcd (its
// URLs kept in dir as for the embedded member) as ec describes: Name,
// ClientURL, PeerURL, InitialCluster, InitialClusterToken, StartTimeout,
// TickMs, ElectionMs, CertFile, KeyFile, CAFile and Insecure, with the
// embedded member's defaults; Endpoints and TLS are ignored. It returns once the member serves, which for a
// member of a new cluster means once a majority of the members named in
// InitialCluster are up. Its https URLs are secured as the embedded
// member's are (EtcdConfig.CertFile, KeyFile and CAFile: peers must hold a
// ctl certificate of the cluster CA naming a member, clients a felix-ctl
// certificate), and plaintext ones refused off loopback and between
// members unless EtcdConfig.Insecure. Unlike ctl's embedded member, its
// default URLs are http:// on loopback, and http:// loopback URLs are
// allowed: who may reach its clients port is its operator's to decide.
func StartEtcdMember(dir string, ec EtcdConfig, log *slog.Logger) (*EtcdMember, error) {
	if log == nil {
		log = slog.Default()
	}
	ec.standalone = true
	quiet := new(atomic.Bool)
	e, _, err := startEmbedded(dir, ec, slogCore{log: log.With("component", "etcd"), quiet: quiet}, log)
	if err != nil {
		return nil, err
	}
	return &EtcdMember{e: e, quiet: quiet}, nil
}

// ClientURL is where the member serves etcd clients.
func (m *EtcdMember) ClientURL() string { return m.e.Config().AdvertiseClientUrls[0].String() }

// Err delivers an error that stopped the member's listeners.
func (m *EtcdMember) Err() <-chan error { return m.e.Err() }

// Close stops the member, quietly (etcd's shutdown is loud about the
// listeners it closes on purpose), after handing its leadership to
// another member if it leads (stopEmbedded). It may be called again.
func (m *EtcdMember) Close() {
	m.once.Do(func() {
		m.quiet.Store(true)
		stopEmbedded(m.e)
	})
}
