package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/ctl"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// startRevoking starts a control plane and n brokers in-process, each
// enforcing the CRL of the shared certificate directory (crl.pem, none
// yet) with a watcher of its own that looks at the file every 20 ms.
func startRevoking(t *testing.T, n int, streams ...shardmap.StreamConfig) *inproc {
	t.Helper()
	var dir string
	watch := func() *transport.Revocations {
		certs := filepath.Join(dir, "certs")
		rev, err := transport.WatchCRL(filepath.Join(certs, transport.CRLFile), filepath.Join(certs, "ca.crt"),
			transport.RevocationsConfig{Interval: 20 * time.Millisecond, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rev.Close() })
		return rev
	}
	ip := startInprocTweaked(t, func(c *Config) {
		dir = filepath.Dir(c.DataDir) // the inproc's directory: DataDir is dir/<id>
		c.Transport.Revocations = watch()
	}, func(c *ctl.Config) {
		dir = filepath.Dir(c.DataDir)
		c.Transport.Revocations = watch()
	}, n, streams...)
	return ip
}

// revoke adds the certificates to the cluster's CRL in the shared
// certificate directory, as `felix certs revoke` and a copy would.
func (ip *inproc) revoke(certs ...tls.Certificate) {
	ip.t.Helper()
	dir := filepath.Join(ip.dir, "certs")
	ca, err := transport.LoadCAKeyPair(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		ip.t.Fatal(err)
	}
	for _, c := range certs {
		if _, _, err := ca.Revoke(filepath.Join(dir, transport.CRLFile), c.Leaf.SerialNumber); err != nil {
			ip.t.Fatal(err)
		}
	}
}

// TestRevokedClientCertificate: a client whose certificate the CRL comes
// to list loses its live connection (the broker closes it as the new
// list is loaded): its next publish fails with client.ErrUnauthorized,
// saying the certificate was revoked, its subscription ends with it, and
// a new Connect fails with it. Other principals are not affected.
func TestRevokedClientCertificate(t *testing.T) {
	ip := startRevoking(t, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	for _, a := range []auth.Action{auth.Publish, auth.Subscribe} {
		if err := ip.ctl.Grant(auth.Grant{Principal: "alice", Action: a, Pattern: "orders"}); err != nil {
			t.Fatal(err)
		}
	}
	ip.waitEpoch(ip.ctl.Map().Epoch)
	b := ip.brokers[0]
	alice := ip.clientCert("alice")
	certs := filepath.Join(ip.dir, "certs")
	caFile := filepath.Join(certs, "ca.crt")
	opts := []client.Opt{client.WithCAFile(caFile), client.WithLogger(quiet()),
		client.WithClientCertFile(filepath.Join(certs, "alice.crt"), filepath.Join(certs, "alice.key"))}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Connect(ctx, b.Addr().String(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Publish(ctx, "orders", nil, []byte("before")); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, "orders", client.Earliest())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	records := make(chan error, 1)
	go func() {
		// Records published before the revocation took effect are read;
		// then the subscription must end, typed.
		for _, err := range sub.Records(ctx) {
			if err != nil {
				records <- err
				return
			}
		}
		records <- errors.New("the iterator ended with no error")
	}()

	ip.revoke(alice)
	deadline := time.Now().Add(waitFor)
	for {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Publish(pctx, "orders", nil, []byte("after"))
		pcancel()
		if err != nil {
			if !errors.Is(err, client.ErrUnauthorized) || !strings.Contains(err.Error(), "revoked") || !strings.Contains(err.Error(), `"alice"`) {
				t.Fatalf("publish after alice's certificate was revoked: %v; want ErrUnauthorized saying alice's certificate was revoked", err)
			}
			t.Logf("publish after the revocation: %v", err)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alice still publishes %v after her certificate was revoked", waitFor)
		}
		time.Sleep(20 * time.Millisecond)
	}

	select {
	case err := <-records:
		if !errors.Is(err, client.ErrUnauthorized) || !strings.Contains(err.Error(), "revoked") {
			t.Errorf("alice's subscription after her certificate was revoked ended with %v; want ErrUnauthorized, revoked", err)
		}
	case <-time.After(waitFor):
		t.Errorf("alice's subscription still runs %v after her certificate was revoked", waitFor)
	}

	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	again, err := client.Connect(cctx, b.Addr().String(), opts...)
	ccancel()
	var derr *client.DialError
	switch {
	case err == nil:
		again.Close()
		t.Fatal("Connect with a revoked certificate succeeded")
	case !errors.As(err, &derr) || !errors.Is(err, client.ErrUnauthorized) || derr.Timeout():
		t.Fatalf("Connect with a revoked certificate: %v; want a *DialError matching ErrUnauthorized", err)
	}

	admin, actx := sdkClient(t, ip, b)
	if _, err := admin.Publish(actx, "orders", nil, []byte("admin")); err != nil {
		t.Fatalf("the admin, not revoked: %v", err)
	}
}

// TestRevokedNodeCertificate: once a broker's node certificate is
// revoked, the other brokers refuse its peer (forwarding) connections
// and the control plane its registration: its live registration is
// closed, so it goes down in the map, and a broker starting with a
// revoked certificate fails to join, unauthorized.
func TestRevokedNodeCertificate(t *testing.T) {
	ip := startRevoking(t, 2, shardmap.StreamConfig{Name: "orders", Shards: 4})
	b0, b1 := ip.brokers[0], ip.brokers[1]
	certs := filepath.Join(ip.dir, "certs")
	nt1, err := cluster.LoadNodeTLS(certs, b1.NodeID())
	if err != nil {
		t.Fatal(err)
	}
	nt2, err := cluster.LoadNodeTLS(certs, cluster.BrokerID(2))
	if err != nil {
		t.Fatal(err)
	}
	ip.revoke(nt1.Server.Certificates[0], nt2.Server.Certificates[0])

	// The control plane closes broker-1's registration and refuses it
	// again: its lease runs out.
	deadline := time.Now().Add(waitFor)
	for live := true; live; {
		live = false
		for _, n := range ip.ctl.Map().Nodes {
			live = live || n.ID == b1.NodeID() && n.Live
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still live %v after its certificate was revoked", b1.NodeID(), waitFor)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// broker-0 refuses broker-1's peer connection, the one it forwards on.
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	conn, err := transport.Dial(ctx, b0.Addr().String(), transport.VerifyPeer(nt1.Peer, transport.RoleNode, b0.NodeID()), transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseWithError(0, "")
	if _, err := conn.OpenStreamSync(ctx); err == nil {
		select {
		case <-conn.Context().Done():
		case <-ctx.Done():
			t.Fatalf("%s kept the peer connection of revoked %s open", b0.NodeID(), b1.NodeID())
		}
	}
	reason := transport.ClosedWith(context.Cause(conn.Context()))
	if reason == nil || !errors.Is(reason, transport.ErrUnauthorized) || !strings.Contains(reason.Message, "revoked") {
		t.Fatalf("peer connection of revoked %s closed with %v; want unauthorized, revoked", b1.NodeID(), reason)
	}

	// broker-2, revoked before it ever started, cannot join.
	b2 := ip.newBroker(2)
	defer b2.Close()
	err = b2.Start(ctx)
	if err == nil || !errors.Is(err, transport.ErrUnauthorized) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("Start of a broker with a revoked certificate: %v; want unauthorized, revoked", err)
	}
}
