package ctl

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/felix-broker/felix/transport"
)

// TestEmbeddedEtcdRefusesRevokedCtlCertificate: a leaked ctl certificate,
// once on the cluster's revocation list, can no longer read or write the
// control plane's state through the embedded etcd's client port — neither
// on a connection made before the revocation nor on a new one — while
// the ctl's own certificate still serves.
func TestEmbeddedEtcdRefusesRevokedCtlCertificate(t *testing.T) {
	p := newPKI(t)
	leaked := t.TempDir()
	p.issue(t, leaked, transport.RoleCtl, "leaked")
	rev, err := transport.WatchCRL(filepath.Join(p.dir, transport.CRLFile), filepath.Join(p.dir, "ca.crt"),
		transport.RevocationsConfig{Interval: 20 * time.Millisecond, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer rev.Close()
	dir := filepath.Join(t.TempDir(), "ctl")
	cfg := p.ctlConfig(t, dir, "127.0.0.1:0")
	cfg.Transport.Revocations = rev
	startConfig(t, cfg)
	u := recordedURLs(t, dir).Client
	certFile, keyFile := filepath.Join(leaked, "leaked.crt"), filepath.Join(leaked, "leaked.key")

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{u}, TLS: filesTLS(t, certFile, keyFile, filepath.Join(p.dir, "ca.crt")),
		DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	get := func(c *clientv3.Client) error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := c.Get(ctx, "/felix/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		return err
	}
	if err := get(cli); err != nil {
		t.Fatalf("a ctl certificate not revoked: %v", err)
	}

	ca, err := transport.LoadCAKeyPair(filepath.Join(p.dir, "ca.crt"), filepath.Join(p.dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	certs, err := transport.ReadCertificates(certFile)
	if err != nil || len(certs) == 0 {
		t.Fatalf("parse %s: %v", certFile, err)
	}
	if _, _, err := ca.Revoke(filepath.Join(p.dir, transport.CRLFile), certs[0].SerialNumber); err != nil {
		t.Fatal(err)
	}
	revoked := func(err error) bool { return err != nil && strings.Contains(err.Error(), "revocation list") }
	deadline := time.Now().Add(10 * time.Second)
	for err = get(cli); !revoked(err); err = get(cli) {
		if time.Now().After(deadline) {
			t.Fatalf("the revoked certificate still reads ctl's state on its connection: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("refused on the connection made before: %v", err)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "/felix/default/grants/mallory/cluster.admin/%2A", "{}"); !revoked(err) {
		t.Errorf("a write with the revoked certificate: %v; want refused as revoked", err)
	}
	if err := readState(t, u, certFile, keyFile, filepath.Join(p.dir, "ca.crt")); !revoked(err) {
		t.Errorf("a new connection with the revoked certificate: %v; want refused as revoked", err)
	}
	if err := readState(t, u, filepath.Join(p.dir, "ctl.crt"), filepath.Join(p.dir, "ctl.key"), filepath.Join(p.dir, "ca.crt")); err != nil {
		t.Errorf("the ctl's own certificate: %v", err)
	}
}
