package transport

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// peerServer listens on ALPNPeer with node n1's certificate and hands
// accepted connections to the test.
func peerServer(t *testing.T, p *pki) (addr string, accepted <-chan *quic.Conn) {
	t.Helper()
	return certServer(t, p, p.nodes["n1"], Config{})
}

// certServer is peerServer presenting cert, with cfg.
func certServer(t *testing.T, p *pki, cert tls.Certificate, cfg Config) (addr string, accepted <-chan *quic.Conn) {
	t.Helper()
	ln, err := Listen("127.0.0.1:0", ServerTLS(cert, p.ca, ALPNPeer, ALPNCtl), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan *quic.Conn, 4)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			ch <- conn
		}
	}()
	t.Cleanup(func() {
		ln.Close() // closes the accepted connections too
		<-done
	})
	return ln.Addr().String(), ch
}

func accept(t *testing.T, ch <-chan *quic.Conn) *quic.Conn {
	t.Helper()
	select {
	case c := <-ch:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("server accepted no connection")
		return nil
	}
}

func TestMTLSPeerNodeID(t *testing.T) {
	p := newPKI(t, "n1", "n2")
	addr, accepted := peerServer(t, p)

	t.Run("node cert", func(t *testing.T) {
		n2 := p.nodes["n2"]
		conn := dial(t, addr, ClientTLS(p.ca, &n2, "n1", ALPNPeer), Config{})
		srv := accept(t, accepted)
		if got := srv.ConnectionState().TLS.NegotiatedProtocol; got != ALPNPeer {
			t.Fatalf("negotiated %q", got)
		}
		id, err := PeerNodeID(srv)
		if err != nil || id != "n2" {
			t.Fatalf("server: PeerNodeID = %q, %v; want n2", id, err)
		}
		// The client verified the server's node certificate too.
		if id, err := PeerNodeID(conn); err != nil || id != "n1" {
			t.Fatalf("client: PeerNodeID = %q, %v; want n1", id, err)
		}
	})

	t.Run("no cert", func(t *testing.T) {
		// Every protocol needs a client certificate: the handshake fails.
		for _, alpn := range []string{ALPNPeer, ALPNCtl} {
			refused(t, addr, ClientTLS(p.ca, nil, "localhost", alpn), accepted)
		}
	})

	t.Run("client cert is not a node", func(t *testing.T) {
		dial(t, addr, ClientTLS(p.ca, &p.client, "127.0.0.1", ALPNCtl), Config{})
		srv := accept(t, accepted)
		if id, err := PeerNodeID(srv); !errors.Is(err, ErrUnauthorized) {
			t.Fatalf("PeerNodeID = %q, %v; want unauthorized", id, err)
		}
		id, err := PeerIdentity(srv)
		if err != nil || id != (Identity{Role: RoleClient, Name: DevAdminName}) {
			t.Fatalf("PeerIdentity = %+v, %v", id, err)
		}
	})

	t.Run("cert from another CA", func(t *testing.T) {
		other := newPKI(t, "n2")
		n2 := other.nodes["n2"]
		refused(t, addr, ClientTLS(p.ca, &n2, "n1", ALPNPeer), accepted)
	})

	t.Run("server from another CA", func(t *testing.T) {
		other := newPKI(t, "n2")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if conn, err := Dial(ctx, addr, ClientTLS(other.ca, nil, "n1", ALPNPeer), Config{}); err == nil {
			conn.CloseWithError(0, "")
			t.Fatal("client accepted a server certificate from another CA")
		}
		// Drain the server side if it got that far.
		select {
		case c := <-accepted:
			c.CloseWithError(0, "")
		case <-time.After(100 * time.Millisecond):
		}
	})

	t.Run("insecure client", func(t *testing.T) {
		c := InsecureClientTLS(ALPNPeer)
		c.Certificates = []tls.Certificate{p.nodes["n2"]}
		conn := dial(t, addr, c, Config{})
		accept(t, accepted)
		if _, err := PeerNodeID(conn); !errors.Is(err, ErrUnauthorized) {
			t.Fatalf("PeerNodeID over an unverified connection = %v, want unauthorized", err)
		}
	})
}

// refused dials addr with conf and expects the server to refuse the
// client's certificate: at the handshake, or (TLS 1.3: the client may
// finish first) at once after it, with a TLS error; and the server must
// accept nothing.
func refused(t *testing.T, addr string, conf *tls.Config, accepted <-chan *quic.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := Dial(ctx, addr, conf, Config{})
	if err != nil {
		t.Logf("rejected at dial: %v", err)
	} else {
		defer conn.CloseWithError(0, "")
		s, err := conn.OpenStreamSync(ctx)
		if err == nil {
			s.Write([]byte{0, 0, 0, 1, 11})
			_, err = s.Read(make([]byte, 1))
		}
		if err == nil {
			t.Fatal("the connection works")
		}
		var terr *quic.TransportError
		if !errors.As(err, &terr) || !terr.ErrorCode.IsCryptoError() {
			t.Fatalf("stream error %v (%T), want a TLS (crypto) error", err, err)
		}
		t.Logf("rejected after the client's handshake: %v", err)
	}
	select {
	case c := <-accepted:
		t.Fatalf("server accepted a connection from %s", c.RemoteAddr())
	case <-time.After(300 * time.Millisecond):
	}
}

// TestVerifyPeer: a dialer accepts only the role, and the name, it expects
// from the server.
func TestVerifyPeer(t *testing.T) {
	p := newPKI(t, "n1", "n2", DevCtlName)
	addr, accepted := peerServer(t, p) // serves n1's node certificate
	n2 := p.nodes["n2"]
	base := ClientTLS(p.ca, &n2, "", ALPNPeer)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		role Role
		name string
		ok   bool
	}{
		{RoleNode, "n1", true},
		{RoleNode, "", true},
		{RoleNode, "n3", false},
		{RoleCtl, "", false},
		{RoleClient, "", false},
	} {
		conn, err := Dial(ctx, addr, VerifyPeer(base, tc.role, tc.name), Config{})
		if (err == nil) != tc.ok {
			t.Errorf("expecting %s %q from n1: err=%v, want ok=%v", tc.role, tc.name, err, tc.ok)
		}
		if err == nil {
			conn.CloseWithError(0, "")
		} else if !strings.Contains(err.Error(), "certificate") {
			t.Errorf("refusal does not say what was wrong: %v", err)
		}
		select { // the server may have completed its side
		case c := <-accepted:
			c.CloseWithError(0, "")
		case <-time.After(50 * time.Millisecond):
		}
	}
	if base.VerifyConnection != nil {
		t.Error("VerifyPeer modified the config it was given")
	}
	if id, err := identityOf(tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{p.nodes[DevCtlName].Leaf}}}); err != nil || id.Role != RoleCtl {
		t.Errorf("the dev PKI's ctl certificate: %+v, %v; want role ctl", id, err)
	}
}

func TestGenerateDevCerts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if err := GenerateDevCerts(dir, "n1", "n2"); err != nil {
		t.Fatal(err)
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	files := []string{"ca.crt", "ca.key", "n1.crt", "n1.key", "n2.crt", "n2.key", "admin.crt", "admin.key"}
	before := map[string][]byte{}
	for _, f := range files {
		before[f] = read(f)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "ca.key")); fi.Mode().Perm() != 0o600 {
		t.Errorf("ca.key mode %v", fi.Mode().Perm())
	}
	// Idempotent; a new node is issued by the same CA.
	if err := GenerateDevCerts(dir, "n1", "n2", "n3"); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !bytes.Equal(before[f], read(f)) {
			t.Errorf("%s changed on the second run", f)
		}
	}
	ca, err := LoadCAKeyPair(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	n3, err := LoadKeyPair(filepath.Join(dir, "n3.crt"), filepath.Join(dir, "n3.key"))
	if err != nil {
		t.Fatal(err)
	}
	leaf := n3.Leaf
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "n3", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("n3 certificate does not verify as server n3: %v", err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("n3 certificate does not verify as a client: %v", err)
	}
	if !slices.Equal(leaf.DNSNames, []string{"n3", "localhost"}) {
		t.Errorf("DNS SANs %v", leaf.DNSNames)
	}
	if len(leaf.IPAddresses) != 2 || !leaf.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)) || !leaf.IPAddresses[1].Equal(net.IPv6loopback) {
		t.Errorf("IP SANs %v", leaf.IPAddresses)
	}
	if leaf.Subject.CommonName != "n3" || !slices.Equal(leaf.Subject.OrganizationalUnit, []string{string(RoleNode)}) {
		t.Errorf("subject %v", leaf.Subject)
	}
	if k, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("public key %T, want ECDSA P-256", leaf.PublicKey)
	}
	client, err := LoadKeyPair(filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Error("the client certificate verifies as a server")
	}
	// A corrupted leaf is replaced, the CA kept.
	os.WriteFile(filepath.Join(dir, "n1.crt"), []byte("junk"), 0o644)
	if err := GenerateDevCerts(dir, "n1"); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(before["n1.crt"], read("n1.crt")) || !bytes.Equal(before["ca.crt"], read("ca.crt")) {
		t.Error("corrupted n1.crt not replaced, or CA changed")
	}
	for _, bad := range []string{"", "admin", "ca", "../x", "a/b", ".hidden"} {
		if err := GenerateDevCerts(dir, bad); err == nil {
			t.Errorf("node id %q accepted", bad)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.pem")
	os.WriteFile(junk, []byte("not pem"), 0o644)
	if _, err := LoadCA(junk); err == nil {
		t.Error("LoadCA of junk succeeded")
	}
	if _, err := LoadCA(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadCA of a missing file = %v", err)
	}
	if _, err := LoadKeyPair(junk, junk); err == nil {
		t.Error("LoadKeyPair of junk succeeded")
	}
	// A leaf is not a CA.
	p := newPKI(t, "n1")
	if _, err := LoadCAKeyPair(filepath.Join(p.dir, "n1.crt"), filepath.Join(p.dir, "n1.key")); err == nil {
		t.Error("LoadCAKeyPair accepted a leaf certificate")
	}
	if c := ServerTLS(tls.Certificate{}, nil); c.ClientAuth != tls.NoClientCert || len(c.NextProtos) != 3 || c.MinVersion != tls.VersionTLS13 {
		t.Errorf("ServerTLS without CA: %+v", c)
	}
}

func TestEchoStopsWhenListenerCloses(t *testing.T) {
	p := newPKI(t, "n1")
	ln, err := Listen("127.0.0.1:0", ServerTLS(p.nodes["n1"], p.ca), Config{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Echo(context.Background(), ln, 0) }()
	conn := dial(t, ln.Addr().String(), ClientTLS(p.ca, &p.client, "localhost"), Config{})
	openStream(t, conn).roundTrip(t, &Credit{Records: 1})
	ln.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Echo = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Echo did not return after its listener closed")
	}
	select {
	case <-conn.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("client connection survived the listener's Close")
	}
}

func TestDialIPv6(t *testing.T) {
	p := newPKI(t, "n1")
	ln, err := Listen("[::1]:0", ServerTLS(p.nodes["n1"], p.ca), Config{})
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Echo(ctx, ln, 0) }()
	defer func() { cancel(); ln.Close(); <-done }()
	conn := dial(t, ln.Addr().String(), ClientTLS(p.ca, &p.client, ""), Config{})
	openStream(t, conn).roundTrip(t, &Heartbeat{NodeID: "n1", Epoch: 3})
}

// TestCertIdentityRefusesUnusableNames: a certificate whose common name
// holds a NUL (which ends a principal's name where a broker scopes a
// producer id by it) or is over MaxNameLen names no one.
func TestCertIdentityRefusesUnusableNames(t *testing.T) {
	for _, name := range []string{"alice\x00x", strings.Repeat("a", MaxNameLen+1), ""} {
		leaf := &x509.Certificate{Subject: pkix.Name{CommonName: name, OrganizationalUnit: []string{string(RoleClient)}}}
		if id, err := CertIdentity(leaf); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("common name of %d bytes %q: identity %+v, %v; want unauthorized", len(name), name[:min(len(name), 12)], id, err)
		}
	}
	leaf := &x509.Certificate{Subject: pkix.Name{CommonName: strings.Repeat("a", MaxNameLen), OrganizationalUnit: []string{string(RoleClient)}}}
	if _, err := CertIdentity(leaf); err != nil {
		t.Errorf("a name of MaxNameLen bytes: %v", err)
	}
}

// TestIssueCtlMemberHost: a ctl certificate, and no other, names its
// member in CtlMemberDomain (last of its DNS names); no name or host in
// that domain is issued to any role, whatever its case or trailing dot.
func TestIssueCtlMemberHost(t *testing.T) {
	ca, err := NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := ca.Issue(RoleCtl, "ctl-0", "ctl-0.example.net")
	if err != nil {
		t.Fatal(err)
	}
	if got := ctl.Leaf.DNSNames; !slices.Equal(got, []string{"ctl-0", "ctl-0.example.net", "ctl-0.felix-ctl.invalid"}) {
		t.Errorf("ctl certificate's DNS names %v", got)
	}
	for _, role := range []Role{RoleNode, RoleClient} {
		c, err := ca.Issue(role, "ctl-0", "10.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Leaf.VerifyHostname(CtlMemberHost("ctl-0")); err == nil {
			t.Errorf("a %s certificate named ctl-0 names %s", role, CtlMemberHost("ctl-0"))
		}
	}
	for _, h := range []string{"felix-ctl.invalid", "ctl-0.felix-ctl.invalid", "*.felix-ctl.invalid", "CTL-0.Felix-Ctl.Invalid.", "a.b.felix-ctl.invalid"} {
		for _, role := range []Role{RoleNode, RoleCtl, RoleClient} {
			if _, err := ca.Issue(role, "x", h); err == nil {
				t.Errorf("a %s certificate with host %q issued", role, h)
			}
			if _, err := ca.Issue(role, h); err == nil {
				t.Errorf("a %s certificate named %q issued", role, h)
			}
		}
	}
}
