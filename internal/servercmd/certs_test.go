package servercmd

import (
	"crypto/x509"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"

	"github.com/felix-broker/felix/transport"
)

func TestCertsExtraHosts(t *testing.T) {
	dir := t.TempDir()
	c := &Certs{Dir: dir, Nodes: []string{"ctl", "felix-broker-0"}, Host: []string{"felix-broker-0=felix-broker-0.felix-broker"}}
	if err := c.Run(slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	pair, err := transport.LoadKeyPair(filepath.Join(dir, "felix-broker-0.crt"), filepath.Join(dir, "felix-broker-0.key"))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := transport.LoadCA(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := pair.Leaf.VerifyHostname("felix-broker-0.felix-broker"); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pair.Leaf.DNSNames, "felix-broker-0") {
		t.Fatalf("node id missing from SANs %v", pair.Leaf.DNSNames)
	}
	if _, err := pair.Leaf.Verify(x509Opts(ca)); err != nil {
		t.Fatalf("not signed by the dev CA: %v", err)
	}
	bad := &Certs{Dir: dir, Nodes: []string{"ctl"}, Host: []string{"other=x"}}
	if err := bad.Run(slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("a --host for a node not in --nodes was accepted")
	}
}

func x509Opts(pool *x509.CertPool) x509.VerifyOptions {
	return x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
}
