package transport

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/quic-go/quic-go"
)

// LoadCA reads the PEM certificates in file into a pool, to verify peers
// with.
func LoadCA(file string) (*x509.CertPool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("transport: loading CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("transport: loading CA %q: no PEM certificate in it", file)
	}
	return pool, nil
}

// LoadKeyPair reads a PEM certificate (chain) and its private key.
func LoadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("transport: loading key pair %q, %q: %w", certFile, keyFile, err)
	}
	return cert, nil
}

// ServerTLS returns the TLS configuration of a server presenting cert and
// speaking the ALPN protocols alpn (all of ALPNClient, ALPNPeer and ALPNCtl
// when none are given). TLS 1.3 is the minimum. Every client must present
// a certificate that verifies against ca (mutual TLS on every ALPN: nothing
// is anonymous); a connection without one fails its handshake. What the
// certificate's role may do is the server's to check ([PeerIdentity],
// [PeerNodeID]). A nil ca accepts no client certificate at all, which only
// tests of the transport itself want.
func ServerTLS(cert tls.Certificate, ca *x509.CertPool, alpn ...string) *tls.Config {
	if len(alpn) == 0 {
		alpn = []string{ALPNClient, ALPNPeer, ALPNCtl}
	}
	c := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		NextProtos:   slices.Clone(alpn),
		ClientAuth:   tls.NoClientCert,
	}
	if ca != nil {
		c.ClientCAs = ca
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return c
}

// ClientTLS returns the TLS configuration of a client that verifies the
// server against ca (nil: the system roots) under serverName, presents
// cert if not nil (a node certificate for mTLS), and speaks alpn
// (ALPNClient when none is given).
func ClientTLS(ca *x509.CertPool, cert *tls.Certificate, serverName string, alpn ...string) *tls.Config {
	if len(alpn) == 0 {
		alpn = []string{ALPNClient}
	}
	c := &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    ca,
		ServerName: serverName,
		NextProtos: slices.Clone(alpn),
	}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	return c
}

// InsecureClientTLS returns a client TLS configuration that DOES NOT VERIFY
// THE SERVER: anyone on the path can impersonate it and read and alter all
// traffic. It is for development against a server with a self-made
// certificate and nothing else; never use it in production, and never
// make it a default. It speaks alpn (ALPNClient when none is given).
func InsecureClientTLS(alpn ...string) *tls.Config {
	if len(alpn) == 0 {
		alpn = []string{ALPNClient}
	}
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true,
		NextProtos:         slices.Clone(alpn),
	}
}

// MaxNameLen bounds the name a certificate gives its holder (a node id, a
// principal); a longer one, or one holding a NUL, names no one.
const MaxNameLen = 256

// Identity is who a verified certificate says its holder is.
type Identity struct {
	Role Role   // RoleNode, RoleCtl or RoleClient
	Name string // the node id for RoleNode and RoleCtl; the client's name for RoleClient
}

// PeerIdentity returns the identity in the certificate the peer of conn
// presented and this side verified: on a server, the client certificate;
// on a client, the server's. It fails with [CodeUnauthorized] when there is
// no verified certificate (none given, or verification skipped).
func PeerIdentity(conn *quic.Conn) (Identity, error) {
	return identityOf(conn.ConnectionState().TLS)
}

func identityOf(state tls.ConnectionState) (Identity, error) {
	if len(state.VerifiedChains) == 0 || len(state.VerifiedChains[0]) == 0 {
		return Identity{}, &Error{Code: CodeUnauthorized, Message: "peer presented no verified certificate"}
	}
	return CertIdentity(state.VerifiedChains[0][0])
}

// CertIdentity returns the identity a certificate names (its role in the
// OrganizationalUnit, its name in the CommonName), for a certificate this
// side verified. It fails with [CodeUnauthorized] when it names none.
func CertIdentity(leaf *x509.Certificate) (Identity, error) {
	for _, ou := range leaf.Subject.OrganizationalUnit {
		switch Role(ou) {
		case RoleNode, RoleCtl, RoleClient:
			name := leaf.Subject.CommonName
			switch {
			case name == "":
				return Identity{}, &Error{Code: CodeUnauthorized, Message: "peer certificate has no common name"}
			case len(name) > MaxNameLen || strings.ContainsRune(name, 0):
				// A NUL ends a principal's name where it scopes
				// another name (a producer id), and names are kept.
				return Identity{}, &Error{Code: CodeUnauthorized, Message: fmt.Sprintf("peer certificate's common name (%d bytes) is over %d bytes or holds a NUL", len(name), MaxNameLen)}
			}
			return Identity{Role: Role(ou), Name: name}, nil
		}
	}
	return Identity{}, &Error{Code: CodeUnauthorized, Message: fmt.Sprintf("peer certificate %q has no felix role", leaf.Subject.CommonName)}
}

// PeerNodeID returns the node id in the verified node certificate of conn's
// peer. It fails with [CodeUnauthorized] when the peer presented no
// verified certificate or a certificate of another role (a client's).
// Servers call it to require mTLS on ALPNPeer and ALPNCtl connections.
func PeerNodeID(conn *quic.Conn) (string, error) {
	id, err := PeerIdentity(conn)
	if err != nil {
		return "", err
	}
	if id.Role != RoleNode {
		return "", &Error{Code: CodeUnauthorized, Message: fmt.Sprintf("peer %q holds a %s certificate, not a node certificate", id.Name, id.Role)}
	}
	return id.Name, nil
}

// VerifyPeer returns a copy of c that, after the usual verification of the
// server's certificate chain, also requires the certificate to have role
// and, when name is not empty, to name name: a broker dialing node n
// accepts only n's node certificate, a broker dialing the control plane
// only a ctl certificate, a client only a broker's. A certificate of
// another role or name fails the handshake with an error saying which.
func VerifyPeer(c *tls.Config, role Role, name string) *tls.Config {
	c = c.Clone()
	prev := c.VerifyConnection
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if prev != nil {
			if err := prev(cs); err != nil {
				return err
			}
		}
		if c.InsecureSkipVerify {
			return nil // nothing was verified, so there is nothing to trust
		}
		id, err := identityOf(cs)
		if err != nil {
			return err
		}
		if id.Role != role {
			return &Error{Code: CodeUnauthorized, Message: fmt.Sprintf("%s presented a %s certificate (%q), not a %s certificate", cs.ServerName, id.Role, id.Name, role)}
		}
		if name != "" && id.Name != name {
			return &Error{Code: CodeUnauthorized, Message: fmt.Sprintf("expected the certificate of %q, got the certificate of %q", name, id.Name)}
		}
		return nil
	}
	return c
}
