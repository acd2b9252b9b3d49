package broker

import (
	"context"
	"crypto/tls"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestAuthorization: a principal may publish, subscribe and see only what
// it was granted, checked at the broker it is connected to before any
// forward; a denied publish writes nothing; admin requests are relayed in
// the client's name.
func TestAuthorization(t *testing.T) {
	ip := startInproc(t, 2, shardmap.StreamConfig{Name: "orders", Shards: 1}, shardmap.StreamConfig{Name: "secret", Shards: 1})
	owner, other := ip.owner("orders", 0), ip.nonOwner("orders", 0)

	// bob has no permission at all.
	bob := ip.dialAs(other, "bob")
	pubs := openStream(t, bob)
	pubs.send(publish(1, "orders", "denied"))
	wantError(t, pubs.recv(), transport.ErrUnauthorized)
	sub := openStream(t, bob)
	sub.send(&transport.Subscribe{Stream: "orders", Start: transport.StartEarliest, Credit: 10})
	wantError(t, sub.recv(), transport.ErrUnauthorized)
	create := openStream(t, bob)
	create.send(&transport.Request{Op: "stream.create", Stream: shardmap.StreamConfig{Name: "bobs", Shards: 1}})
	wantError(t, create.recv(), transport.ErrUnauthorized)
	del := openStream(t, bob)
	del.send(&transport.Request{Op: "stream.delete", Stream: shardmap.StreamConfig{Name: "orders"}})
	wantError(t, del.recv(), transport.ErrUnauthorized)
	// A broker's own request to the control plane is not relayed for a
	// client: relayed, it settled a replica move and was answered with
	// the whole map, ACL included.
	settle := openStream(t, bob)
	settle.send(&transport.Request{Op: opReplicaSettled, Stream: shardmap.StreamConfig{Name: "orders"},
		Move: &transport.ReplicaMove{Shard: 0, To: other.NodeID(), ID: 1}})
	wantError(t, settle.recv(), transport.ErrUnauthorized)
	if next := ip.logOf(owner, "orders", 0).NextOffset(); next != 0 {
		t.Fatalf("a denied publish was written: next offset %d", next)
	}
	if _, ok := ip.ctl.Map().Stream("orders"); !ok {
		t.Fatal("a denied delete removed the stream")
	}

	// Granted publish on orders, through the non-owner: forwarded, acked.
	for _, g := range []auth.Grant{{Principal: "bob", Action: auth.Publish, Pattern: "orders"}, {Principal: "bob", Action: auth.Subscribe, Pattern: "orders"}} {
		if err := ip.ctl.Grant(g); err != nil {
			t.Fatal(err)
		}
	}
	ip.waitEpoch(ip.ctl.Map().Epoch)
	pubs = openStream(t, bob)
	pubs.send(publish(2, "orders", "allowed"))
	if a := wantAck(t, pubs.recv(), 2); !a.Forwarded || a.Offset != 0 {
		t.Fatalf("ack %+v: want forwarded, offset 0", a)
	}
	// ... but not on secret, on the same publisher stream.
	pubs.send(publish(3, "secret", "denied"))
	wantError(t, pubs.recv(), transport.ErrUnauthorized)

	// The map bob gets shows orders only, and no policy.
	get := openStream(t, bob)
	get.send(&transport.Request{Op: "map.get"})
	resp, ok := get.recv().(*transport.Response)
	if !ok || resp.Map.ACL != nil || len(resp.Map.Streams) != 1 || resp.Map.Streams[0].Name != "orders" {
		t.Fatalf("bob's map: %+v", resp)
	}

	// A revoke reaches the broker with the next map.
	if err := ip.ctl.Revoke(auth.Grant{Principal: "bob", Action: auth.Publish, Pattern: "orders"}); err != nil {
		t.Fatal(err)
	}
	ip.waitEpoch(ip.ctl.Map().Epoch)
	pubs.send(publish(4, "orders", "revoked"))
	wantError(t, pubs.recv(), transport.ErrUnauthorized)
	sub = openStream(t, ip.dialAs(owner, "bob"))
	sub.send(&transport.Subscribe{Stream: "orders", Start: transport.StartEarliest, Credit: 10})
	if recs, ok := sub.recv().(*transport.Records); !ok || len(recs.Records) == 0 || string(recs.Records[0].Value) != "allowed" {
		t.Fatalf("bob's subscription: %+v", recs)
	}
}

// TestClientConnectionNeedsClientCert: a broker's or the control plane's
// certificate is no client principal, and a client without a certificate
// cannot connect at all.
func TestClientConnectionNeedsClientCert(t *testing.T) {
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	ca, err := transport.LoadCA(filepath.Join(ip.dir, "certs", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	ctlCert, nodeCert := ip.clientCert("ctl"), ip.clientCert(ip.brokers[0].NodeID())
	for name, cert := range map[string]*tls.Certificate{"ctl": &ctlCert, "node": &nodeCert, "none": nil} {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		conn, err := transport.Dial(ctx, ip.brokers[0].Addr().String(), transport.ClientTLS(ca, cert, "", transport.ALPNClient), transport.Config{})
		if err == nil {
			err = publishOnce(ctx, conn)
			conn.CloseWithError(0, "")
		}
		cancel()
		if err == nil {
			t.Errorf("a client with the %s certificate published", name)
		}
	}
	if next := ip.logOf(ip.brokers[0], "orders", 0).NextOffset(); next != 0 {
		t.Fatalf("a refused client's publish was written: next offset %d", next)
	}
}

// publishOnce publishes one record on conn and returns the error, if any,
// of any step up to the ack.
func publishOnce(ctx context.Context, conn *quic.Conn) error {
	s, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := transport.NewWriter(s).Write(publish(1, "orders", "x")); err != nil {
		return err
	}
	f, err := transport.NewReader(s, 0).Read()
	if err != nil {
		return err
	}
	if e, ok := f.(*transport.Error); ok {
		return e
	}
	return nil
}

// TestRevokeEndsSubscriptions: revoking a principal's subscribe
// permission ends its live subscriptions with unauthorized, the idle one
// (waiting for records) and the one waiting for credit alike; they once
// went on receiving every record published after the revoke.
func TestRevokeEndsSubscriptions(t *testing.T) {
	ip := startLimited(t, 1, func(c *Config) {})
	b := ip.brokers[0]
	live := openStream(t, ip.dialAs(b, "mallory"))
	live.send(&transport.Subscribe{Stream: "orders", Start: transport.StartEarliest, Credit: 100})
	starved := openStream(t, ip.dialAs(b, "mallory"))
	starved.send(&transport.Subscribe{Stream: "orders", Start: transport.StartEarliest, Credit: 1})
	admin := openStream(t, ip.dial(b))
	admin.send(publish(1, "orders", "before"))
	wantAck(t, admin.recv(), 1)
	for _, s := range []*wireStream{live, starved} {
		if r, ok := s.recv().(*transport.Records); !ok || string(r.Records[0].Value) != "before" {
			t.Fatalf("before the revoke: %+v", r)
		}
	}
	if err := ip.ctl.Revoke(auth.Grant{Principal: "mallory", Action: auth.Subscribe, Pattern: "orders"}); err != nil {
		t.Fatal(err)
	}
	ip.waitEpoch(ip.ctl.Map().Epoch)
	admin.send(publish(2, "orders", "after the revoke"))
	wantAck(t, admin.recv(), 2)
	wantError(t, live.recv(), transport.ErrUnauthorized)
	starved.send(&transport.Credit{Records: 10})
	wantError(t, starved.recv(), transport.ErrUnauthorized)
}

// TestNonMemberCannotForward: a node certificate of the cluster's CA
// naming no member of the cluster (a broker removed, a stray
// certificate) forwards no record: it is refused unauthorized, nothing
// written (it was acked, written with no principal's check).
func TestNonMemberCannotForward(t *testing.T) {
	ip := startInprocWith(t, func(c *Config) { c.ForwardTimeout = time.Second }, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	owner := ip.owner("orders", 0)
	dir := filepath.Join(ip.dir, "certs")
	ca, err := transport.LoadCAKeyPair(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.Issue(transport.RoleNode, "intruder", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	conn, err := transport.Dial(ctx, owner.Addr().String(), transport.ClientTLS(ca.Pool(), &cert, "", transport.ALPNPeer), transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseWithError(0, "")
	ws := openStream(t, conn)
	for _, epoch := range []uint64{0, owner.member.Map().Epoch, 1 << 40} { // its own map, ours, one from the future
		p := publish(epoch+1, "orders", "from-a-non-member")
		p.Via, p.Epoch = "intruder", epoch
		ws.send(p)
		if e, ok := ws.recv().(*transport.Error); !ok || e.Code != transport.CodeUnauthorized && e.Code != transport.CodeUnavailable {
			t.Fatalf("a record forwarded at epoch %d by node %q, not in the map: %+v, want refused", epoch, "intruder", e)
		}
	}
	if n := ip.logOf(owner, "orders", 0).NextOffset(); n != 0 {
		t.Fatalf("the shard holds %d records", n)
	}
}

// TestInvalidStreamNamesRefusedBeforeAuthorization: a stream name no
// stream can have (over shardmap.MaxStreamName bytes here) is refused
// invalid before it is authorized, on a publisher stream, a subscription
// and a replica status request, with a message that does not echo it.
// Denied first, each name, a new one each time, was kept whole in the
// broker's set of denials logged once (up to 4096 of them), logged, and
// sent back twice in the error: 600 names of 64 KiB from a principal with
// no grant left the heap 42 MiB larger after its connection closed.
func TestInvalidStreamNamesRefusedBeforeAuthorization(t *testing.T) {
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	b := ip.brokers[0]
	const n, size = 600, 64 << 10
	name := func(i int) string { return fmt.Sprintf("%08d", i) + strings.Repeat("x", size-8) }
	short := func(e *transport.Error) {
		t.Helper()
		if len(e.Message) > 1024 {
			t.Fatalf("the refusal of a name of %d bytes holds a message of %d bytes", size, len(e.Message))
		}
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	conn := ip.dialAs(b, "nobody") // no grants
	s := openStream(t, conn)
	for i := range n {
		s.send(publish(uint64(i+1), name(i), "v"))
		short(wantError(t, s.recv(), transport.ErrInvalid))
	}
	sub := openStream(t, conn)
	sub.send(&transport.Subscribe{Stream: name(n), Start: transport.StartEarliest, Credit: 1})
	short(wantError(t, sub.recv(), transport.ErrInvalid))
	status := openStream(t, conn)
	status.send(&transport.Request{Op: opReplicaStatus, Stream: shardmap.StreamConfig{Name: name(n + 1)}})
	short(wantError(t, status.recv(), transport.ErrInvalid))
	conn.CloseWithError(0, "")
	time.Sleep(200 * time.Millisecond)
	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap grew by %d MiB after %d publishes to stream names of %d KiB (connection closed)", grew>>20, n, size>>10)
	if grew > 20<<20 {
		t.Errorf("the broker retains %d MiB after a principal with no grant sent %d invalid stream names of %d KiB", grew>>20, n, size>>10)
	}
}
