package ctlclient

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/syncbuf"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestUnansweredHeartbeats: a member registered with a ctl that says it
// answers heartbeats (transport.FeatureHeartbeatAcks) keeps the
// registration while the ctl answers (or pushes maps), drops it when
// nothing came for half a lease (at least 500ms), ending it as handed
// over (the ctl keeps its lease for the next), and registers again; with
// a ctl of an earlier version, which answers none and says nothing of
// it, it keeps the registration.
func TestUnansweredHeartbeats(t *testing.T) {
	const wait = 1500 * time.Millisecond // three times the member's answer timeout
	for _, tc := range []struct {
		name     string
		features []string
		answer   bool
		maps     bool // answers with maps, not heartbeats
		dropped  bool
	}{
		{"answered", transport.Features(), true, false, false},
		{"answered with maps", transport.Features(), false, true, false},
		{"unanswered", transport.Features(), false, false, true},
		{"earlier ctl", nil, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startFakeCtl(t, tc.features...)
			f.answer.Store(tc.answer)
			f.answerWithMaps.Store(tc.maps)
			m := f.join(t)
			time.Sleep(wait)
			regs, hbs, handOvers := f.registrations.Load(), f.heartbeats.Load(), f.handOvers.Load()
			t.Logf("in %v: %d registrations, %d heartbeats, %d ended as handed over", wait, regs, hbs, handOvers)
			if hbs < 5 {
				t.Fatalf("%d heartbeats in %v, want one every 100ms", hbs, wait)
			}
			if dropped := regs > 1; dropped != tc.dropped {
				t.Errorf("%d registrations in %v (unlinked %v): dropped %v, want %v", regs, wait, m.Unlinked(), dropped, tc.dropped)
			}
			if tc.dropped && handOvers == 0 {
				t.Errorf("%d registrations dropped, none ended as handed over: the ctl would delete the broker's live/ key and show it down", regs-1)
			}
		})
	}
}

// TestFirstMapWaitIsBounded: a member waits for the first map of a
// registration half a lease (at least 500ms), then tries again (the next
// ctl of its list, here the same), rather than for as long as a ctl
// whose registration handling is stuck keeps its QUIC connection up. It
// ends each attempt as handed over: ctl may have registered the broker
// (etcd slow), and keeps the lease for the next ctl to adopt.
func TestFirstMapWaitIsBounded(t *testing.T) {
	f := startFakeCtl(t, transport.Features()...)
	f.withholdMaps.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m, err := Join(ctx, MemberConfig{CtlAddr: f.addr(), TLS: f.memberTLS, Node: transport.Register{NodeID: "b0", Addr: "127.0.0.1:7400"},
		LeaseTTL: 300 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	if err == nil {
		m.Close()
		t.Fatal("joined a ctl that sends no map")
	}
	// Four in 2s: 500ms each, and the backoff after each round.
	if n := f.registrations.Load(); n < 2 {
		t.Errorf("Join with a ctl that sends no map: %v after %d registrations; want attempts given up after 500ms each", err, n)
	}
	// Join's last attempt ended with ctx, not given up on.
	if n, handOvers := f.registrations.Load(), f.handOvers.Load(); handOvers < n-1 {
		t.Errorf("%d registrations given up on for want of a first map, %d ended as handed over: ctl would delete the broker's live/ key and show it down", n-1, handOvers)
	}
}

// TestSlowMapKeepsTheLink: a map that takes longer than the answer
// timeout to arrive (a large one, a slow link), its bytes coming all the
// while, is not taken for a ctl that sends nothing: the member keeps the
// registration and adopts the map. It counted only whole frames, so a
// map pushed over more than half a lease dropped the link every time,
// and a registration whose first map took as long never completed.
func TestSlowMapKeepsTheLink(t *testing.T) {
	f := startFakeCtl(t, transport.Features()...)
	f.answer.Store(true)
	var streams []shardmap.StreamConfig
	for i := range 400 {
		streams = append(streams, shardmap.StreamConfig{Name: fmt.Sprintf("stream-with-a-longish-name-%04d", i), Shards: 4})
	}
	big := shardmap.Build(2, []shardmap.Node{{ID: "b0", Addr: "127.0.0.1:7400", Live: true}}, streams)
	// About 1.5s to arrive, a chunk every 50ms: three answer timeouts.
	f.slowChunk, f.slowEvery = 1, 50*time.Millisecond
	if n := len(mustEncode(t, &transport.MapUpdate{Map: big})); n > 30 {
		f.slowChunk = n/30 + 1
	}
	m := f.join(t)
	f.slowMap.Store(big)
	deadline := time.Now().Add(5 * time.Second)
	for m.Map().Epoch < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the slow map was not adopted: epoch %d, %d registrations", m.Map().Epoch, f.registrations.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n, h := f.registrations.Load(), f.handOvers.Load(); n != 1 || h != 0 {
		t.Fatalf("%d registrations, %d handed over while a map was arriving: the link was dropped", n, h)
	}
}

// mustEncode returns f as it goes on the wire.
func mustEncode(t *testing.T, f transport.Frame) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := transport.NewWriter(&b).Write(f); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestMemberGoesByTheCtlsLease: a member goes by the broker lease its
// ctl says it holds (transport.MapUpdate.LeaseTTL), heartbeating every
// third of it, and warns, naming both, when it differs from its own; it
// keeps its own with a ctl of an earlier version (none said) and with a
// lease too short to heartbeat by.
func TestMemberGoesByTheCtlsLease(t *testing.T) {
	const own, wait = 300 * time.Millisecond, time.Second
	for _, tc := range []struct {
		name         string
		ctl, want    time.Duration
		minHB, maxHB int64 // heartbeats in wait
		warns        string
	}{
		{"earlier ctl", 0, own, 6, 12, ""},
		{"the same", own, own, 6, 12, ""},
		{"longer", 1500 * time.Millisecond, 1500 * time.Millisecond, 1, 3, "ctl_lease_ttl=1.5s lease_ttl=300ms"},
		{"shorter", 60 * time.Millisecond, 60 * time.Millisecond, 15, 60, "ctl_lease_ttl=60ms lease_ttl=300ms"},
		{"too short", time.Microsecond, own, 6, 12, "too short to heartbeat by; keeping this one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startFakeCtl(t, transport.Features()...)
			f.answer.Store(true)
			f.lease.Store(int64(tc.ctl))
			var logs syncbuf.Buffer
			f.logger = slog.New(slog.NewTextHandler(&logs, nil))
			m := f.join(t)
			if got := m.LeaseTTL(); got != tc.want {
				t.Fatalf("the member goes by a lease of %v with a ctl saying %v, want %v", got, tc.ctl, tc.want)
			}
			time.Sleep(wait)
			hbs, regs := f.heartbeats.Load(), f.registrations.Load()
			if hbs < tc.minHB || hbs > tc.maxHB || regs != 1 {
				t.Errorf("%d heartbeats in %v (%d registrations), want %d to %d (a third of %v each), one registration", hbs, wait, regs, tc.minHB, tc.maxHB, tc.want)
			}
			warned := strings.Contains(logs.String(), "level=WARN")
			if tc.warns == "" && warned || tc.warns != "" && !strings.Contains(logs.String(), tc.warns) {
				t.Errorf("logs %q, want a warning saying %q", logs.String(), tc.warns)
			}
		})
	}
}
