package client

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestHomeBrokerShuttingDownMovesHome: the home broker shuts down
// gracefully, as a broker does (it refuses a new publish stream with
// shutting_down and stops reading it; later it closes its connections
// with shutting_down). The client moves its home at once, not after
// WithHomeFailover (10 s by default) of failed dials, sends the refused
// record (not written) again through the new home, and does not move
// back to the broker that is shutting down when its new home shuts down
// too.
func TestHomeBrokerShuttingDownMovesHome(t *testing.T) {
	fc := newFakeCluster(t, 3)
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "s", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	b0, b1, b2 := fc.brokers[0], fc.brokers[1], fc.brokers[2]
	var refused atomic.Int32
	refuse := pubHook(func(str *quic.Stream, first *transport.Publish, _ *transport.Reader, w *transport.Writer) bool {
		refused.Add(1)
		// As broker servePublish and refuse, once the broker is closing.
		_ = w.Write(&transport.Error{Seq: first.Seq, Code: transport.CodeShuttingDown, Message: "broker is shutting down; publish through another broker"})
		str.CancelRead(quic.StreamErrorCode(transport.CodeShuttingDown))
		_ = str.Close()
		return true
	})
	b0.publishHook.Store(&refuse)

	p, err := c.Publisher(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	start := time.Now()
	if _, err := p.Publish(ctx, nil, []byte("refused, then sent again")); err != nil {
		t.Fatalf("publish refused shutting_down by the home: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("publish through the new home took %v", took)
	}
	if got := c.Addr(); got != b1.addr {
		t.Fatalf("Addr() = %s after the home refused shutting_down, want %s (the next broker of the map)", got, b1.addr)
	}
	if got := refused.Load(); got != 1 {
		t.Errorf("the broker shutting down refused %d publish streams, want 1", got)
	}

	// The new home closes its connections shutting down. broker-0, to
	// which the client still has a live connection, is skipped.
	b1.mu.Lock()
	for _, conn := range b1.mu.conns {
		_ = conn.CloseWithError(quic.ApplicationErrorCode(transport.CodeShuttingDown), "broker shutting down")
	}
	b1.mu.Unlock()
	start = time.Now()
	for {
		_, err := p.Publish(ctx, nil, []byte("after the second shutdown"))
		if err == nil {
			break
		}
		// A record in flight on the closed connection is of unknown
		// outcome and fails, as before; the next goes through.
		if time.Since(start) > 2*time.Second {
			t.Fatalf("publish after the new home closed shutting_down: %v", err)
		}
	}
	if got := c.Addr(); got != b2.addr {
		t.Fatalf("Addr() = %s after the second home closed shutting_down, want %s (not back to %s, shutting down)", got, b2.addr, b0.addr)
	}
	if _, err := c.Streams(ctx); err != nil {
		t.Fatalf("Streams through the new home: %v", err)
	}
}
