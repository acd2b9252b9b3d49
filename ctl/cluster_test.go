package ctl

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/felix-broker/felix/ctl/ctlclient"
	"github.com/felix-broker/felix/internal/quictest"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

func TestClusterJoinCreateLeave(t *testing.T) {
	p := newPKI(t)
	srv := startCtl(t, p, t.TempDir(), "127.0.0.1:0")
	members := []*ctlclient.Member{join(t, p, srv.Addr(), "b0"), join(t, p, srv.Addr(), "b1"), join(t, p, srv.Addr(), "b2")}

	// Everyone converges on the map with three live nodes.
	var maps []*shardmap.Map
	for _, m := range members {
		maps = append(maps, waitMap(t, m, "3 live nodes", func(mp *shardmap.Map) bool { return liveCount(mp) == 3 }))
	}
	for i, mp := range maps {
		if !reflect.DeepEqual(mp, srv.Map()) {
			t.Errorf("member %d holds epoch %d, ctl epoch %d:\n%+v\n%+v", i, mp.Epoch, srv.Map().Epoch, mp, srv.Map())
		}
	}

	// Create a stream through a member: every member gets it, with the
	// rendezvous owners.
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	resp, err := members[1].Request(ctx, &transport.Request{Op: OpStreamCreate, Stream: shardmap.StreamConfig{Name: "orders", Shards: 6}, Principal: transport.DevAdminName})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Streams) != 1 || resp.Streams[0].Name != "orders" || resp.Map == nil {
		t.Fatalf("create response = %+v", resp)
	}
	for _, m := range members {
		mp := waitMap(t, m, "stream orders", func(mp *shardmap.Map) bool { _, ok := mp.Stream("orders"); return ok })
		st, _ := mp.Stream("orders")
		for shard, owner := range st.Placement.All() {
			if want := shardmap.Owner("orders", shard, []string{"b0", "b1", "b2"}); owner != want {
				t.Errorf("orders/%d owned by %s, want %s", shard, owner, want)
			}
		}
	}
	if _, err := members[0].Request(ctx, &transport.Request{Op: OpStreamCreate, Stream: shardmap.StreamConfig{Name: "orders", Shards: 6}, Principal: transport.DevAdminName}); !errors.Is(err, transport.ErrStreamExists) {
		t.Errorf("second create: err=%v, want ErrStreamExists", err)
	}

	// One member leaves: the others see it down promptly; its shards stay
	// with it.
	before := members[0].Map()
	left := time.Now()
	members[2].Close()
	for _, m := range members[:2] {
		mp := waitMap(t, m, "b2 down", func(mp *shardmap.Map) bool { n, _ := mp.Node("b2"); return !n.Live })
		if moves := shardmap.Diff(before, mp); len(moves) != 0 {
			t.Errorf("b2 going down moved shards: %v", moves)
		}
		if mp.Epoch <= before.Epoch {
			t.Errorf("epoch %d after b2 went down, not above %d", mp.Epoch, before.Epoch)
		}
	}
	if took := time.Since(left); took > 2*shortTTL {
		t.Errorf("b2 seen down after %v, want within about the lease (%v)", took, shortTTL)
	}
	if got := srv.registered(); !reflect.DeepEqual(got, []string{"b0", "b1"}) {
		t.Errorf("registered = %v after b2 left", got)
	}
}

func TestLeaseExpiresWithoutHeartbeats(t *testing.T) {
	p := newPKI(t)
	srv := startCtl(t, p, t.TempDir(), "127.0.0.1:0")
	m := join(t, p, srv.Addr(), "b0")

	// b1 registers by hand and never heartbeats: its stream stays open but
	// its lease runs out.
	raw := dialRaw(t, p, srv.Addr(), "b1")
	registered := time.Now() // no later than ctl's start of the lease
	_, r := raw.send(&transport.Register{NodeID: "b1", Addr: "127.0.0.1:7401"})
	first, ok := readFrame(t, r).(*transport.MapUpdate)
	if !ok {
		t.Fatal("first frame on registration is not a map update")
	}
	if n, _ := first.Map.Node("b1"); !n.Live {
		t.Fatalf("b1 not live in its first map: %+v", first.Map)
	}
	mp := waitMap(t, m, "b1 down", func(mp *shardmap.Map) bool { n, ok := mp.Node("b1"); return ok && !n.Live })
	if took := time.Since(registered); took < shortTTL {
		t.Errorf("b1 expired after %v, before its lease of %v", took, shortTTL)
	}
	// b0, which heartbeats, stays live throughout.
	if n, _ := mp.Node("b0"); !n.Live {
		t.Errorf("heartbeating b0 not live: %+v", mp)
	}
	// The hand registration still receives the map that marks it down.
	for {
		u, ok := readFrame(t, r).(*transport.MapUpdate)
		if !ok {
			t.Fatal("registration stream sent a non-map frame")
		}
		if n, _ := u.Map.Node("b1"); !n.Live {
			break
		}
	}
}

// TestMemberWithALongerLease: a broker configured with a longer lease
// than the control plane's (--lease-ttl 3s against ctl's 300ms here)
// takes ctl's, which ctl sends with its maps, and stays live and
// registered. With its own, it heartbeat every second, past half of
// ctl's lease (when ctl hands a registration it could not renew over)
// and about when etcd's lease (1s) ran out: ctl declared it down or
// handed it over between its heartbeats, and it registered again, over
// and over.
func TestMemberWithALongerLease(t *testing.T) {
	p := newPKI(t)
	srv := startCtl(t, p, t.TempDir(), "127.0.0.1:0")
	m := joinConfig(t, p, srv.Addr(), "b0", func(c *ctlclient.MemberConfig) { c.LeaseTTL = 10 * shortTTL })
	waitMap(t, m, "b0 live", func(mp *shardmap.Map) bool { n, _ := mp.Node("b0"); return n.Live })
	if got := m.LeaseTTL(); got != shortTTL {
		t.Errorf("b0 goes by a lease of %v, want ctl's, %v", got, shortTTL)
	}
	sessions := func() uint64 {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.mu.nextSession
	}
	first, epoch := sessions(), srv.Map().Epoch
	var downs []string
	for start, wasLive := time.Now(), true; time.Since(start) < 3*time.Second; time.Sleep(5 * time.Millisecond) {
		n, _ := srv.Map().Node("b0")
		if wasLive && !n.Live {
			downs = append(downs, time.Since(start).Round(time.Millisecond).String())
		}
		wasLive = n.Live
	}
	if len(downs) > 0 || sessions() != first || srv.Map().Epoch != epoch {
		t.Fatalf("over 3s, ctl (lease %v) took %d registrations again from b0 (lease %v), its map went from epoch %d to %d, and it was seen showing b0 down at %v",
			shortTTL, sessions()-first, 10*shortTTL, epoch, srv.Map().Epoch, downs)
	}
}

func TestCtlRestart(t *testing.T) {
	p := newPKI(t)
	dataDir := t.TempDir()
	srv := startCtl(t, p, dataDir, "127.0.0.1:0")
	addr := srv.Addr()
	members := []*ctlclient.Member{join(t, p, addr, "b0"), join(t, p, addr, "b1"), join(t, p, addr, "b2")}
	if err := srv.CreateStream(shardmap.StreamConfig{Name: "orders", Shards: 4}); err != nil {
		t.Fatal(err)
	}
	if err := srv.CreateStream(shardmap.StreamConfig{Name: "audit", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	var held uint64
	for _, m := range members {
		held = max(held, waitMap(t, m, "3 live and 2 streams", func(mp *shardmap.Map) bool {
			return liveCount(mp) == 3 && len(mp.Streams) == 2
		}).Epoch)
	}
	before := srv.Map()
	srv.Close()

	srv2 := startCtl(t, p, dataDir, addr)
	if e := srv2.Map().Epoch; e <= before.Epoch {
		t.Fatalf("restarted ctl at epoch %d, not above %d", e, before.Epoch)
	}
	for _, m := range members {
		mp := waitMap(t, m, "3 live after restart", func(mp *shardmap.Map) bool { return mp.Epoch > held && liveCount(mp) == 3 })
		if moves := shardmap.Diff(before, mp); len(mp.Streams) != 2 || len(moves) != 0 {
			t.Errorf("after restart: %d streams, moves %v; want the 2 streams kept with their owners", len(mp.Streams), moves)
		}
	}
	if got := srv2.Streams(); len(got) != 2 || got[0].Name != "audit" || got[1].Name != "orders" {
		t.Errorf("Streams after restart = %+v", got)
	}
	// The members' admin path works on the new connection.
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	resp, err := members[0].Request(ctx, &transport.Request{Op: OpClusterStatus, Principal: transport.DevAdminName})
	if err != nil || resp.Map == nil || resp.Map.Epoch <= before.Epoch {
		t.Fatalf("cluster.status after restart: %+v, %v", resp, err)
	}
}

// TestCloseWhileStartBinds: a Close between Start's check that the
// server is open and its serving on the socket it bound makes Start
// close that socket and fail. Start used to go on serving on it after
// Close had returned, and nothing ever closed it.
func TestCloseWhileStartBinds(t *testing.T) {
	p := newPKI(t)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	pc.Close()
	var srv *Server
	cfg := p.ctlConfig(t, t.TempDir(), addr)
	cfg.Knobs.StartBound = func() { srv.Close() }
	srv, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err == nil {
		t.Error("Start closed while it bound its socket succeeded")
	}
	again, err := net.ListenPacket("udp", addr)
	if err != nil {
		t.Fatalf("the ctl's address after Start and Close returned: %v", err)
	}
	again.Close()
}

func TestClientCertCannotRegister(t *testing.T) {
	p := newPKI(t)
	srv := startCtl(t, p, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()

	_, err := ctlclient.Join(ctx, ctlclient.MemberConfig{
		CtlAddr: srv.Addr(),
		TLS:     p.clientTLS(t, transport.DevAdminName),
		Node:    transport.Register{NodeID: "client", Addr: "127.0.0.1:7400"},
		Logger:  testLogger(t),
	})
	if !errors.Is(err, transport.ErrUnauthorized) {
		t.Fatalf("join with a client certificate: err=%v, want ErrUnauthorized", err)
	}
	// A node may not register as another node.
	_, err = ctlclient.Join(ctx, ctlclient.MemberConfig{
		CtlAddr: srv.Addr(),
		TLS:     p.clientTLS(t, "b0"),
		Node:    transport.Register{NodeID: "b1", Addr: "127.0.0.1:7400"},
		Logger:  testLogger(t),
	})
	if !errors.Is(err, transport.ErrUnauthorized) {
		t.Fatalf("join as b1 with b0's certificate: err=%v, want ErrUnauthorized", err)
	}
	if len(srv.Map().Nodes) != 0 {
		t.Errorf("refused registrations became members: %+v", srv.Map().Nodes)
	}

}

// TestClientCertificateRefused: ctl serves brokers and ctl members only.
// A client certificate, even a superuser's, cannot make admin requests
// directly (typed CodeUnauthorized, saying to go through a broker); a
// broker relaying the same request for that principal can.
func TestClientCertificateRefused(t *testing.T) {
	p := newPKI(t)
	srv := startCtl(t, p, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()

	c, err := ctlclient.Dial(ctx, srv.Addr(), p.clientTLS(t, transport.DevAdminName), transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := &transport.Request{Op: OpStreamCreate, Stream: shardmap.StreamConfig{Name: "orders", Shards: 2}}
	if _, err := c.Request(ctx, req); !errors.Is(err, transport.ErrUnauthorized) || !strings.Contains(err.Error(), "through a broker") {
		t.Fatalf("stream.create with a client certificate: %v, want unauthorized, saying to go through a broker", err)
	}
	if len(srv.Streams()) != 0 {
		t.Fatal("a refused connection's request changed the registry")
	}
	// Once the close has arrived (200 ms is ample on loopback), a request
	// fails opening its stream: the same typed refusal (it was quic-go's
	// bare application error).
	time.Sleep(200 * time.Millisecond)
	if _, err := c.Request(ctx, req); !errors.Is(err, transport.ErrUnauthorized) {
		t.Fatalf("a request after the refusal arrived: %v, want unauthorized", err)
	}

	relay, err := dialAs(ctx, t, p, srv.Addr(), transport.DevAdminName)
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	if _, err := relay.Request(ctx, req); err != nil {
		t.Fatalf("stream.create relayed by a broker: %v", err)
	}
	resp, err := relay.Request(ctx, &transport.Request{Op: OpStreamInfo, Stream: shardmap.StreamConfig{Name: "orders"}})
	if err != nil || len(resp.Streams) != 1 || resp.Streams[0].Shards != 2 {
		t.Fatalf("stream.info: %+v, %v", resp, err)
	}
}

// TestClientCertificateHoldsNoStreams: a client certificate with no
// grant at all dials ctl and opens streams that send one byte of a frame
// header and stop, 3 connections of 1500. Each such stream held a
// goroutine and a 16 KiB read buffer for firstFrameTimeout (10s), up to
// quic's MaxIncomingStreams (4096) per connection, with no limit on the
// connections: 4500 goroutines here. ctl now closes a client
// certificate's connection at once (CodeUnauthorized) and serves none of
// its streams.
func TestClientCertificateHoldsNoStreams(t *testing.T) {
	p := newPKI(t)
	srv := startCtl(t, p, t.TempDir(), "127.0.0.1:0")
	p.issue(t, p.dir, transport.RoleClient, "nobody")
	const conns, perConn = 3, 1500
	var raws []*rawConn
	for range conns {
		c := dialRaw(t, p, srv.Addr(), "nobody")
		raws = append(raws, c)
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		for range perConn {
			s, err := c.conn.OpenStreamSync(ctx)
			if err != nil {
				break // refused
			}
			s.Write([]byte{0}) // a quarter of a frame header, then silence
		}
		cancel()
	}
	time.Sleep(time.Second)
	held := countGoroutines("ctl.(*Server).serveStream")
	t.Logf("ctl goroutines serving streams of principal %q (no grants): %d", "nobody", held)
	if held > 0 {
		t.Errorf("ctl holds %d stream goroutines (each with a 16 KiB buffer, for 10s) for a client certificate with no grant", held)
	}
	for i, c := range raws {
		select {
		case <-c.conn.Context().Done():
		case <-time.After(waitFor):
			t.Fatalf("connection %d still open", i)
		}
		if we := transport.ClosedWith(context.Cause(c.conn.Context())); we == nil || we.Code != transport.CodeUnauthorized {
			t.Errorf("connection %d closed with %v, want unauthorized", i, context.Cause(c.conn.Context()))
		}
	}
}

// TestHandshakesInFlightBounded: clients that never finish the TLS
// handshake (they never send their certificate) make ctl hold at most
// Transport.MaxHandshakes connections in their handshake; the rest are
// refused. ctl's listener is transport's, as a broker's is (see the
// broker's test of the same name): without it ctl built its own
// quic.Transport, which bounded nothing, and every client's first
// packet made a server connection (two goroutines and TLS state) for up
// to twice HandshakeTimeout.
func TestHandshakesInFlightBounded(t *testing.T) {
	const maxHS = 64
	p := newPKI(t)
	cfg := p.ctlConfig(t, t.TempDir(), "127.0.0.1:0")
	cfg.Transport.MaxHandshakes = maxHS
	srv := startConfig(t, cfg)
	addr, err := net.ResolveUDPAddr("udp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	const attempts = 2000
	conf := transport.ClientTLS(p.ca, nil, "localhost", transport.ALPNCtl)
	held, err := quictest.HeldHandshakes(addr, conf, transport.Config{}.QUIC(), attempts, maxHS)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("server connections in handshake after %d never-finished dials: %d (MaxHandshakes %d)", attempts, held, maxHS)
	if held > maxHS {
		t.Errorf("ctl holds %d unfinished handshakes from one unauthenticated source; Transport.MaxHandshakes is %d", held, maxHS)
	}
	// ctl still serves a broker.
	join(t, p, srv.Addr(), "b0")
}

func TestAdminRequests(t *testing.T) {
	p := newPKI(t)
	srv := startCtl(t, p, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, err := dialAs(ctx, t, p, srv.Addr(), transport.DevAdminName)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := func(op, stream string, shards int) (*transport.Response, error) {
		return c.Request(ctx, &transport.Request{Op: op, Stream: shardmap.StreamConfig{Name: stream, Shards: shards}})
	}
	for _, tc := range []struct {
		op, stream string
		shards     int
		want       error
	}{
		{OpStreamCreate, "a", 1, nil},
		{OpStreamCreate, "b", 3, nil},
		{OpStreamCreate, "a", 1, transport.ErrStreamExists},
		{OpStreamCreate, "bad/name", 1, transport.ErrInvalid},
		{OpStreamCreate, "c", 0, transport.ErrInvalid},
		{OpStreamInfo, "nope", 0, transport.ErrUnknownStream},
		{OpStreamDelete, "a", 0, nil},
		{OpStreamDelete, "a", 0, transport.ErrUnknownStream},
		{"stream.explode", "", 0, transport.ErrInvalid},
	} {
		if _, err := req(tc.op, tc.stream, tc.shards); !errors.Is(err, tc.want) {
			t.Errorf("%s %q: err=%v, want %v", tc.op, tc.stream, err, tc.want)
		}
	}
	resp, err := req(OpStreamList, "", 0)
	if err != nil || len(resp.Streams) != 1 || resp.Streams[0].Name != "b" {
		t.Fatalf("stream.list = %+v, %v; want [b]", resp, err)
	}
	resp, err = req(OpMapGet, "", 0)
	if want := srv.Map().VisibleTo(transport.DevAdminName); err != nil || !reflect.DeepEqual(resp.Map, want) {
		t.Fatalf("map.get = %+v, %v; want %+v", resp, err, want)
	}
	// In-process errors match both the ctl and the wire sentinels.
	if err := srv.CreateStream(shardmap.StreamConfig{Name: "b", Shards: 1}); !errors.Is(err, ErrStreamExists) || !errors.Is(err, transport.ErrStreamExists) {
		t.Errorf("in-process create of an existing stream: %v", err)
	}
	if err := srv.DeleteStream("zzz"); !errors.Is(err, ErrUnknownStream) || !errors.Is(err, transport.ErrUnknownStream) {
		t.Errorf("in-process delete of an unknown stream: %v", err)
	}
}

func TestMalformedFrames(t *testing.T) {
	p := newPKI(t)
	srv := startCtl(t, p, t.TempDir(), "127.0.0.1:0")
	raw := dialRaw(t, p, srv.Addr(), "b0")

	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"garbage body", []byte{0, 0, 0, 4, byte(transport.FrameRequest), 0xc1, 0xc1, 0xc1}, transport.ErrMalformed},
		{"zero length", []byte{0, 0, 0, 0}, transport.ErrMalformed},
		{"unknown type", []byte{0, 0, 0, 1, 0xee}, transport.ErrUnknownFrame},
		{"huge length", []byte{0x7f, 0xff, 0xff, 0xff, byte(transport.FrameRequest)}, transport.ErrFrameTooLarge},
		{"huge publish", []byte{0x7f, 0xff, 0xff, 0xff, byte(transport.FramePublish)}, transport.ErrPayloadTooLarge},
		{"wrong first frame", mustFrame(t, &transport.Heartbeat{NodeID: "b0"}), transport.ErrUnexpectedFrame},
	} {
		_, r := raw.stream(tc.b)
		f := readFrame(t, r)
		if e, ok := f.(*transport.Error); !ok || !errors.Is(e, tc.want) {
			t.Errorf("%s: answer %T %+v, want %v", tc.name, f, f, tc.want)
		}
		readEOF(t, r)
	}

	// A registration stream that sends garbage after registering gets an
	// Error and ends; the node goes down.
	str, r := raw.send(&transport.Register{NodeID: "b0", Addr: "127.0.0.1:7400"})
	if _, ok := readFrame(t, r).(*transport.MapUpdate); !ok {
		t.Fatal("no map after registering")
	}
	if _, err := str.Write([]byte{0, 0, 0, 1, 0xee}); err != nil {
		t.Fatal(err)
	}
	for {
		f := readFrame(t, r)
		if e, ok := f.(*transport.Error); ok {
			if !errors.Is(e, transport.ErrUnknownFrame) {
				t.Errorf("error after garbage on the registration = %v", e)
			}
			break
		}
	}
	readEOF(t, r)

	// The connection still serves requests (relayed for a principal).
	_, r = raw.send(&transport.Request{Op: OpMapGet, Principal: transport.DevAdminName})
	resp, ok := readFrame(t, r).(*transport.Response)
	if !ok || resp.Map == nil {
		t.Fatalf("map.get after malformed frames: %+v", resp)
	}
	if n, ok := resp.Map.Node("b0"); !ok || n.Live {
		t.Errorf("b0 = %+v after its registration failed, want a member not live", n)
	}
}

func mustFrame(t *testing.T, f transport.Frame) []byte {
	t.Helper()
	b, err := transport.AppendFrame(nil, f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRegistrationReplaced(t *testing.T) {
	p := newPKI(t)
	srv := startCtl(t, p, t.TempDir(), "127.0.0.1:0")
	raw := dialRaw(t, p, srv.Addr(), "b0")
	_, r1 := raw.send(&transport.Register{NodeID: "b0", Addr: "127.0.0.1:7400"})
	readFrame(t, r1)
	epoch := srv.Map().Epoch

	raw2 := dialRaw(t, p, srv.Addr(), "b0")
	_, r2 := raw2.send(&transport.Register{NodeID: "b0", Addr: "127.0.0.1:7499"})
	u, ok := readFrame(t, r2).(*transport.MapUpdate)
	if !ok {
		t.Fatal("no map for the second registration")
	}
	if n, _ := u.Map.Node("b0"); n.Addr != "127.0.0.1:7499" || !n.Live || u.Map.Epoch <= epoch {
		t.Errorf("after re-registering at a new address: %+v at epoch %d (was %d)", n, u.Map.Epoch, epoch)
	}
	// The first registration's stream says it was replaced and closes
	// (after, possibly, the map with the new address).
	var replaced error
	for {
		f, err := r1.Read()
		if err != nil {
			break
		}
		switch f := f.(type) {
		case *transport.MapUpdate:
		case *transport.Error:
			replaced = f
		default:
			t.Fatalf("old registration got %T", f)
		}
	}
	if !errors.Is(replaced, transport.ErrReplaced) {
		t.Errorf("the replaced registration was told %v, want replaced", replaced)
	}
	if got := srv.registered(); !reflect.DeepEqual(got, []string{"b0"}) {
		t.Errorf("registered = %v", got)
	}
	if n, _ := srv.Map().Node("b0"); !n.Live {
		t.Error("the replaced registration's end took b0 down")
	}
}

// TestReplacedRegistrationBacksOff: two processes registering as one
// node (an old one still running beside its replacement) replace each
// other's registration; each says so at error level and registers again
// only after its longest backoff (2s by default), not at once: a
// registration every second or two, not hundreds (each a new map epoch,
// with their two addresses, pushed to every broker).
func TestReplacedRegistrationBacksOff(t *testing.T) {
	p := newPKI(t)
	srv := startCtl(t, p, t.TempDir(), "127.0.0.1:0")
	var errs errorCounter
	for _, addr := range []string{"127.0.0.1:7400", "127.0.0.1:7401"} {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		m, err := ctlclient.Join(ctx, ctlclient.MemberConfig{
			CtlAddr:  srv.Addr(),
			TLS:      p.clientTLS(t, "b0"),
			Node:     transport.Register{NodeID: "b0", Addr: addr},
			LeaseTTL: shortTTL,
			Logger:   slog.New(&errs),
		})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
	}
	epoch0 := srv.Map().Epoch
	time.Sleep(2 * time.Second)
	epochs := srv.Map().Epoch - epoch0
	t.Logf("in 2s: %d map epochs, %d errors logged", epochs, errs.n.Load())
	if epochs > 6 {
		t.Errorf("%d map epochs in 2s of two processes registering as b0: they register again without backing off", epochs)
	}
	if errs.n.Load() == 0 {
		t.Error("no member logged at error level that its registration was replaced")
	}
}

// errorCounter is a slog handler counting the records at error level.
type errorCounter struct{ n atomic.Int64 }

func (c *errorCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *errorCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		c.n.Add(1)
	}
	return nil
}
func (c *errorCounter) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *errorCounter) WithGroup(string) slog.Handler      { return c }

func TestRefresh(t *testing.T) {
	p := newPKI(t)
	srv := startCtl(t, p, t.TempDir(), "127.0.0.1:0")
	m := join(t, p, srv.Addr(), "b0")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := srv.CreateStream(shardmap.StreamConfig{Name: "x", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	want := srv.Map().Epoch
	mp, err := m.Refresh(ctx, want)
	if err != nil || mp.Epoch < want {
		t.Fatalf("Refresh(%d) = epoch %v, %v", want, mp, err)
	}
	// An epoch ctl never reaches: Refresh gives up with ctx.
	short, cancel2 := context.WithTimeout(ctx, 3*shortTTL)
	defer cancel2()
	if _, err := m.Refresh(short, want+100); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Refresh of a future epoch: err=%v, want DeadlineExceeded", err)
	}
}

// TestMemberMapGet: a broker asking map.get for itself on its member's
// connection (Member.Refresh: no principal relayed) gets the whole map,
// ACL included, as its registration stream pushes it; its certificate
// allows it no other request.
func TestMemberMapGet(t *testing.T) {
	p := newPKI(t)
	srv := startCtl(t, p, t.TempDir(), "127.0.0.1:0")
	m := join(t, p, srv.Addr(), "b0")
	if err := srv.CreateStream(shardmap.StreamConfig{Name: "x", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	resp, err := m.Request(ctx, &transport.Request{Op: OpMapGet})
	if err != nil || resp.Map == nil {
		t.Fatalf("map.get on the member's connection: %v, %v; want the current map", resp, err)
	}
	if want := srv.Map(); resp.Map.Epoch != want.Epoch || len(resp.Map.Streams) != 1 || resp.Map.ACL == nil || len(resp.Map.ACL.Superusers) == 0 {
		t.Errorf("map.get for the member: epoch %d, streams %+v, ACL %+v; want epoch %d with stream x and the ACL", resp.Map.Epoch, resp.Map.Streams, resp.Map.ACL, want.Epoch)
	}
	for _, op := range []string{OpStreamList, OpClusterStatus, OpACLList} {
		if _, err := m.Request(ctx, &transport.Request{Op: op}); !errors.Is(err, transport.ErrUnauthorized) {
			t.Errorf("%s for the broker itself: %v, want unauthorized", op, err)
		}
	}
}

func TestJoinGivesUpWithContext(t *testing.T) {
	p := newPKI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	// Nothing listens on this port: Join retries until ctx ends.
	_, err := ctlclient.Join(ctx, ctlclient.MemberConfig{
		CtlAddr:    "127.0.0.1:1",
		TLS:        p.clientTLS(t, "b0"),
		Node:       transport.Register{NodeID: "b0", Addr: "127.0.0.1:7400"},
		MaxBackoff: 50 * time.Millisecond,
		Logger:     testLogger(t),
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("join with no ctl: err=%v, want DeadlineExceeded", err)
	}
}

func TestStreamChangeNotPersistedIsRefused(t *testing.T) {
	dir := t.TempDir()
	srv, err := New(Config{DataDir: dir, Etcd: newPKI(t).etcd(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.CreateStream(shardmap.StreamConfig{Name: "a", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	before := srv.Map()
	// etcd is gone: the state can no longer be written.
	srv.store.timeout = 300 * time.Millisecond
	srv.etcd.embedded.Server.HardStop()
	if err := srv.CreateStream(shardmap.StreamConfig{Name: "b", Shards: 1}); !errors.Is(err, transport.ErrUnavailable) {
		t.Fatalf("create with an unwritable state: err=%v, want ErrUnavailable", err)
	}
	if err := srv.DeleteStream("a"); !errors.Is(err, transport.ErrUnavailable) {
		t.Fatalf("delete with an unwritable state: err=%v, want ErrUnavailable", err)
	}
	if srv.Map() != before || len(srv.Streams()) != 1 {
		t.Errorf("refused changes altered the map: epoch %d, streams %+v", srv.Map().Epoch, srv.Streams())
	}
}
