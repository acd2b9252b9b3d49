package cluster

import (
	"crypto/tls"
	"fmt"
	"path/filepath"

	"github.com/felix-broker/felix/transport"
)

// NodeTLS is what a node needs to speak TLS in the cluster.
type NodeTLS struct {
	Server *tls.Config // the node's listener: clients and peers
	Peer   *tls.Config // dialing other brokers with the node certificate
	Ctl    *tls.Config // dialing the control plane with the node certificate
}

// LoadNodeTLS loads the cluster CA and the certificate of node id from
// certDir, as written by transport.GenerateDevCerts: ca.crt, <id>.crt and
// <id>.key.
func LoadNodeTLS(certDir, id string) (NodeTLS, error) {
	ca, err := transport.LoadCA(filepath.Join(certDir, "ca.crt"))
	if err != nil {
		return NodeTLS{}, fmt.Errorf("load cluster CA from %s: %w", certDir, err)
	}
	cert, err := transport.LoadKeyPair(filepath.Join(certDir, id+".crt"), filepath.Join(certDir, id+".key"))
	if err != nil {
		return NodeTLS{}, fmt.Errorf("load certificate of %s from %s: %w", id, certDir, err)
	}
	return NodeTLS{
		Server: transport.ServerTLS(cert, ca, transport.ALPNClient, transport.ALPNPeer),
		Peer:   transport.ClientTLS(ca, &cert, "", transport.ALPNPeer),
		Ctl:    transport.ClientTLS(ca, &cert, "", transport.ALPNCtl),
	}, nil
}

// CtlServerTLS loads the control plane's server TLS config from certDir
// (certificate "ctl").
func CtlServerTLS(certDir string) (*tls.Config, error) {
	ca, err := transport.LoadCA(filepath.Join(certDir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("load cluster CA from %s: %w", certDir, err)
	}
	cert, err := transport.LoadKeyPair(filepath.Join(certDir, "ctl.crt"), filepath.Join(certDir, "ctl.key"))
	if err != nil {
		return nil, fmt.Errorf("load control plane certificate from %s: %w", certDir, err)
	}
	return transport.ServerTLS(cert, ca, transport.ALPNCtl), nil
}
