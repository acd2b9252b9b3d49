package client

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// refusingListener listens at addr ("127.0.0.1:0" for any port) with the
// certificate of fc's first broker, completes each QUIC/TLS handshake,
// then closes the connection with code, as a broker does for a principal
// over MaxConnsPerPrincipal (limit_exceeded) or a certificate of the
// wrong role (unauthorized). It returns its address and a count of the
// connections it refused.
func refusingListener(t *testing.T, fc *fakeCluster, addr string, code transport.ErrorCode) (string, *atomic.Int64) {
	t.Helper()
	var refused atomic.Int64
	at := serveConns(t, fc, addr, func(_ context.Context, conn *quic.Conn) {
		refused.Add(1)
		_ = conn.CloseWithError(quic.ApplicationErrorCode(code), "refused by a test broker ("+code.String()+")")
	})
	return at, &refused
}

// serveConns listens at addr with the certificate of fc's first broker
// and hands each connection to serve, one after the other, until the
// test ends; it returns the address.
func serveConns(t *testing.T, fc *fakeCluster, addr string, serve func(context.Context, *quic.Conn)) string {
	t.Helper()
	ln, err := transport.Listen(addr, transport.ServerTLS(fc.brokers[0].cert, fc.ca, transport.ALPNClient), transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			serve(ctx, conn)
		}
	}()
	t.Cleanup(func() { cancel(); _ = ln.Close(); <-done })
	return ln.Addr().String()
}

// TestRefusedConnectionIsTyped: Connect to a broker that refuses the
// connection after the handshake fails with a *DialError carrying the
// broker's code (it succeeded, and every publish then failed "connection
// lost, outcome unknown"), worded once.
func TestRefusedConnectionIsTyped(t *testing.T) {
	for _, tc := range []struct {
		code transport.ErrorCode
		want error
	}{
		{transport.CodeLimitExceeded, ErrLimitExceeded},
		{transport.CodeUnauthorized, ErrUnauthorized},
		{transport.CodeUnavailable, ErrUnavailable}, // a broker with no shard map (started during a ctl outage)
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			fc := newFakeCluster(t, 1)
			addr, _ := refusingListener(t, fc, "127.0.0.1:0", tc.code)
			ctx := testCtx(t)
			c, err := Connect(ctx, addr, fc.clientOpts(WithLogger(quiet))...)
			if err == nil {
				defer c.Close()
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, perr := c.Publish(pctx, "s", nil, []byte("x"), WithShard(0))
				cancel()
				t.Fatalf("Connect to a broker refusing the connection (%s) succeeded; then Publish: %v (Is(%v)=%v, Is(ErrConnectionLost)=%v)",
					tc.code, perr, tc.want, errors.Is(perr, tc.want), errors.Is(perr, ErrConnectionLost))
			}
			var derr *DialError
			if !errors.As(err, &derr) || !errors.Is(err, tc.want) || errors.Is(err, ErrConnectionLost) {
				t.Fatalf("Connect: want a *DialError matching %v and not ErrConnectionLost, got %v", tc.want, err)
			}
			if n := strings.Count(err.Error(), "connect to broker"); n != 1 {
				t.Fatalf("Connect's error says %q %d times: %v", "connect to broker", n, err)
			}
			t.Logf("Connect: %v", err)
		})
	}
}

// TestRefusedConnectionBacksOff: the broker a client is connected to is
// replaced by one refusing every connection (limit_exceeded). A completed
// handshake reset the dial backoff, so a loop of publishes redialed with
// no delay at all (757 publishes made 107 connections in 1 s). A refused
// connection counts as a failed dial; and its publishes fail with the
// refusal, not as of unknown outcome (nothing was written). So for a
// broker that refuses unavailable (no shard map: started while the
// control plane is out of reach), whose refusal was taken for a lost
// connection (ErrConnectionLost, outcome unknown).
func TestRefusedConnectionBacksOff(t *testing.T) {
	for _, tc := range []struct {
		code transport.ErrorCode
		want error
	}{
		{transport.CodeLimitExceeded, ErrLimitExceeded},
		{transport.CodeUnavailable, ErrUnavailable},
	} {
		t.Run(tc.code.String(), func(t *testing.T) { testRefusedConnectionBacksOff(t, tc.code, tc.want) })
	}
}

func testRefusedConnectionBacksOff(t *testing.T, code transport.ErrorCode, want error) {
	fc := newFakeCluster(t, 1)
	addr := fc.brokers[0].addr
	ctx := testCtx(t)
	// Default reconnect backoff: 100 ms doubling to 5 s.
	c, err := Connect(ctx, addr, WithCA(fc.ca), WithClientCertFile(fc.dir+"/admin.crt", fc.dir+"/admin.key"), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fc.brokers[0].stop()
	for deadline := time.Now().Add(5 * time.Second); c.homeConn().current() != nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the client did not see its broker stop")
		}
	}
	_, refused := refusingListener(t, fc, addr, code)

	end := time.Now().Add(time.Second)
	calls, typed, untyped := 0, 0, 0
	var last error
	for time.Now().Before(end) {
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err := c.Publish(pctx, "s", nil, []byte("x"), WithShard(0))
		// A dial cut short by the publish's own deadline (a loaded
		// machine's handshake can take longer) says nothing of the
		// refusal, and is not of unknown outcome either.
		cut := pctx.Err() != nil && errors.Is(err, context.DeadlineExceeded)
		cancel()
		calls++
		switch {
		case errors.Is(err, ErrConnectionLost):
			untyped++
			last = err
		case errors.Is(err, want):
			typed++
		case !cut:
			untyped++
			last = err
		}
	}
	n := refused.Load()
	t.Logf("%d publishes in 1s; %d connections refused", calls, n)
	if n > 6 {
		t.Errorf("%d connections in 1s to a broker refusing every one: no backoff (100ms doubling allows 4)", n)
	}
	if untyped > 0 || typed == 0 {
		t.Errorf("%d of %d publishes over a refused connection did not fail with %v alone (%d did); the last: %v", untyped, calls, want, typed, last)
	}
}

// closingAfterAnswer is a broker that answers map.get, reads one publish,
// then closes the connection with code: a connection that worked.
func closingAfterAnswer(t *testing.T, fc *fakeCluster, code transport.ErrorCode) string {
	t.Helper()
	return serveConns(t, fc, "127.0.0.1:0", func(ctx context.Context, conn *quic.Conn) {
		for {
			str, err := conn.AcceptStream(ctx)
			if err != nil {
				return
			}
			f, err := transport.NewReader(str, 0).Read()
			if err != nil {
				return
			}
			if _, ok := f.(*transport.Request); ok {
				_ = transport.NewWriter(str).Write(&transport.Response{Map: fc.currentMap()})
				_ = str.Close()
				continue
			}
			_ = conn.CloseWithError(quic.ApplicationErrorCode(code), "closing a connection that worked")
			return
		}
	})
}

// TestClosedConnectionThatWorkedIsLost: a connection that carried answers
// and is then closed with a code has records of unknown outcome: their
// publishes fail with ErrConnectionLost, the broker's code in the chain.
func TestClosedConnectionThatWorkedIsLost(t *testing.T) {
	for _, tc := range []struct {
		code transport.ErrorCode
		want error
	}{
		{transport.CodeShuttingDown, ErrShuttingDown},
		{transport.CodeLimitExceeded, ErrLimitExceeded}, // no broker does it today
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			fc := newFakeCluster(t, 1)
			addr := closingAfterAnswer(t, fc, tc.code)
			ctx := testCtx(t)
			c, err := Connect(ctx, addr, fc.clientOpts(WithLogger(quiet))...)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, err = c.Publish(pctx, "s", nil, []byte("x"), WithShard(0))
			if !errors.Is(err, ErrConnectionLost) || !errors.Is(err, tc.want) {
				t.Fatalf("publish in flight when a connection that worked closed (%s): want ErrConnectionLost and %v, got %v", tc.code, tc.want, err)
			}
			t.Logf("publish: %v", err)
		})
	}
}

// TestSubscriptionRefusedConnectionEnds: a subscription reads its shards
// over connections of its own; when the shard's owner refuses them
// (limit_exceeded: the principal's connections to it are at the limit)
// the subscription ends with that error, as it does when a broker
// answers limit_exceeded on its stream. It retried in silence forever.
func TestSubscriptionRefusedConnectionEnds(t *testing.T) {
	fc := newFakeCluster(t, 2)
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "s", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	owner := fc.brokers[1].addr // shard 1's
	fc.brokers[1].stop()
	refusingListener(t, fc, owner, transport.CodeLimitExceeded)

	sub, err := c.Subscribe(ctx, "s", Earliest(), Shard(1))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for rec, err := range sub.Records(rctx) {
		if err == nil {
			t.Fatalf("read %+v from a broker refusing the connection", rec)
		}
		if !errors.Is(err, ErrLimitExceeded) || errors.Is(err, ErrConnectionLost) {
			t.Fatalf("subscription over a refused connection: want ErrLimitExceeded, got %v", err)
		}
		t.Logf("subscription ended: %v", err)
		return
	}
	t.Fatal("iterator ended without an error")
}
