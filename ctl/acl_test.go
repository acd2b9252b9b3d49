package ctl

import (
	"context"
	"errors"
	"testing"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/ctl/ctlclient"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestAdminAuthorization: every admin request is authorized for the
// principal it acts for, the one a broker relays, and a broker is never a
// principal itself.
func TestAdminAuthorization(t *testing.T) {
	p := newPKI(t)
	dataDir := t.TempDir()
	srv := startCtl(t, p, dataDir, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	admin, err := dialAs(ctx, t, p, srv.Addr(), transport.DevAdminName)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	broker, err := ctlclient.Dial(ctx, srv.Addr(), p.clientTLS(t, "b0"), transport.Config{})
	if err == nil {
		t.Cleanup(func() { broker.Close() })
	}
	// Dial verified that the server is ctl; the broker's certificate is the
	// client side here, which is what relaying looks like.
	if err != nil {
		t.Fatal(err)
	}
	as := func(principal, op, stream string) (*transport.Response, error) {
		return broker.Request(ctx, &transport.Request{Op: op, Stream: shardmap.StreamConfig{Name: stream, Shards: 1}, Principal: principal})
	}

	if _, err := as("bob", OpStreamCreate, "orders"); !errors.Is(err, transport.ErrUnauthorized) {
		t.Fatalf("bob creates a stream with no grant: %v, want unauthorized", err)
	}
	if len(srv.Streams()) != 0 {
		t.Fatal("a denied create changed the registry")
	}
	if _, err := as("", OpStreamList, ""); !errors.Is(err, transport.ErrUnauthorized) {
		t.Fatalf("a broker asking in its own name: %v, want unauthorized", err)
	}
	grant := func(g auth.Grant) {
		t.Helper()
		if _, err := admin.Request(ctx, &transport.Request{Op: OpACLGrant, Grant: g}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := as("bob", OpACLGrant, ""); !errors.Is(err, transport.ErrUnauthorized) {
		t.Fatalf("bob grants himself: %v, want unauthorized", err)
	}
	grant(auth.Grant{Principal: "bob", Action: auth.StreamAdmin, Pattern: "bob.*"})
	grant(auth.Grant{Principal: "bob", Action: auth.Publish, Pattern: "shared"})
	if _, err := as("bob", OpStreamCreate, "bob.one"); err != nil {
		t.Fatalf("bob creates bob.one: %v", err)
	}
	if _, err := as("bob", OpStreamCreate, "orders"); !errors.Is(err, transport.ErrUnauthorized) {
		t.Fatalf("bob creates orders: %v, want unauthorized", err)
	}
	if _, err := admin.Request(ctx, &transport.Request{Op: OpStreamCreate, Stream: shardmap.StreamConfig{Name: "orders", Shards: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := as("bob", OpStreamDelete, "orders"); !errors.Is(err, transport.ErrUnauthorized) {
		t.Fatalf("bob deletes orders: %v, want unauthorized", err)
	}
	// bob sees only what he has a grant on.
	resp, err := as("bob", OpStreamList, "")
	if err != nil || len(resp.Streams) != 1 || resp.Streams[0].Name != "bob.one" {
		t.Fatalf("bob's stream.list = %+v, %v; want [bob.one]", resp, err)
	}
	resp, err = as("bob", OpMapGet, "")
	if err != nil || resp.Map.ACL != nil || len(resp.Map.Streams) != 1 {
		t.Fatalf("bob's map.get = %+v, %v; want bob.one only, no policy", resp.Map, err)
	}
	if _, err := as("bob", OpClusterStatus, ""); !errors.Is(err, transport.ErrUnauthorized) {
		t.Fatalf("bob's cluster.status: %v, want unauthorized", err)
	}

	// The policy rides in the map brokers get, and survives a restart.
	if !srv.Map().ACL.Allows("bob", auth.Publish, "shared") {
		t.Fatal("the pushed map does not carry the grant")
	}
	if _, err := admin.Request(ctx, &transport.Request{Op: OpACLRevoke, Grant: auth.Grant{Principal: "bob", Action: auth.Publish, Pattern: "shared"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Request(ctx, &transport.Request{Op: OpACLRevoke, Grant: auth.Grant{Principal: "bob", Action: auth.Publish, Pattern: "shared"}}); !errors.Is(err, transport.ErrInvalid) {
		t.Fatalf("revoking a missing grant: %v, want invalid", err)
	}
	admin.Close()
	broker.Close()
	srv.Close()
	srv2 := startCtl(t, p, dataDir, "127.0.0.1:0")
	acl := srv2.Map().ACL
	if !acl.Allows("bob", auth.StreamAdmin, "bob.two") || acl.Allows("bob", auth.Publish, "shared") || !acl.IsSuperuser(transport.DevAdminName) {
		t.Fatalf("policy after restart: %+v", acl)
	}
}

// TestBrokerCannotRelayAnUnnamablePrincipal: a broker relays its client's
// principal; one no certificate can name (a NUL in it, as the control
// plane's own reserved principal has) is refused, never authorized (the
// reserved one passed every check: any node certificate could grant
// itself cluster.admin).
func TestBrokerCannotRelayAnUnnamablePrincipal(t *testing.T) {
	p := newPKI(t)
	srv := startCtl(t, p, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	broker, err := ctlclient.Dial(ctx, srv.Addr(), p.clientTLS(t, "b0"), transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	g := auth.Grant{Principal: "mallory", Action: auth.ClusterAdmin, Pattern: "*"}
	for _, principal := range []string{ctlPrincipal, "alice\x00"} {
		_, err := broker.Request(ctx, &transport.Request{Op: OpACLGrant, Grant: g, Principal: principal})
		if !errors.Is(err, transport.ErrUnauthorized) {
			t.Fatalf("broker relaying principal %q: %v, want unauthorized (policy now %v)", principal, err, srv.Map().ACL.Grants)
		}
	}
}
