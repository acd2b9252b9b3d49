package cluster

import (
	"path/filepath"
	"testing"

	"github.com/felix-broker/felix/transport"
)

func TestCtlCertFiles(t *testing.T) {
	dir := t.TempDir()
	// ctl.crt (role ctl, the default name) and ctl-1.crt (a member's own).
	if err := transport.GenerateDevCerts(dir, transport.DevCtlName); err != nil {
		t.Fatal(err)
	}
	ca, err := transport.LoadCAKeyPair(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.Issue(transport.RoleCtl, "ctl-1", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if err := transport.WriteKeyPair(cert, filepath.Join(dir, "ctl-1.crt"), filepath.Join(dir, "ctl-1.key")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, want string }{
		{"", "ctl"},
		{"ctl-1", "ctl-1"},
		{"ctl-2", "ctl"},    // no ctl-2.crt: the default
		{"../ctl-1", "ctl"}, // not a file name
		{"ca", "ctl"},       // the CA's files are not a member's
	} {
		certFile, keyFile := CtlCertFiles(dir, tc.name)
		if certFile != filepath.Join(dir, tc.want+".crt") || keyFile != filepath.Join(dir, tc.want+".key") {
			t.Errorf("CtlCertFiles(%q) = %s, %s; want %s.crt/.key", tc.name, certFile, keyFile, tc.want)
		}
	}
	c, err := LoadCtlTLS(dir, "ctl-1")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Certificates[0].Leaf.Subject.CommonName; got != "ctl-1" {
		t.Errorf("LoadCtlTLS(ctl-1) serves the certificate of %q", got)
	}
}
