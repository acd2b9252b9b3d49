package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/ctl"
	"github.com/felix-broker/felix/ctl/ctlclient"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestAdminAnswersOverDefaultFrame: a map over transport.DefaultMaxFrame
// (4 MiB), well within the control plane's limits, reaches an admin
// client through a broker: map.get answered from the broker's map, and
// stream.create relayed from the control plane, whose answer carries the
// map (as cluster.status's, stream.info's and stream.move's do: the same
// relay). The broker wrote its answers with the 4 MiB default,
// silently failing, and the SDK read them with it: CreateStream said the
// outcome was unknown although the stream was made.
//
// The map is made as small as it can be and still be over 4 MiB: three
// members whose node ids are 240 bytes (as long as a DNS name of a
// certificate comfortably goes) hold the replicas of two streams of
// 3,200 shards, about 730 bytes a shard, and leave (keeping their
// shards) before the broker joins, so that no change is pushed to them.
func TestAdminAnswersOverDefaultFrame(t *testing.T) {
	dir := t.TempDir()
	var members []string
	for i := range 3 {
		members = append(members, fmt.Sprintf("n%d.", i)+strings.Repeat("z", 62)+"."+strings.Repeat("y", 62))
	}
	ids := append([]string{"ctl", cluster.BrokerID(0)}, members...)
	if err := transport.GenerateDevCerts(filepath.Join(dir, "certs"), ids...); err != nil {
		t.Fatal(err)
	}
	// A lease longer than the default: a member drops its registration
	// when the control plane answers no heartbeat for half a lease, and
	// the control plane's answers wait behind its pushes of the map on
	// the registration's stream, which under the race detector take
	// seconds at this size. A dropped registration ends the relayed
	// request in flight, which is not what this test is about.
	const lease = 10 * time.Second
	ctlTLS, err := cluster.CtlServerTLS(filepath.Join(dir, "certs"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := ctl.New(ctl.Config{Addr: "127.0.0.1:0", DataDir: filepath.Join(dir, "ctl"), TLS: ctlTLS, Etcd: cluster.CtlEtcd(filepath.Join(dir, "certs"), ""), LeaseTTL: lease,
		Superusers: []string{transport.DevAdminName}, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	ip := &inproc{t: t, dir: dir, ctl: c, tweak: func(cfg *Config) { cfg.LeaseTTL = lease }}
	t.Cleanup(ip.close)
	var joined []*ctlclient.Member
	for i, id := range members {
		nt, err := cluster.LoadNodeTLS(filepath.Join(dir, "certs"), id)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		m, err := ctlclient.Join(ctx, ctlclient.MemberConfig{CtlAddr: c.Addr(), TLS: nt.Ctl,
			Node: transport.Register{NodeID: id, Addr: fmt.Sprintf("127.0.0.1:%d", 17000+i)}, LeaseTTL: lease, Logger: quiet()})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		joined = append(joined, m)
	}
	for _, m := range joined {
		m.Close()
	}
	for i := range 3 {
		if err := c.CreateStream(shardmap.StreamConfig{Name: fmt.Sprintf("big-%d", i), Shards: 3700, Replicas: 3}); err != nil {
			t.Fatal(err)
		}
	}
	ip.brokers = append(ip.brokers, ip.startBroker(0))
	ip.waitEpoch(c.Map().Epoch)
	frame, err := transport.AppendFrame(nil, &transport.Response{Map: c.Map()})
	if err != nil {
		t.Fatal(err)
	}
	if len(frame) <= transport.DefaultMaxFrame {
		t.Fatalf("the map's frame is %d bytes, not over the default limit of %d: the test proves nothing", len(frame), transport.DefaultMaxFrame)
	}

	sdk := ip.sdk(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	// stream.create, relayed: the control plane's answer carries the map.
	if err := sdk.CreateStream(ctx, client.StreamConfig{Name: "small", Shards: 1}); err != nil {
		_, made := c.Map().Stream("small")
		t.Fatalf("CreateStream: %v (made: %v)", err, made)
	}
	// map.get, from the broker's own map.
	m, err := sdk.Map(ctx)
	if err != nil {
		t.Fatalf("Map: %v", err)
	}
	if _, ok := m.Stream("small"); !ok || len(m.Streams) != 4 {
		t.Fatalf("Map: epoch %d, %d streams; want big-0 to big-2 and small", m.Epoch, len(m.Streams))
	}
}

// TestAdminAnswerTooLarge: an admin answer the broker cannot encode
// (here over a small limit; in service over transport.MaxMapFrame) is
// logged and replaced by a frame_too_large Error naming the sizes and,
// for a change the control plane answered, saying it was made. It ended
// the stream with no answer, and logged nothing.
func TestAdminAnswerTooLarge(t *testing.T) {
	var logs bytes.Buffer
	b := &Broker{log: slog.New(slog.NewTextHandler(&logs, nil)), cfg: Config{NodeID: "broker-0"}}
	big := &transport.Response{Map: &shardmap.Map{Epoch: 7, Streams: []shardmap.Stream{{
		StreamConfig: shardmap.StreamConfig{Name: "s", Shards: 64},
		Placement:    shardmap.NewPlacement(strings.Split(strings.Repeat("a-rather-long-node-id,", 64), ",")[:64]...),
	}}}}
	for _, tc := range []struct {
		op, made string
	}{
		{"map.get", ""},
		{"stream.create", "it was made"},
	} {
		logs.Reset()
		var out bytes.Buffer
		w := transport.NewWriter(&out)
		w.SetMaxFrame(1024)
		b.answer(w, &transport.Request{Op: tc.op}, caller{principal: "admin"}, big)
		f, err := transport.NewReader(&out, 0).Read()
		werr, ok := f.(*transport.Error)
		if err != nil || !ok {
			t.Fatalf("%s: answered %v, %v; want an Error", tc.op, f, err)
		}
		if !errors.Is(werr, transport.ErrFrameTooLarge) || !strings.Contains(werr.Message, "limit 1024") || !strings.Contains(werr.Message, tc.made) {
			t.Errorf("%s: answered %v; want frame_too_large naming the limit and %q", tc.op, werr, tc.made)
		}
		if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "op="+tc.op) {
			t.Errorf("%s: logged %q; want a warning naming the op", tc.op, logs.String())
		}
	}
}
