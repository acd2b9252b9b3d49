package ctlclient

import (
	"context"
	"testing"
	"time"

	"github.com/felix-broker/felix/transport"
)

// TestUnansweredHeartbeats: a member registered with a ctl that says it
// answers heartbeats (transport.FeatureHeartbeatAcks) keeps the
// registration while the ctl answers, drops it when no answer came for
// half a lease (at least 500ms), and registers again; with a ctl of an
// earlier version, which answers none and says nothing of it, it keeps
// the registration.
func TestUnansweredHeartbeats(t *testing.T) {
	const wait = 1500 * time.Millisecond // three times the member's answer timeout
	for _, tc := range []struct {
		name     string
		features []string
		answer   bool
		dropped  bool
	}{
		{"answered", transport.Features(), true, false},
		{"unanswered", transport.Features(), false, true},
		{"earlier ctl", nil, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startFakeCtl(t, tc.features...)
			f.answer.Store(tc.answer)
			m := f.join(t)
			time.Sleep(wait)
			regs, hbs := f.registrations.Load(), f.heartbeats.Load()
			t.Logf("in %v: %d registrations, %d heartbeats", wait, regs, hbs)
			if hbs < 5 {
				t.Fatalf("%d heartbeats in %v, want one every 100ms", hbs, wait)
			}
			if dropped := regs > 1; dropped != tc.dropped {
				t.Errorf("%d registrations in %v (unlinked %v): dropped %v, want %v", regs, wait, m.Unlinked(), dropped, tc.dropped)
			}
		})
	}
}

// TestFirstMapWaitIsBounded: a member waits for the first map of a
// registration half a lease (at least 500ms), then tries again (the next
// ctl of its list, here the same), rather than for as long as a ctl
// whose registration handling is stuck keeps its QUIC connection up.
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
}
