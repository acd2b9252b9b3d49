package main

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/felix-broker/felix/transport"
)

// TestCertFlagsPairWithTheirVariables: each of --cert and --cert-key
// comes from its flag, else from its variable, so a flag pairs with the
// other's variable (--cert with FELIX_CERT_KEY was refused as lacking a
// key; --cert-key beside FELIX_CERT was ignored for FELIX_CERT_KEY); a
// --cert-key with no certificate given is refused, not paired with the
// certificate of the source found.
func TestCertFlagsPairWithTheirVariables(t *testing.T) {
	dir := t.TempDir()
	if err := transport.GenerateDevCerts(dir, "broker-0"); err != nil {
		t.Fatal(err)
	}
	crt, key := filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key")
	discover := func(env map[string]string, g clientFlags) (*target, error) {
		g.Broker, g.CA = "127.0.0.1:1", filepath.Join(dir, "ca.crt")
		return g.discover(&app{getenv: func(k string) string { return env[k] }})
	}
	tg, err := discover(map[string]string{"FELIX_CERT_KEY": key}, clientFlags{Cert: crt})
	if err != nil || tg.certFile != crt || tg.keyFile != key {
		t.Fatalf("--cert with FELIX_CERT_KEY: %+v, %v", tg, err)
	}
	tg, err = discover(map[string]string{"FELIX_CERT": crt, "FELIX_CERT_KEY": filepath.Join(dir, "broker-0.key")}, clientFlags{CertKey: key})
	if err != nil || tg.certFile != crt || tg.keyFile != key {
		t.Fatalf("FELIX_CERT with --cert-key: %+v, %v", tg, err)
	}
	_, err = discover(nil, clientFlags{CertKey: key})
	var u *usageError
	if !errors.As(err, &u) || !strings.Contains(err.Error(), "add --cert FILE") {
		t.Fatalf("--cert-key alone: %v; want a usage error asking for --cert", err)
	}
}
