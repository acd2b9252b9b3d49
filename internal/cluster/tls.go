package cluster

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/felix-broker/felix/ctl"
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
	return LoadCtlTLS(certDir, "")
}

// LoadCtlTLS loads the server TLS config of the control plane member
// name from certDir: ca.crt and the key pair of [CtlCertFiles].
func LoadCtlTLS(certDir, name string) (*tls.Config, error) {
	ca, err := transport.LoadCA(filepath.Join(certDir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("load cluster CA from %s: %w", certDir, err)
	}
	certFile, keyFile := CtlCertFiles(certDir, name)
	cert, err := transport.LoadKeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load control plane certificate from %s: %w", certDir, err)
	}
	return transport.ServerTLS(cert, ca, transport.ALPNCtl), nil
}

// CtlCertFiles returns the files of the certificate and key of the
// control plane member name in certDir: NAME.crt and NAME.key when name is
// not empty and NAME.crt is there (as `felix certs ctl NAME` writes a
// member's own certificate), else ctl.crt and ctl.key.
func CtlCertFiles(certDir, name string) (certFile, keyFile string) {
	if name != "" && name != "ca" && filepath.Base(name) == name {
		certFile = filepath.Join(certDir, name+".crt")
		if _, err := os.Stat(certFile); err == nil {
			return certFile, filepath.Join(certDir, name+".key")
		}
	}
	return filepath.Join(certDir, "ctl.crt"), filepath.Join(certDir, "ctl.key")
}

// CtlEtcd returns the embedded etcd config of the control plane member
// name with the files of certDir that secure it: its certificate and
// key ([CtlCertFiles]) and ca.crt (ctl.EtcdConfig.CertFile, KeyFile and
// CAFile).
func CtlEtcd(certDir, name string) ctl.EtcdConfig {
	var ec ctl.EtcdConfig
	ec.CertFile, ec.KeyFile = CtlCertFiles(certDir, name)
	ec.CAFile = filepath.Join(certDir, "ca.crt")
	return ec
}

// WatchCRL enforces the certificate revocation list of certDir
// (transport.CRLFile, beside ca.crt): it must be signed by the cluster
// CA in ca.crt, and is re-read when it changes until the returned
// Revocations is closed. With no such file nothing is revoked until one
// appears. Set it as the node's transport.Config.Revocations.
func WatchCRL(certDir string, log *slog.Logger) (*transport.Revocations, error) {
	rev, err := transport.WatchCRL(filepath.Join(certDir, transport.CRLFile), filepath.Join(certDir, "ca.crt"), transport.RevocationsConfig{Logger: log})
	if err != nil {
		return nil, fmt.Errorf("load the certificate revocation list of %s: %w", certDir, err)
	}
	return rev, nil
}
