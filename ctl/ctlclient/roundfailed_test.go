package ctlclient

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/quictest"
	"github.com/felix-broker/felix/transport"
)

// TestJoinRoundFailed: Join calls MemberConfig.JoinRoundFailed once every
// configured ctl address has failed in a round, not after one of them
// (a broker tells an outage from a slow first address by it), and not
// at all when a later address of the round registers it.
func TestJoinRoundFailed(t *testing.T) {
	node := transport.Register{NodeID: "b0", Addr: "127.0.0.1:7400"}
	t.Run("outage", func(t *testing.T) {
		f := startFakeCtl(t, transport.Features()...) // for its member TLS only
		var mu sync.Mutex
		var calls []time.Duration
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		m, err := Join(ctx, MemberConfig{CtlAddrs: []string{quictest.SilentAddr(t), quictest.SilentAddr(t)}, TLS: f.memberTLS, Node: node,
			LeaseTTL: 300 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
			JoinRoundFailed: func(err error) {
				mu.Lock()
				calls = append(calls, time.Since(start))
				mu.Unlock()
				if err == nil {
					t.Error("JoinRoundFailed called with a nil error")
				}
			}})
		if err == nil {
			m.Close()
			t.Fatal("joined two addresses that answer nothing")
		}
		mu.Lock()
		defer mu.Unlock()
		// Each address takes the handshake timeout (1s) to fail: a call
		// before 1.5s came after the first address alone.
		if len(calls) == 0 || calls[0] < 1500*time.Millisecond {
			t.Fatalf("JoinRoundFailed calls at %v; want the first after both addresses failed (about 2s)", calls)
		}
	})
	t.Run("slow first address", func(t *testing.T) {
		f := startFakeCtl(t, transport.Features()...)
		f.answer.Store(true)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		m, err := Join(ctx, MemberConfig{CtlAddrs: []string{quictest.SilentAddr(t), f.addr()}, TLS: f.memberTLS, Node: node,
			LeaseTTL: 300 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
			JoinRoundFailed: func(err error) {
				t.Errorf("JoinRoundFailed(%v) though the round's second address registered the member", err)
			}})
		if err != nil {
			t.Fatal(err)
		}
		m.Close()
	})
}
