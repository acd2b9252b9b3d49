package ctl

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestRegisterFieldsAreBounded: a node certificate registers with an
// address of 2 MiB. ctl records it in etcd and in every map it pushes
// (the map's margin for members joining is 4 MiB in all).
func TestRegisterFieldsAreBounded(t *testing.T) {
	p := newPKI(t)
	srv := startCtl(t, p, t.TempDir(), "127.0.0.1:0")
	raw := dialRaw(t, p, srv.Addr(), "b0")
	addr := "127.0.0.1:7400" + strings.Repeat("x", 2<<20)
	_, r := raw.send(&transport.Register{NodeID: "b0", Addr: addr})
	f := readFrame(t, r)
	if e, ok := f.(*transport.Error); !ok || !errors.Is(e, transport.ErrInvalid) {
		t.Errorf("registration with a %d-byte address: answered %T %v, want invalid", len(addr), f, f)
	}
	if mu, ok := f.(*transport.MapUpdate); ok {
		deadline := time.Now().Add(waitFor)
		for time.Now().Before(deadline) {
			if n, ok := srv.Map().Node("b0"); ok && n.Live {
				t.Fatalf("registration with a %d-byte address accepted: b0 live in the map of epoch %d (address %d bytes; map sent %d)", len(addr), srv.Map().Epoch, len(n.Addr), mu.Map.Epoch)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestHeartbeatReportsAreBounded: every heartbeat of a flood whose
// reports alternate was an etcd write, and a report naming streams no
// stream can be (4 KiB names) was stored as it came.
func TestHeartbeatReportsAreBounded(t *testing.T) {
	p := newPKI(t)
	srv := startCtlLease(t, p, t.TempDir(), "127.0.0.1:0", 3*time.Second)
	register := func() (*transport.Writer, *transport.Reader) {
		str, r := dialRaw(t, p, srv.Addr(), "b0").send(&transport.Register{NodeID: "b0", Addr: "127.0.0.1:7400", Features: transport.Features()})
		readFrame(t, r) // the map
		return transport.NewWriter(str), r
	}
	hb := func(i int, stream string) *transport.Heartbeat {
		rep := &transport.ReplicaReport{Applied: uint64(i)}
		for j := range transport.MaxUnreadyReported {
			rep.Unready = append(rep.Unready, shardmap.ShardID{Stream: stream, Shard: j})
		}
		return &transport.Heartbeat{NodeID: "b0", Epoch: 1, Replicas: rep}
	}
	liveKey := func() (int64, int) {
		resp, err := srv.store.cli.Get(context.Background(), srv.store.liveKey("b0"))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return 0, 0 // deleted: the registration ended
		}
		return resp.Kvs[0].Version, len(resp.Kvs[0].Value)
	}
	w, r := register()
	go func() { // drain the answers
		for _, err := r.Read(); err == nil; _, err = r.Read() {
		}
	}()
	start := time.Now()
	for i := range 100 {
		if err := w.Write(hb(i+1, strings.Repeat("s", shardmap.MaxStreamName))); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond) // ctl reads them all
	elapsed := time.Since(start)
	puts, _ := liveKey()
	if max := int64(elapsed/(srv.cfg.LeaseTTL/10)) + 2 + reportBurst; puts > max {
		t.Errorf("live/b0 written %d times in %v: one etcd write per heartbeat (want at most %d)", puts, elapsed.Round(time.Millisecond), max)
	}

	w2, r2 := register()
	before, _ := liveKey()
	if err := w2.Write(hb(1, strings.Repeat("x", 4<<10))); err != nil {
		t.Fatal(err)
	}
	for f, err := r2.Read(); ; f, err = r2.Read() {
		if e, ok := f.(*transport.Error); ok || err != nil {
			if !ok || !errors.Is(e, transport.ErrInvalid) {
				t.Errorf("a 1 MiB report of impossible streams: answered %v (read error %v), want invalid", e, err)
			}
			break
		}
	}
	time.Sleep(200 * time.Millisecond)
	if v, size := liveKey(); v > before {
		t.Errorf("live/b0 written with a report of impossible streams (%d bytes)", size)
	}
}
