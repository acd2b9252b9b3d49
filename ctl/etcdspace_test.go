package ctl

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/felix-broker/felix/ctl/ctlclient"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// plainEtcd starts an etcd as an operator's (etcd's own defaults unless
// tweak changes them), on loopback plain http, and returns its client URL.
func plainEtcd(t *testing.T, tweak func(*embed.Config)) string {
	t.Helper()
	c := embed.NewConfig()
	c.Dir = filepath.Join(t.TempDir(), "etcd")
	cu, _ := url.Parse("http://127.0.0.1:0")
	pu, _ := url.Parse("http://127.0.0.1:0")
	c.ListenClientUrls, c.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	c.ListenPeerUrls, c.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	c.InitialCluster = c.Name + "=" + pu.String()
	c.TickMs, c.ElectionMs = 10, 100
	c.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	if tweak != nil {
		tweak(c)
	}
	e, err := embed.StartEtcd(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(20 * time.Second):
		t.Fatal("etcd not ready")
	}
	return "http://" + e.Clients[0].Addr().String()
}

// TestEtcdRefusalClassified: the errors etcd answers a transaction it
// refuses before applying it, as clientv3 returns them, are told from
// failures of unknown outcome; NOSPACE is not among them (etcd applies
// the write that passes the quota and answers it with NOSPACE).
func TestEtcdRefusalClassified(t *testing.T) {
	ep := plainEtcd(t, func(c *embed.Config) { c.MaxTxnOps, c.MaxRequestBytes = 2, 8<<10 })
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, MaxCallSendMsgSize: maxEtcdRequest, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	_, tooMany := cli.Txn(ctx).Then(clientv3.OpPut("a", "1"), clientv3.OpPut("b", "1"), clientv3.OpPut("c", "1")).Commit()
	_, tooLarge := cli.Put(ctx, "big", strings.Repeat("x", 64<<10))             // over --max-request-bytes
	_, overGRPC := cli.Put(ctx, "bigger", strings.Repeat("x", 1<<20))           // over gRPC's receive limit (max-request-bytes + 512 KiB)
	_, overSend := cli.Put(ctx, "biggest", strings.Repeat("x", maxEtcdRequest)) // over the client's send limit
	short, c2 := context.WithTimeout(ctx, time.Nanosecond)
	defer c2()
	_, timedOut := cli.Put(short, "a", "1")
	for _, tc := range []struct {
		name    string
		err     error
		refused bool
	}{
		{"too many ops", tooMany, true},
		{"request too large", tooLarge, true},
		{"over gRPC's receive limit", overGRPC, true},
		{"over the client's send limit", overSend, true},
		{"timed out", timedOut, false},
		{"no space", fmt.Errorf("ctl: commit: %w", rpctypes.ErrNoSpace), false},
	} {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		what, ok := etcdRefusal(fmt.Errorf("ctl: commit epoch 7 to etcd: %w", tc.err))
		t.Logf("%s: %v: refused %v (%s)", tc.name, tc.err, ok, what)
		if ok != tc.refused {
			t.Errorf("%s (%v): refused %v, want %v", tc.name, tc.err, ok, tc.refused)
		}
	}
}

// TestChangeOverEtcdRequestLimitIsTyped: an admin change whose
// transaction an external etcd refuses (over its --max-request-bytes) is
// answered limit_exceeded at once, not unavailable "may have been made"
// (which the SDK retries for 15s), and the next change goes through.
func TestChangeOverEtcdRequestLimitIsTyped(t *testing.T) {
	p := newPKI(t)
	ep := plainEtcd(t, func(c *embed.Config) { c.MaxRequestBytes = 8 << 10 })
	srv, err := New(Config{Addr: "127.0.0.1:0", DataDir: t.TempDir(), TLS: transport.ServerTLS(p.cert(t, "ctl"), p.ca, transport.ALPNCtl),
		LeaseTTL: shortTTL, Superusers: []string{transport.DevAdminName}, Logger: testLogger(t),
		Etcd: EtcdConfig{Endpoints: []string{ep}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	join(t, p, srv.Addr(), "b0")
	start := time.Now()
	err = srv.CreateStream(shardmap.StreamConfig{Name: "wide", Shards: shardmap.MaxShards}) // owners: ~20 KiB
	t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if we := wireError(err); err == nil || we.Code != transport.CodeLimitExceeded || strings.Contains(err.Error(), "may have been made") {
		t.Errorf("a create over etcd's request limit: want limit_exceeded, its outcome known; got %v", err)
	}
	if err := srv.CreateStream(shardmap.StreamConfig{Name: "small", Shards: 1}); err != nil {
		t.Errorf("a small create after it: %v", err)
	}
}

// TestEtcdNoSpaceRecovers: the embedded etcd's quota (8 MiB here) filled
// by create/delete churn of a large stream. The change etcd refuses is
// answered limit_exceeded, saying the control plane recovers; then ctl
// compacts and defragments etcd and disarms the NOSPACE alarm by itself:
// a change goes through and a broker can register within seconds.
// (Before, every change failed for good, as did every registration.)
func TestEtcdNoSpaceRecovers(t *testing.T) {
	dir := t.TempDir()
	id := "n0-" + strings.Repeat("x", 125) // 4096 owners: ~530 KB a stream
	if err := transport.GenerateDevCerts(dir, "ctl", id, "b1"); err != nil {
		t.Fatal(err)
	}
	p := &testPKI{dir: dir}
	var err error
	if p.ca, err = transport.LoadCA(filepath.Join(dir, "ca.crt")); err != nil {
		t.Fatal(err)
	}
	srv := startCtlWith(t, p, Config{Knobs: Knobs{EtcdQuotaBytes: 8 << 20, EtcdCheckEvery: 200 * time.Millisecond}})
	joinAs := func(node string) (*ctlclient.Member, error) {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		return ctlclient.Join(ctx, ctlclient.MemberConfig{CtlAddr: srv.Addr(), TLS: p.clientTLS(t, node),
			Node: transport.Register{NodeID: node, Addr: "127.0.0.1:7401"}, LeaseTTL: time.Second, MaxBackoff: 100 * time.Millisecond, Logger: testLogger(t)})
	}
	m0, err := joinAs(id)
	if err != nil {
		t.Fatal(err)
	}
	defer m0.Close()
	cycles := 0
	for ; cycles < 100; cycles++ {
		if err = srv.CreateStream(shardmap.StreamConfig{Name: "churn", Shards: shardmap.MaxShards}); err != nil {
			break
		}
		if err = srv.DeleteStream("churn"); err != nil {
			break
		}
	}
	st := srv.Stats()
	t.Logf("after %d cycles: %v; etcd db %d bytes, %d in use, NOSPACE %v", cycles, err, st.EtcdDBBytes, st.EtcdDBInUseBytes, st.EtcdNoSpace)
	if err == nil {
		t.Fatal("the quota was never reached")
	}
	if we := wireError(err); we.Code != transport.CodeLimitExceeded || !strings.Contains(err.Error(), "NOSPACE") {
		t.Errorf("a change refused for NOSPACE: want limit_exceeded naming it, got %v", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		err = srv.CreateStream(shardmap.StreamConfig{Name: "after", Shards: 1})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("15s after NOSPACE, changes still fail: %v", err)
	}
	m1, err := joinAs("b1")
	if err != nil {
		t.Fatalf("a broker registering after the recovery: %v", err)
	}
	defer m1.Close()
	if st := srv.Stats(); st.EtcdDefrags == 0 || st.EtcdNoSpace {
		t.Errorf("stats after recovery: %+v", st)
	}
}
