package ctl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// longGrant is grant i with a principal and a pattern of n bytes each.
func longGrant(i, n int) auth.Grant {
	p := fmt.Sprintf("p%06d-", i)
	return auth.Grant{Principal: p + strings.Repeat("x", max(0, n-len(p))), Action: auth.Publish, Pattern: p + strings.Repeat("t", max(0, n-1-len(p))) + "*"}
}

func pushedFrameLen(t *testing.T, m *shardmap.Map) int {
	t.Helper()
	b, err := transport.AppendFrame(nil, &transport.MapUpdate{Map: m, Features: transport.Features(), LeaseTTL: DefaultLeaseTTL})
	if err != nil {
		t.Fatal(err)
	}
	return len(b) - 4
}

// TestMapSizerMeasuresThePushedFrame: the size checkMapSize compares with
// its limit is the length of the frame writeMaps sends, but for the
// epoch and the lease (each counted as its longest encoding, up to 8
// bytes more), for grants of every string
// header length and numbers of grants past each array header; and a
// grant or revoke is measured without encoding the map again.
func TestMapSizerMeasuresThePushedFrame(t *testing.T) {
	s := threeNodes(t)
	s.maxGrants = 1 << 20
	var z mapSizer
	check := func(what string) {
		t.Helper()
		got, err := z.frameBytes(s.Map())
		if err != nil {
			t.Fatal(err)
		}
		want := pushedFrameLen(t, s.Map())
		if got < want || got > want+16 {
			t.Fatalf("%s: measured %d bytes, the frame is %d", what, got, want)
		}
	}
	check("no streams, no grants")
	for i, st := range []shardmap.StreamConfig{{Name: "a", Shards: 3}, {Name: "b", Shards: 40, Replicas: 3, RetentionBytes: 1 << 30}} {
		if err := s.createStream(st); err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("stream %d", i))
	}
	i := 0
	for _, n := range []int{1, 30, 31, 32, 33, 100, 254, 255, 256} {
		for range 3 {
			if _, err := s.grant(longGrant(i, n)); err != nil {
				t.Fatal(err)
			}
			i++
			check(fmt.Sprintf("%d grants, the last of %d bytes", i, n))
		}
	}
	grants := s.policy.Grants
	for ; i < 70000; i++ { // past array16; set at once, as 70,000 grants would take minutes under -race
		grants = append(grants, longGrant(i, 8))
	}
	s.policy = auth.NewPolicy(nil, grants)
	s.bumpPolicy()
	check("70000 grants")
	encodes := z
	if err := s.revoke(longGrant(5, 30)); err != nil {
		t.Fatal(err)
	}
	check("a revoke")
	if _, err := s.grant(longGrant(i, 256)); err != nil {
		t.Fatal(err)
	}
	check("one more grant")
	if !sameSlice(z.streams, encodes.streams) || !sameSlice(z.nodes, encodes.nodes) {
		t.Fatal("a grant or revoke made the sizer encode the map again: its map did not keep the nodes and streams")
	}
	if err := s.deleteStream("a"); err != nil {
		t.Fatal(err)
	}
	check("a stream deleted")
}

// TestGrantLimit: grants past maxGrants are refused with limit_exceeded
// and change nothing; granting one held already, and revoking, still go
// through, and a revoke makes room.
func TestGrantLimit(t *testing.T) {
	s := threeNodes(t)
	s.maxGrants = 3
	for i := range 3 {
		if _, err := s.grant(longGrant(i, 16)); err != nil {
			t.Fatal(err)
		}
	}
	epoch := s.Map().Epoch
	_, err := s.grant(longGrant(3, 16))
	if !errors.Is(err, ErrLimitExceeded) {
		t.Fatalf("grant past the limit: err=%v, want ErrLimitExceeded", err)
	}
	if we := wireError(err); we.Code != transport.CodeLimitExceeded || !strings.Contains(we.Error(), "--max-grants") {
		t.Fatalf("wire error %v (code %v), want limit_exceeded naming --max-grants", we, we.Code)
	}
	if s.Map().Epoch != epoch || len(s.Map().ACL.Grants) != 3 {
		t.Fatalf("a refused grant changed the map: epoch %d -> %d, %d grants", epoch, s.Map().Epoch, len(s.Map().ACL.Grants))
	}
	if changed, err := s.grant(longGrant(1, 16)); err != nil || changed {
		t.Fatalf("granting a held grant at the limit: changed=%v err=%v, want no change and no error", changed, err)
	}
	if err := s.revoke(longGrant(0, 16)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.grant(longGrant(3, 16)); err != nil {
		t.Fatalf("grant after a revoke made room: %v", err)
	}

	// The default.
	s = threeNodes(t)
	var grants []auth.Grant
	for i := range DefaultMaxGrants - 1 {
		grants = append(grants, longGrant(i, 8))
	}
	s.policy = auth.NewPolicy(nil, grants)
	if _, err := s.grant(longGrant(DefaultMaxGrants-1, 8)); err != nil {
		t.Fatalf("grant %d: %v", DefaultMaxGrants, err)
	}
	if _, err := s.grant(longGrant(DefaultMaxGrants, 8)); !errors.Is(err, ErrLimitExceeded) {
		t.Fatalf("grant %d: err=%v, want ErrLimitExceeded", DefaultMaxGrants+1, err)
	}
}

// startCtlWith starts a ctl as startCtl does, with cfg's limits and
// knobs.
func startCtlWith(t *testing.T, p *testPKI, cfg Config) *Server {
	t.Helper()
	cfg.Addr, cfg.DataDir = "127.0.0.1:0", t.TempDir()
	cfg.TLS = transport.ServerTLS(p.cert(t, "ctl"), p.ca, transport.ALPNCtl)
	cfg.Etcd = p.etcd()
	cfg.LeaseTTL, cfg.Superusers = shortTTL, []string{transport.DevAdminName}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	return startConfig(t, cfg)
}

// TestMapSizeLimit: with the map's limit lowered (Knobs.MaxMapBytes),
// grants and a stream create that would take the map past it are
// refused with limit_exceeded, over the wire too, naming the limit and
// the size, before anything is committed: the map stays as it was, and
// the broker registered stays live and holds it. A change that shrinks
// the map goes through. Without the check each was committed, and at the
// real limit (64 MiB) every broker's registration then failed to encode
// the map and ended, the broker marked down, in a loop.
func TestMapSizeLimit(t *testing.T) {
	p := newPKI(t)
	const limit = 64 << 10
	srv := startCtlWith(t, p, Config{Knobs: Knobs{MaxMapBytes: limit}})
	b0 := join(t, p, srv.Addr(), "b0")
	waitMap(t, b0, "b0 live", func(m *shardmap.Map) bool { n, ok := m.Node("b0"); return ok && n.Live })
	if err := srv.CreateStream(shardmap.StreamConfig{Name: "orders", Shards: 4}); err != nil {
		t.Fatal(err)
	}

	granted := 0
	var err error
	for granted < 1000 {
		if err = srv.Grant(longGrant(granted, 256)); err != nil {
			break
		}
		granted++
	}
	var big *MapTooLargeError
	if !errors.As(err, &big) || !errors.Is(err, ErrLimitExceeded) {
		t.Fatalf("%d grants of 512 bytes taken under a map limit of %d bytes, then err=%v; want a *MapTooLargeError matching ErrLimitExceeded", granted, limit, err)
	}
	if big.Limit != limit || big.Bytes <= limit {
		t.Fatalf("refusal says %d bytes over a limit of %d, want over %d", big.Bytes, big.Limit, limit)
	}
	frame := pushedFrameLen(t, srv.Map())
	if frame > limit || frame+600 < limit {
		t.Fatalf("%d grants taken: the map's frame is %d bytes, want within a grant of the limit %d", granted, frame, limit)
	}
	t.Logf("%d grants taken, map frame %d bytes; refused: %v", granted, frame, err)
	m := srv.Map()

	// Over the wire, and for a stream create.
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	admin, err := dialAs(ctx, t, p, srv.Addr(), transport.DevAdminName)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	_, err = admin.Request(ctx, &transport.Request{Op: OpACLGrant, Grant: longGrant(granted, 256)})
	if !errors.Is(err, transport.ErrLimitExceeded) || !strings.Contains(err.Error(), fmt.Sprintf("limit of 0.1 MiB (%d bytes", limit)) {
		t.Fatalf("grant over the wire: %v, want limit_exceeded naming the limit", err)
	}
	_, err = admin.Request(ctx, &transport.Request{Op: OpStreamCreate, Stream: shardmap.StreamConfig{Name: "wide", Shards: 400}})
	if !errors.Is(err, transport.ErrLimitExceeded) {
		t.Fatalf("stream create over the wire: %v, want limit_exceeded", err)
	}
	if srv.Map() != m {
		t.Fatalf("refused changes changed the map: epoch %d -> %d", m.Epoch, srv.Map().Epoch)
	}

	// The cluster keeps working: b0 holds the map and stays live.
	waitMap(t, b0, "b0 holds the last map", func(bm *shardmap.Map) bool { return bm.Epoch == m.Epoch })
	deadline := time.Now().Add(2 * shortTTL)
	for time.Now().Before(deadline) {
		if n, _ := srv.Map().Node("b0"); !n.Live {
			t.Fatal("b0 marked down after refused changes")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if srv.Map().Epoch != m.Epoch || b0.Map().Epoch != m.Epoch {
		t.Fatalf("epochs moved: ctl %d, b0 %d, want %d", srv.Map().Epoch, b0.Map().Epoch, m.Epoch)
	}

	// What shrinks the map goes through, over the limit or not; then
	// there is room again.
	if err := srv.Revoke(longGrant(0, 256)); err != nil {
		t.Fatalf("revoke: %v", err)
	}
	if err := srv.CreateStream(shardmap.StreamConfig{Name: "small", Shards: 1}); err != nil {
		t.Fatalf("a small stream after a revoke made room: %v", err)
	}
	waitMap(t, b0, "b0 holds the map with the new stream", func(bm *shardmap.Map) bool { _, ok := bm.Stream("small"); return ok })
}

// TestMapNotSentIsLogged: a map a registration's writer cannot encode is
// logged at error level once per epoch, naming its size and the limit;
// a write that failed is not.
func TestMapNotSentIsLogged(t *testing.T) {
	var buf bytes.Buffer
	s := &Server{log: slog.New(slog.NewTextHandler(&buf, nil))}
	tooLarge := &transport.Error{Code: transport.CodeFrameTooLarge, Message: "map frame of 70000000 bytes, limit 67108864"}
	for _, node := range []string{"b0", "b1", "b0"} {
		s.mapNotSent(node, &shardmap.Map{Epoch: 7}, tooLarge)
	}
	s.mapNotSent("b0", &shardmap.Map{Epoch: 8}, errors.New("transport: writing frame: stream reset"))
	if n := strings.Count(buf.String(), "level=ERROR"); n != 1 || !strings.Contains(buf.String(), "70000000 bytes") || !strings.Contains(buf.String(), "limit_bytes=67108864") {
		t.Fatalf("want one error line for epoch 7 naming the size and limit, got %d:\n%s", n, buf.String())
	}
	s.mapNotSent("b0", &shardmap.Map{Epoch: 9}, tooLarge)
	if n := strings.Count(buf.String(), "level=ERROR"); n != 2 {
		t.Fatalf("a later epoch: want a second line, got %d:\n%s", n, buf.String())
	}
}

// TestMapFrameEncodedOnce checks that a map pushed to many brokers is
// encoded once: every writer sending it gets the same frame, which
// decodes to the map; a newer map replaces it, and a writer still behind
// with an older one encodes that for itself without evicting the newer.
func TestMapFrameEncodedOnce(t *testing.T) {
	var s Server
	m1 := &shardmap.Map{Epoch: 1, Streams: []shardmap.Stream{{StreamConfig: shardmap.StreamConfig{Name: "a", Shards: 1}, Placement: shardmap.NewPlacement("b0")}}}
	m2 := &shardmap.Map{Epoch: 2}
	frame := func(m *shardmap.Map) []byte {
		t.Helper()
		f, err := s.mapFrameOf(m)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	f1 := frame(m1)
	if g := frame(m1); &g[0] != &f1[0] {
		t.Fatal("the same map was encoded twice")
	}
	got, err := transport.NewReader(bytes.NewReader(f1), 0).Read()
	if err != nil {
		t.Fatal(err)
	}
	if mu := got.(*transport.MapUpdate); mu.Map.Epoch != 1 || len(mu.Map.Streams) != 1 || !slices.Equal(mu.Features, transport.Features()) {
		t.Fatalf("decoded %+v", mu)
	}
	f2 := frame(m2)
	if g := frame(m1); &g[0] == &f1[0] || &g[0] == &f2[0] {
		t.Fatal("an older map's frame came from the cache")
	}
	if g := frame(m2); &g[0] != &f2[0] {
		t.Fatal("an older map's encoding evicted the newer one's")
	}
}
