package servercmd

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alecthomas/kong"

	"github.com/felix-broker/felix/transport"
)

var quietLog = slog.New(slog.DiscardHandler)

// certsCLI runs `felix certs args...` through kong, as the binary would.
func certsCLI(t *testing.T, args ...string) error {
	t.Helper()
	var cli struct {
		Certs  Certs  `cmd:""`
		Health Health `cmd:""`
	}
	p, err := kong.New(&cli, kong.Name("felix"), kong.Exit(func(int) { t.Fatalf("kong exited on %v", args) }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := p.Parse(args)
	if err != nil {
		return err
	}
	return ctx.Run(quietLog)
}

// TestCertsSplit issues a CA, then a broker, a control plane and a client
// certificate each into a directory of its own, and checks each directory
// holds exactly its own pair and the CA certificate, and that each
// certificate verifies for its role, name and hosts.
func TestCertsSplit(t *testing.T) {
	root := t.TempDir()
	caDir := filepath.Join(root, "ca")
	if err := certsCLI(t, "certs", "ca", "--ca-dir", caDir); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ca.crt", "ca.key"} {
		if _, err := os.Stat(filepath.Join(caDir, f)); err != nil {
			t.Fatal(err)
		}
	}
	if fi, err := os.Stat(filepath.Join(caDir, "ca.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ca.key: mode %v, err %v; want 0600", fi.Mode().Perm(), err)
	}
	pool, err := transport.LoadCA(filepath.Join(caDir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		args  []string
		role  transport.Role
		name  string
		hosts []string // names the certificate must verify for
	}{
		{[]string{"node", "broker-0", "--host", "broker-0.felix.svc", "--host", "10.0.0.7"}, transport.RoleNode, "broker-0",
			[]string{"broker-0", "broker-0.felix.svc", "10.0.0.7"}},
		{[]string{"ctl", "--host", "felix-ctl"}, transport.RoleCtl, "ctl", []string{"ctl", "felix-ctl"}},
		{[]string{"client", "admin"}, transport.RoleClient, "admin", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(root, "out-"+tc.name)
			args := append([]string{"certs"}, tc.args...)
			args = append(args, "--ca-dir", caDir, "--out", out)
			if err := certsCLI(t, args...); err != nil {
				t.Fatal(err)
			}
			entries, err := os.ReadDir(out)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			want := []string{"ca.crt", tc.name + ".crt", tc.name + ".key"}
			slices.Sort(want)
			if !slices.Equal(names, want) {
				t.Fatalf("%s holds %v, want %v (never ca.key)", out, names, want)
			}
			if fi, _ := os.Stat(filepath.Join(out, tc.name+".key")); fi.Mode().Perm() != 0o600 {
				t.Errorf("%s.key mode %v, want 0600", tc.name, fi.Mode().Perm())
			}
			caCopy, _ := os.ReadFile(filepath.Join(out, "ca.crt"))
			caOrig, _ := os.ReadFile(filepath.Join(caDir, "ca.crt"))
			if !bytes.Equal(caCopy, caOrig) {
				t.Error("the ca.crt in --out differs from the CA's")
			}

			pair, err := transport.LoadKeyPair(filepath.Join(out, tc.name+".crt"), filepath.Join(out, tc.name+".key"))
			if err != nil {
				t.Fatal(err)
			}
			leaf := pair.Leaf
			if leaf.Subject.CommonName != tc.name || !slices.Equal(leaf.Subject.OrganizationalUnit, []string{string(tc.role)}) {
				t.Fatalf("subject %v, want CN %q OU %q", leaf.Subject, tc.name, tc.role)
			}
			usages := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
			if tc.role != transport.RoleClient {
				usages = append(usages, x509.ExtKeyUsageServerAuth)
			}
			for _, u := range usages {
				if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
					t.Errorf("usage %v: %v", u, err)
				}
			}
			if tc.role == transport.RoleClient {
				if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
					t.Error("a client certificate verifies as a server")
				}
			}
			for _, h := range tc.hosts {
				if err := leaf.VerifyHostname(h); err != nil {
					t.Error(err)
				}
			}
			if leaf.IsCA {
				t.Error("a leaf certificate is a CA")
			}
		})
	}
}

// TestCertsCAOverwrite checks that `certs ca` refuses to replace a CA,
// that --keep-existing keeps it, and that --force replaces it.
func TestCertsCAOverwrite(t *testing.T) {
	caDir := filepath.Join(t.TempDir(), "ca")
	if err := certsCLI(t, "certs", "ca", "--ca-dir", caDir); err != nil {
		t.Fatal(err)
	}
	read := func() []byte {
		b, err := os.ReadFile(filepath.Join(caDir, "ca.key"))
		if err != nil {
			t.Fatal(err)
		}
		return append(b, must(os.ReadFile(filepath.Join(caDir, "ca.crt")))...)
	}
	orig := read()
	if err := certsCLI(t, "certs", "ca", "--ca-dir", caDir); err == nil {
		t.Fatal("a second `certs ca` replaced the CA without --force")
	}
	if !bytes.Equal(read(), orig) {
		t.Fatal("a refused `certs ca` changed the CA")
	}
	if err := certsCLI(t, "certs", "ca", "--ca-dir", caDir, "--keep-existing"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(read(), orig) {
		t.Fatal("--keep-existing changed the CA")
	}
	if err := certsCLI(t, "certs", "ca", "--ca-dir", caDir, "--keep-existing", "--force"); err == nil {
		t.Fatal("--keep-existing with --force was accepted")
	}
	// Half a CA is not a CA to keep, nor one to silently replace.
	os.Remove(filepath.Join(caDir, "ca.crt"))
	if err := certsCLI(t, "certs", "ca", "--ca-dir", caDir); err == nil {
		t.Fatal("`certs ca` replaced a lone ca.key without --force")
	}
	if err := certsCLI(t, "certs", "ca", "--ca-dir", caDir, "--keep-existing"); err == nil {
		t.Fatal("--keep-existing accepted a lone ca.key")
	}
	if err := certsCLI(t, "certs", "ca", "--ca-dir", caDir, "--force"); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(read(), orig) {
		t.Fatal("--force did not replace the CA")
	}
}

// TestCertsOutNeverHoldsCAKey checks that a certificate is never issued
// into the CA's directory or any directory holding a CA key, and that bad
// names are refused before anything is written.
func TestCertsOutNeverHoldsCAKey(t *testing.T) {
	root := t.TempDir()
	caDir := filepath.Join(root, "ca")
	if err := certsCLI(t, "certs", "ca", "--ca-dir", caDir); err != nil {
		t.Fatal(err)
	}
	if err := certsCLI(t, "certs", "node", "broker-0", "--ca-dir", caDir, "--out", caDir); err == nil {
		t.Fatal("issued into the CA directory")
	}
	if err := certsCLI(t, "certs", "node", "broker-0", "--ca-dir", caDir, "--out", filepath.Join(caDir, ".")); err == nil {
		t.Fatal("issued into the CA directory (spelled differently)")
	}
	other := filepath.Join(root, "other")
	os.MkdirAll(other, 0o700)
	os.WriteFile(filepath.Join(other, "ca.key"), []byte("x"), 0o600)
	if err := certsCLI(t, "certs", "client", "alice", "--ca-dir", caDir, "--out", other); err == nil {
		t.Fatal("issued into a directory holding a ca.key")
	}
	if _, err := os.Stat(filepath.Join(caDir, "broker-0.key")); err == nil {
		t.Fatal("a refused issue wrote a key")
	}
	for _, name := range []string{"ca", "..", ".hidden", "a/b", "../x", "x y"} {
		if err := certsCLI(t, "certs", "client", name, "--ca-dir", caDir, "--out", filepath.Join(root, "bad")); err == nil {
			t.Errorf("name %q accepted", name)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "bad")); err == nil {
		t.Error("a refused name created its --out")
	}
	// No CA: a clear error, nothing written.
	if err := certsCLI(t, "certs", "node", "n1", "--ca-dir", filepath.Join(root, "none"), "--out", filepath.Join(root, "n1")); err == nil {
		t.Fatal("issued without a CA")
	}
}

// TestCertsReservedNames: `felix certs` issues no node or client
// certificate under the default control plane name (ctl), nor a ctl or
// node certificate under the development superuser's (admin), and no
// certificate of any role with a host in felix-ctl.invalid, where every
// ctl certificate, and only one, names its member for the control
// plane's etcd peer port (which checks that name, not the role). It used
// to issue `felix certs client ctl`, which that port accepted as the
// member ctl.
func TestCertsReservedNames(t *testing.T) {
	root := t.TempDir()
	caDir := filepath.Join(root, "ca")
	if err := certsCLI(t, "certs", "ca", "--ca-dir", caDir); err != nil {
		t.Fatal(err)
	}
	for i, args := range [][]string{
		{"client", "ctl"},
		{"node", "ctl"},
		{"ctl", "admin"},
		{"node", "admin"},
		{"node", "broker-0", "--host", "ctl-0.felix-ctl.invalid"},
		{"node", "broker-0", "--host", "*.FELIX-CTL.invalid."},
		{"ctl", "ctl-1", "--host", "ctl-0.felix-ctl.invalid"},
		{"node", "ctl-0.felix-ctl.invalid"},
	} {
		out := filepath.Join(root, fmt.Sprint("refused-", i))
		if err := certsCLI(t, append(append([]string{"certs"}, args...), "--ca-dir", caDir, "--out", out)...); err == nil {
			t.Errorf("felix certs %v: issued", args)
		} else {
			t.Logf("felix certs %v: %v", args, err)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("felix certs %v: refused, but created its --out", args)
		}
	}
	// A ctl certificate names its member in felix-ctl.invalid, the
	// default ctl too.
	for _, name := range []string{"ctl-0", "ctl"} {
		out := filepath.Join(root, name)
		if err := certsCLI(t, "certs", "ctl", name, "--ca-dir", caDir, "--out", out); err != nil {
			t.Fatal(err)
		}
		pair, err := transport.LoadKeyPair(filepath.Join(out, name+".crt"), filepath.Join(out, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		if err := pair.Leaf.VerifyHostname(name + ".felix-ctl.invalid"); err != nil {
			t.Errorf("the ctl certificate of %s: %v", name, err)
		}
	}
}

// TestCertsDev checks the development PKI: one directory with the CA key,
// node, ctl and admin certificates of the right roles, and extra hosts.
func TestCertsDev(t *testing.T) {
	dir := t.TempDir()
	if err := certsCLI(t, "certs", "dev", "--dir", dir, "--nodes", "ctl,felix-broker-0",
		"--host", "felix-broker-0=felix-broker-0.felix-broker", "--host", "ctl=felix-ctl"); err != nil {
		t.Fatal(err)
	}
	pool, err := transport.LoadCA(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		role transport.Role
		host string
	}{
		{"felix-broker-0", transport.RoleNode, "felix-broker-0.felix-broker"},
		{"ctl", transport.RoleCtl, "felix-ctl"},
		{transport.DevAdminName, transport.RoleClient, ""},
	} {
		pair, err := transport.LoadKeyPair(filepath.Join(dir, tc.name+".crt"), filepath.Join(dir, tc.name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		if got := pair.Leaf.Subject.OrganizationalUnit; !slices.Equal(got, []string{string(tc.role)}) {
			t.Errorf("%s: role %v, want %s", tc.name, got, tc.role)
		}
		if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("%s: not signed by the dev CA: %v", tc.name, err)
		}
		if tc.host != "" {
			if err := pair.Leaf.VerifyHostname(tc.host); err != nil {
				t.Error(err)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "ca.key")); err != nil {
		t.Fatal("the dev PKI has no ca.key beside the certificates")
	}
	if err := certsCLI(t, "certs", "dev", "--dir", dir, "--nodes", "ctl", "--host", "other=x"); err == nil {
		t.Fatal("a --host for a node not in --nodes was accepted")
	}
}

// TestHealth checks `felix health` against a 200 and a 503.
func TestHealth(t *testing.T) {
	var ready atomic.Bool
	ready.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	if err := certsCLI(t, "health", "--url", srv.URL); err != nil {
		t.Fatal(err)
	}
	ready.Store(false)
	if err := certsCLI(t, "health", "--url", srv.URL); err == nil {
		t.Fatal("a 503 passed the health check")
	}
	srv.Close()
	if err := certsCLI(t, "health", "--url", srv.URL, "--timeout", "500ms"); err == nil {
		t.Fatal("a closed listener passed the health check")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestCertsRevoke: `felix certs revoke` of a certificate file, then of a
// serial, writes crl.pem in the CA directory signed by the CA, with both
// serials and a higher Number the second time; revoking the first again
// changes nothing; --renew signs the same list again with a higher
// number; a certificate of another CA is refused.
func TestCertsRevoke(t *testing.T) {
	root := t.TempDir()
	caDir := filepath.Join(root, "ca")
	if err := certsCLI(t, "certs", "ca", "--ca-dir", caDir); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"alice", "bob"} {
		if err := certsCLI(t, "certs", "client", name, "--ca-dir", caDir, "--out", filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	alice, err := readCertFile(filepath.Join(root, "alice", "alice.crt"))
	if err != nil {
		t.Fatal(err)
	}
	bob, err := readCertFile(filepath.Join(root, "bob", "bob.crt"))
	if err != nil {
		t.Fatal(err)
	}
	crlFile := filepath.Join(caDir, transport.CRLFile)
	readCRL := func() *x509.RevocationList {
		t.Helper()
		data, err := os.ReadFile(crlFile)
		if err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode(data)
		if block == nil {
			t.Fatalf("%s: no PEM block", crlFile)
		}
		crl, err := x509.ParseRevocationList(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return crl
	}

	if err := certsCLI(t, "certs", "revoke", "--ca-dir", caDir, filepath.Join(root, "alice", "alice.crt")); err != nil {
		t.Fatal(err)
	}
	first := readCRL()
	// bob's serial as openssl prints it: upper case, here with colons.
	hex := strings.ToUpper(bob.SerialNumber.Text(16))
	if len(hex)%2 == 1 {
		hex = "0" + hex
	}
	var colons []string
	for i := 0; i < len(hex); i += 2 {
		colons = append(colons, hex[i:i+2])
	}
	if err := certsCLI(t, "certs", "revoke", "--ca-dir", caDir, "--serial", strings.Join(colons, ":")); err != nil {
		t.Fatal(err)
	}
	second := readCRL()
	if second.Number.Cmp(first.Number) <= 0 {
		t.Errorf("CRL number %v after %v; want it to increase", second.Number, first.Number)
	}
	ca, err := transport.LoadCAKeyPair(filepath.Join(caDir, "ca.crt"), filepath.Join(caDir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := second.CheckSignatureFrom(ca.Cert); err != nil {
		t.Fatalf("CRL signature: %v", err)
	}
	var got []string
	for _, e := range second.RevokedCertificateEntries {
		got = append(got, e.SerialNumber.Text(16))
	}
	if want := []string{alice.SerialNumber.Text(16), bob.SerialNumber.Text(16)}; !slices.Equal(got, want) {
		t.Fatalf("revoked serials %v, want %v", got, want)
	}

	before, _ := os.ReadFile(crlFile)
	if err := certsCLI(t, "certs", "revoke", "--ca-dir", caDir, filepath.Join(root, "alice", "alice.crt")); err != nil {
		t.Fatalf("revoking alice again: %v", err)
	}
	if after, _ := os.ReadFile(crlFile); !bytes.Equal(before, after) {
		t.Error("revoking alice again changed crl.pem")
	}

	if err := certsCLI(t, "certs", "revoke", "--ca-dir", caDir, "--renew"); err != nil {
		t.Fatal(err)
	}
	if renewed := readCRL(); renewed.Number.Cmp(second.Number) <= 0 || len(renewed.RevokedCertificateEntries) != 2 || renewed.NextUpdate.Before(second.NextUpdate) {
		t.Errorf("--renew: number %v (was %v), %d entries, next update %v (was %v); want a higher number, the 2 entries, a next update no earlier",
			renewed.Number, second.Number, len(renewed.RevokedCertificateEntries), renewed.NextUpdate, second.NextUpdate)
	}

	otherDir := filepath.Join(root, "other")
	if err := certsCLI(t, "certs", "ca", "--ca-dir", otherDir); err != nil {
		t.Fatal(err)
	}
	if err := certsCLI(t, "certs", "client", "mallory", "--ca-dir", otherDir, "--out", filepath.Join(root, "mallory")); err != nil {
		t.Fatal(err)
	}
	if err := certsCLI(t, "certs", "revoke", "--ca-dir", caDir, filepath.Join(root, "mallory", "mallory.crt")); err == nil ||
		!strings.Contains(err.Error(), "not issued by the CA") {
		t.Errorf("revoking another CA's certificate: %v; want refused", err)
	}
	if err := certsCLI(t, "certs", "revoke", "--ca-dir", caDir); err == nil {
		t.Error("revoke with nothing named succeeded")
	}
}

// TestServersRefuseAnotherCAsCRL: felix broker and felix ctl whose
// --certs holds a crl.pem the cluster CA did not sign fail to start,
// naming the file.
func TestServersRefuseAnotherCAsCRL(t *testing.T) {
	dir := t.TempDir()
	certs := filepath.Join(dir, "certs")
	if err := transport.GenerateDevCerts(certs, "ctl", "broker-0"); err != nil {
		t.Fatal(err)
	}
	other, err := transport.NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	crlFile := filepath.Join(certs, transport.CRLFile)
	if _, _, err := other.Revoke(crlFile, big.NewInt(42)); err != nil {
		t.Fatal(err)
	}
	// On a busy port, so that a Run that does not check the CRL fails
	// too (for another reason) instead of serving.
	busy, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	b := &Broker{ID: "broker-0", Listen: busy.LocalAddr().String(), Ctl: "127.0.0.1:1", Data: filepath.Join(dir, "b0"), Certs: certs, LeaseTTL: time.Second}
	if err := b.Run(quietLog); err == nil || !strings.Contains(err.Error(), crlFile) || !strings.Contains(err.Error(), "not signed by the cluster CA") {
		t.Errorf("felix broker with another CA's CRL: %v; want an error naming %s", err, crlFile)
	}
	c := &Ctl{Listen: busy.LocalAddr().String(), Data: filepath.Join(dir, "ctl"), Certs: certs, LeaseTTL: time.Second, MaxShardsTotal: 16384, MaxGrants: 16384}
	c.Etcd.Cluster = "default"
	c.Etcd.StartTimeout = 30 * time.Second
	if err := c.Run(quietLog); err == nil || !strings.Contains(err.Error(), crlFile) || !strings.Contains(err.Error(), "not signed by the cluster CA") {
		t.Errorf("felix ctl with another CA's CRL: %v; want an error naming %s", err, crlFile)
	}
}
