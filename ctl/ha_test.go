package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/etcdserver/api/rafthttp"
	"go.uber.org/goleak"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/ctl/ctlclient"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// startHA starts n ctls forming an n-member embedded etcd cluster over
// TLS (https peer and client URLs, every member with the PKI's ctl
// certificate), and returns them once one is the leader.
func startHA(t *testing.T, p *testPKI, n int) []*Server {
	t.Helper()
	awaitPeerConnsClosed(t)
	plan := planHA(t, p, n)
	srvs := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			srvs[i], errs[i] = New(plan[i])
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("ctl-%d: %v", i, err)
		}
	}
	startAll(t, srvs)
	waitLeader(t, srvs, nil)
	return srvs
}

// planHA returns the configs of n ctls ctl-0..ctl-n-1 forming an
// n-member embedded etcd cluster on free loopback ports, with https peer
// and client URLs secured by the PKI's ctl certificate.
func planHA(t *testing.T, p *testPKI, n int) []Config {
	t.Helper()
	var peers []string
	urls := make([]etcdURLs, n)
	ports, err := freeTCPPorts(2 * n)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		cp, pp := ports[2*i], ports[2*i+1]
		urls[i] = etcdURLs{Client: fmt.Sprintf("https://127.0.0.1:%d", cp), Peer: fmt.Sprintf("https://127.0.0.1:%d", pp)}
		peers = append(peers, fmt.Sprintf("ctl-%d=%s", i, urls[i].Peer))
	}
	base := t.TempDir()
	cfgs := make([]Config, n)
	for i := range n {
		cfgs[i] = Config{
			Addr:    "127.0.0.1:0",
			DataDir: filepath.Join(base, fmt.Sprint("ctl-", i)),
			TLS:     transport.ServerTLS(p.cert(t, "ctl"), p.ca, transport.ALPNCtl),
			Etcd: EtcdConfig{Name: fmt.Sprint("ctl-", i), ClientURL: urls[i].Client, PeerURL: urls[i].Peer,
				InitialCluster: strings.Join(peers, ","), TickMs: 20, ElectionMs: 200,
				CertFile: filepath.Join(p.dir, "ctl.crt"), KeyFile: filepath.Join(p.dir, "ctl.key"), CAFile: filepath.Join(p.dir, "ca.crt")},
			LeaseTTL:   shortTTL,
			CtlTTL:     time.Second,
			Superusers: []string{transport.DevAdminName},
			Logger:     testLogger(t).With("ctl", i),
		}
	}
	return cfgs
}

// startAll starts srvs, each closed when the test ends.
func startAll(t *testing.T, srvs []*Server) {
	t.Helper()
	for _, s := range srvs {
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
	}
}

// peerConnLinger bounds how long the peer connections of a multi-member
// etcd cluster may outlive its members. Its members talk HTTP on
// listeners whose connections re-arm a read deadline of
// rafthttp.ConnReadTimeout (5s) before every read; net/http ends a
// finished request's background read by setting a deadline in the past,
// which that re-arming can overwrite. The connection then ends, and with
// it the server's goroutines and the peer's idle client connection, when
// the 5s run out.
var peerConnLinger = rafthttp.ConnReadTimeout + 5*time.Second

// awaitPeerConnsClosed registers a cleanup, run after every cleanup
// registered later (the servers' Close), that waits up to peerConnLinger
// for every goroutine started since to end, and fails the test if one
// is left: the leak check of TestMain, with the wait etcd's peer
// connections need.
func awaitPeerConnsClosed(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		deadline := time.Now().Add(peerConnLinger)
		for {
			err := goleak.Find(before)
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("goroutines left %v after the cluster closed: %v", peerConnLinger, err)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// waitLeader waits until exactly one of srvs (other than those in gone)
// leads, and returns it.
func waitLeader(t *testing.T, srvs []*Server, gone map[*Server]bool) *Server {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for time.Now().Before(deadline) {
		var leaders []*Server
		for _, s := range srvs {
			if !gone[s] && s.IsLeader() {
				leaders = append(leaders, s)
			}
		}
		if len(leaders) == 1 {
			return leaders[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no single leader within %v", waitFor)
	return nil
}

// joinCtls registers broker id with the ctls at addrs, in that order
// (as `felix broker --ctl` lists them); it leaves when the test ends.
func joinCtls(t *testing.T, p *testPKI, id string, addrs ...string) *ctlclient.Member {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	m, err := ctlclient.Join(ctx, ctlclient.MemberConfig{
		CtlAddrs: addrs,
		TLS:      p.clientTLS(t, id), Node: transport.Register{NodeID: id, Addr: "127.0.0.1:74" + id[1:]},
		LeaseTTL: shortTTL, MaxBackoff: 100 * time.Millisecond, Logger: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func TestHAFailover(t *testing.T) {
	p := newPKI(t)
	srvs := startHA(t, p, 3)
	leader := waitLeader(t, srvs, nil)
	var follower *Server
	var addrs []string
	for _, s := range srvs {
		addrs = append(addrs, s.Addr())
		if s != leader && follower == nil {
			follower = s
		}
	}

	// A broker registered with a follower is live in the leader's map.
	m := joinCtls(t, p, "b0", follower.Addr())
	waitMap(t, m, "b0 live", func(mp *shardmap.Map) bool { return liveCount(mp) == 1 })

	// A change made on a follower is made by the leader, and the follower
	// holds the new map when it returns.
	if err := follower.CreateStream(shardmap.StreamConfig{Name: "orders", Shards: 4}); err != nil {
		t.Fatal(err)
	}
	if _, ok := follower.Map().Stream("orders"); !ok {
		t.Fatalf("follower's map lacks the stream it forwarded: %+v", follower.Map())
	}
	if err := follower.CreateStream(shardmap.StreamConfig{Name: "orders", Shards: 4}); !errors.Is(err, transport.ErrStreamExists) {
		t.Fatalf("second create through a follower: %v, want ErrStreamExists", err)
	}
	before := leader.Map()

	// Record every map b0 sees from now on: the failover must never show
	// b0 down.
	var mu sync.Mutex
	var seen []*shardmap.Map
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			changed := m.Changed()
			mu.Lock()
			seen = append(seen, m.Map())
			mu.Unlock()
			select {
			case <-changed:
			case <-stop:
				return
			}
		}
	}()

	start := time.Now()
	leader.Close()
	next := waitLeader(t, srvs, map[*Server]bool{leader: true})
	t.Logf("new leader after %v", time.Since(start))

	if err := next.CreateStream(shardmap.StreamConfig{Name: "after", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	mp := waitMap(t, m, "the stream created after the failover", func(mp *shardmap.Map) bool {
		_, ok := mp.Stream("after")
		return ok
	})
	close(stop)
	<-done
	if moves := shardmap.Diff(before, mp); len(moves) != 2 { // the two new shards only
		t.Errorf("failover moved shards: %v", moves)
	}
	mu.Lock()
	defer mu.Unlock()
	last := uint64(0)
	for _, s := range seen {
		if s.Epoch < last {
			t.Errorf("epochs went back: %d after %d", s.Epoch, last)
		}
		last = s.Epoch
		if liveCount(s) != 1 {
			t.Errorf("b0 not live in the map of epoch %d during the failover", s.Epoch)
		}
	}
	st, _ := mp.Stream("after")
	for _, o := range st.Placement.All() {
		if o != "b0" {
			t.Errorf("stream created after the failover placed on %q, want b0", o)
		}
	}
}

// TestCloseWithoutQuorum closes the last ctl of a cluster whose other
// members are gone: its etcd has no quorum, so nothing it writes on the
// way out can succeed, and Close must not wait for it. (etcd's Campaign
// resigns with the client's context when its own is canceled, and the
// client retried that write for nine minutes.)
func TestCloseWithoutQuorum(t *testing.T) {
	p := newPKI(t)
	srvs := startHA(t, p, 3)
	leader := waitLeader(t, srvs, nil)
	last := srvs[0]
	if last == leader {
		last = srvs[1]
	}
	var wg sync.WaitGroup
	for _, s := range srvs {
		if s != last {
			wg.Add(1)
			go func() { defer wg.Done(); s.Close() }()
		}
	}
	wg.Wait()
	start := time.Now()
	last.Close()
	// The resign of a leader waits up to CtlTTL (1s here); etcd's own
	// shutdown a few seconds more.
	if took := time.Since(start); took > 8*time.Second {
		t.Errorf("Close without an etcd quorum took %v", took)
	} else {
		t.Logf("Close without an etcd quorum took %v", took)
	}
}

func TestConflictingWritersCannotBothCommit(t *testing.T) {
	dir := t.TempDir()
	a, err := New(Config{DataDir: filepath.Join(dir, "a"), Name: "a", Etcd: newPKI(t).etcd(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// A store computed from the same revision as a's, as a second ctl
	// that believes it leads would hold.
	other := newStore(a.store.cli, DefaultCluster)
	snap, err := other.load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := a.CreateStream(shardmap.StreamConfig{Name: "x", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	next := snap
	next.Epoch++
	next.Streams = append(next.Streams, shardmap.Stream{StreamConfig: shardmap.StreamConfig{Name: "y", Shards: 1}, Placement: shardmap.NewPlacement("")})
	if err := other.save(context.Background(), next); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale writer: %v, want ErrConflict", err)
	}
	got, err := other.load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Streams) != 1 || got.Streams[0].Name != "x" || got.Epoch != a.Map().Epoch {
		t.Fatalf("etcd holds %+v, want only a's change at epoch %d", got, a.Map().Epoch)
	}
}

func TestImportStateFile(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	s := threeNodes(t)
	if err := s.createStream(shardmap.StreamConfig{Name: "orders", Shards: 4}); err != nil {
		t.Fatal(err)
	}
	g := auth.Grant{Principal: "bob", Action: auth.Publish, Pattern: "orders"}
	if _, err := s.grant(g); err != nil {
		t.Fatal(err)
	}
	if err := saveState(dir, s.snapshot()); err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{DataDir: dir, Etcd: p.etcd(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	m := srv.Map()
	srv.Close()
	if m.Epoch <= s.epoch {
		t.Errorf("imported at epoch %d, want above the file's %d", m.Epoch, s.epoch)
	}
	if moves := shardmap.Diff(s.Map(), m); len(m.Nodes) != 3 || len(moves) != 0 {
		t.Errorf("import: %d members, moves %v; want 3 and none", len(m.Nodes), moves)
	}
	if len(m.ACL.Grants) != 1 || m.ACL.Grants[0] != g {
		t.Errorf("imported grants %+v, want %+v", m.ACL.Grants, g)
	}
	if _, err := loadState(dir); err != nil {
		t.Fatal(err)
	}
	if snap, _ := loadState(dir); snap.Epoch != 0 {
		t.Errorf("state file still in place after import")
	}
	// Starting again reads etcd, not the renamed file.
	srv, err = New(Config{DataDir: dir, Etcd: p.etcd(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if _, ok := srv.Map().Stream("orders"); !ok || srv.Map().Epoch < m.Epoch {
		t.Errorf("after restart: %+v", srv.Map())
	}
}

// TestWriterRecorded checks that every commit records, in the same
// transaction, the ctl and the election key it was made under.
func TestWriterRecorded(t *testing.T) {
	a, err := New(Config{DataDir: t.TempDir(), Name: "a", Etcd: newPKI(t).etcd(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.CreateStream(shardmap.StreamConfig{Name: "x", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ep, err := a.store.cli.Get(ctx, a.store.epochKey())
	if err != nil {
		t.Fatal(err)
	}
	wr, err := a.store.cli.Get(ctx, a.store.writerKey())
	if err != nil {
		t.Fatal(err)
	}
	if len(ep.Kvs) != 1 || len(wr.Kvs) != 1 {
		t.Fatalf("epoch %v, writer %v: want one key each", ep.Kvs, wr.Kvs)
	}
	if ep.Kvs[0].ModRevision != wr.Kvs[0].ModRevision {
		t.Errorf("epoch written at revision %d, writer at %d: not one transaction", ep.Kvs[0].ModRevision, wr.Kvs[0].ModRevision)
	}
	var w writerRecord
	if err := json.Unmarshal(wr.Kvs[0].Value, &w); err != nil {
		t.Fatal(err)
	}
	el, err := a.store.cli.Get(ctx, w.Election)
	if err != nil {
		t.Fatal(err)
	}
	if w.Name != "a" || w.ID != a.regToken || len(el.Kvs) != 1 || !strings.HasPrefix(w.Election, a.store.electionPrefix()+"/") {
		t.Errorf("writer %+v (election key found: %d), want ctl a, run %s, under its live election key", w, len(el.Kvs), a.regToken)
	}
}

// TestExternalEtcdMember runs a ctl against a standalone member
// (StartEtcdMember, as `felix etcd` does) through EtcdConfig.Endpoints.
func TestExternalEtcdMember(t *testing.T) {
	m, err := StartEtcdMember(t.TempDir(), EtcdConfig{Name: "etcd-0"}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	dir := t.TempDir()
	s, err := New(Config{DataDir: dir, Name: "a", Etcd: EtcdConfig{Endpoints: []string{m.ClientURL()}}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateStream(shardmap.StreamConfig{Name: "x", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	epoch := s.Map().Epoch
	s.Close()
	if _, err := os.Stat(filepath.Join(dir, "etcd")); err == nil {
		t.Errorf("a ctl with Endpoints started an etcd of its own in %s", dir)
	}
	s, err = New(Config{DataDir: dir, Name: "a", Etcd: EtcdConfig{Endpoints: []string{m.ClientURL()}}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.Map().Stream("x"); !ok || s.Map().Epoch < epoch {
		t.Errorf("after a restart against the same etcd: %+v, want stream x at epoch %d or later", s.Map(), epoch)
	}
}

// TestGrantThroughFollower: a grant or revoke made through a follower is
// in the follower's map when the call returns, as a stream change is, so
// an acl.list right after on the same ctl shows it.
func TestGrantThroughFollower(t *testing.T) {
	p := newPKI(t)
	srvs := startHA(t, p, 3)
	leader := waitLeader(t, srvs, nil)
	follower := srvs[0]
	if follower == leader {
		follower = srvs[1]
	}
	for i := range 5 {
		g := auth.Grant{Principal: fmt.Sprint("user-", i), Action: auth.Publish, Pattern: "orders"}
		if err := follower.Grant(g); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(follower.Map().ACL.Grants, g) {
			t.Fatalf("grant %d: the follower's map (epoch %d) lacks it right after the grant returned", i, follower.Map().Epoch)
		}
		if err := follower.Revoke(g); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(follower.Map().ACL.Grants, g) {
			t.Fatalf("revoke %d: the follower's map (epoch %d) still has it right after the revoke returned", i, follower.Map().Epoch)
		}
	}
}

// TestHAFollowerCutOffFromEtcdHandsOverItsBrokers cuts a follower's etcd
// member off from the two others (a partition between ctl hosts; brokers
// still reach it). It cannot renew its brokers' leases: it must hand
// their registrations over before the leases run out, so that they
// register with a ctl on the quorum's side and the leader never marks
// them down, and answer map.get with CodeUnavailable rather than its
// stale map. Healed, it serves map.get again.
func TestHAFollowerCutOffFromEtcdHandsOverItsBrokers(t *testing.T) {
	p := newPKI(t)
	leader, follower, other, m := haWithBrokerOnFollower(t, p)
	srvs := []*Server{leader, follower, other}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	admin, err := dialAs(ctx, t, p, follower.Addr(), transport.DevAdminName)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()

	// Cut the follower's etcd member off from the two others, both ways.
	fe := follower.etcd.embedded.Server
	for _, s := range srvs {
		if s == follower {
			continue
		}
		se := s.etcd.embedded.Server
		fe.CutPeer(se.MemberID())
		se.CutPeer(fe.MemberID())
	}
	mended := false
	mend := func() {
		if mended {
			return
		}
		mended = true
		for _, s := range srvs {
			if s != follower {
				fe.MendPeer(s.etcd.embedded.Server.MemberID())
				s.etcd.embedded.Server.MendPeer(fe.MemberID())
			}
		}
	}
	defer mend()
	start := time.Now()
	var downSince time.Time
	var refused error
	for time.Since(start) < 6*time.Second {
		l := waitLeader(t, []*Server{leader, other}, nil)
		if liveCount(l.Map()) == 1 {
			downSince = time.Time{}
		} else if downSince.IsZero() {
			downSince = time.Now()
		}
		if refused == nil {
			rctx, rcancel := context.WithTimeout(ctx, time.Second)
			if _, err := admin.Request(rctx, &transport.Request{Op: OpMapGet}); errors.Is(err, transport.ErrUnavailable) {
				refused = err
			}
			rcancel()
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !downSince.IsZero() {
		t.Fatalf("b0 is up and can reach two ctls with a quorum, but the leader's map has shown it down for %v (since %v after the partition began); b0 holds epoch %d",
			time.Since(downSince).Round(time.Millisecond), downSince.Sub(start).Round(time.Millisecond), m.Map().Epoch)
	}
	if got := follower.registered(); len(got) != 0 {
		t.Errorf("the cut-off follower still holds the registrations of %v", got)
	}
	if got := other.registered(); !slices.Equal(got, []string{"b0"}) {
		t.Errorf("b0 did not move to the next ctl of its list: it holds %v", got)
	}
	if refused == nil {
		t.Errorf("the cut-off follower answered map.get with its map (epoch %d; the leader's is %d)", follower.Map().Epoch, leader.Map().Epoch)
	} else {
		t.Logf("map.get on the cut-off follower: %v", refused)
	}
	// Every other read answers from the same map.
	for _, op := range []string{OpStreamList, OpClusterStatus, OpACLList} {
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		_, err := admin.Request(rctx, &transport.Request{Op: op})
		rcancel()
		if !errors.Is(err, transport.ErrUnavailable) {
			t.Errorf("%s on the cut-off follower: %v; want unavailable", op, err)
		}
	}
	if err := follower.Readiness(); err == nil {
		t.Errorf("the cut-off follower reports itself ready")
	} else {
		t.Logf("readiness of the cut-off follower: %v", err)
	}

	// Healed, it reads etcd again and answers map.get.
	mend()
	deadline := time.Now().Add(waitFor)
	for {
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		resp, err := admin.Request(rctx, &transport.Request{Op: OpMapGet})
		rcancel()
		if err == nil && resp.Map != nil && resp.Map.Epoch == leader.Map().Epoch {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("map.get on the follower after the partition healed: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := follower.Readiness(); err != nil {
		t.Errorf("the follower after the partition healed: %v", err)
	}
}

// TestHAWedgedFollowerLosesItsBrokers: a ctl whose registration handling
// is stuck (here its state lock held, as by a deadlock or a request hung
// while holding it) while its QUIC stack still answers reads its brokers'
// heartbeats no more, so it answers none, and renews no lease. The broker
// drops the registration when no answer came for half a lease and
// registers with the next ctl of its list, which adopts its lease: the
// leader's map keeps it live. (Without answers the broker could not tell:
// its link's idle timeout never fires, quic-go acknowledging its packets,
// and the ctl's own hand-over is stuck with the rest.)
func TestHAWedgedFollowerLosesItsBrokers(t *testing.T) {
	p := newPKI(t)
	leader, follower, other, m := haWithBrokerOnFollower(t, p)

	follower.mu.Lock() // wedge the follower's registration handling
	wedged := true
	unwedge := func() {
		if wedged {
			wedged = false
			follower.mu.Unlock()
		}
	}
	defer unwedge()
	start := time.Now()
	var downSince time.Time
	var down time.Duration // in all
	for time.Since(start) < 4*time.Second {
		if liveCount(leader.Map()) == 1 {
			if !downSince.IsZero() {
				down += time.Since(downSince)
			}
			downSince = time.Time{}
		} else if downSince.IsZero() {
			downSince = time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
	onOther, onLeader := other.registered(), leader.registered()
	unwedge()
	if !downSince.IsZero() {
		down += time.Since(downSince)
	}
	t.Logf("b0 shown down for %v in all while the follower was wedged; registered with other=%v leader=%v", down.Round(time.Millisecond), onOther, onLeader)
	if !downSince.IsZero() {
		t.Fatalf("b0 is up, two healthy ctls of its list have a quorum, yet the leader's map has shown it down for %v (since %v after the follower wedged; lease %v); b0 unlinked for %v, registered with other=%v leader=%v",
			time.Since(downSince).Round(time.Millisecond), downSince.Sub(start).Round(time.Millisecond), shortTTL, m.Unlinked(), onOther, onLeader)
	}
	if !slices.Equal(onOther, []string{"b0"}) {
		t.Errorf("b0 did not move to the next ctl of its list: it is registered with other=%v leader=%v", onOther, onLeader)
	}
}

// haWithBrokerOnFollower starts three ctls and joins broker b0, listing a
// follower first, then the other follower and the leader, and waits until
// b0 is live, registered with that follower.
func haWithBrokerOnFollower(t *testing.T, p *testPKI) (leader, follower, other *Server, m *ctlclient.Member) {
	t.Helper()
	srvs := startHA(t, p, 3)
	leader = waitLeader(t, srvs, nil)
	for _, s := range srvs {
		switch {
		case s == leader:
		case follower == nil:
			follower = s
		default:
			other = s
		}
	}
	m = joinCtls(t, p, "b0", follower.Addr(), other.Addr(), leader.Addr())
	waitMap(t, m, "b0 live", func(mp *shardmap.Map) bool { return liveCount(mp) == 1 })
	if got := follower.registered(); !slices.Equal(got, []string{"b0"}) {
		t.Fatalf("b0 registered with the follower: %v", got)
	}
	return leader, follower, other, m
}

// TestFollowerReadsAgainAfterAFailedRead: a follower ctl whose read of the
// state the leader just committed fails (as one during an etcd leader
// change can) reads it again, as after a broken watch, and its broker
// gets the new map: here the revoke of a grant. It held the old map, the
// grant in force, until some other change was committed.
func TestFollowerReadsAgainAfterAFailedRead(t *testing.T) {
	p := newPKI(t)
	leader, follower, _, m := haWithBrokerOnFollower(t, p)
	g := auth.Grant{Principal: "mallory", Action: auth.Publish, Pattern: "orders"}
	if err := leader.Grant(g); err != nil {
		t.Fatal(err)
	}
	waitMap(t, m, "the grant", func(mp *shardmap.Map) bool { return slices.Contains(mp.ACL.Grants, g) })
	fault := errors.New("etcdserver: leader changed (injected)")
	follower.store.readNext.Store(&fault)
	if err := leader.Revoke(g); err != nil {
		t.Fatal(err)
	}
	waitMap(t, m, "the grant revoked", func(mp *shardmap.Map) bool { return !slices.Contains(mp.ACL.Grants, g) })
	if follower.store.readNext.Load() != nil {
		t.Fatal("the follower's read never failed: the test tested nothing")
	}
}

// TestCtlStatusListsAStoppedMember: cluster status lists a stopped
// member of a control plane of three, as down (it listed the live ones
// only, and an operator could not see the control plane one failure from
// losing its quorum).
func TestCtlStatusListsAStoppedMember(t *testing.T) {
	p := newPKI(t)
	srvs := startHA(t, p, 3)
	leader, gone := leaderAndFollower(t, srvs)
	if ms := leader.ctlMembers(); len(ms) != 3 {
		t.Fatalf("%d members listed with all three up: %+v", len(ms), ms)
	}
	name := gone.name()
	gone.Close()
	deadline := time.Now().Add(waitFor)
	for {
		ms := leader.ctlMembers()
		var roles []string
		downs := 0
		for _, m := range ms {
			roles = append(roles, m.Name+":"+m.Role)
			if m.Role == "down" {
				downs++
				if m.EtcdHealthy {
					t.Errorf("the stopped member %s: etcd healthy, want its error", m.Name)
				}
			}
		}
		if len(ms) == 3 && downs == 1 {
			t.Logf("after %s stopped: %v", name, roles)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s stopped: %v; want three members, one down", name, roles)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
