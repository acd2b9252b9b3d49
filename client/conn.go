package client

import (
	"context"
	"crypto/tls"
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/transport"
)

// brokerConn is a QUIC connection to one broker address: the client's
// one for publishes and requests, or one of a subscription's (subconns.go).
// It dials lazily and redials after the connection dies, spacing failed
// attempts with capped exponential backoff. It owns no goroutine: quic-go
// runs the connection, and the users of the connection (publish sessions,
// shard subscriptions, requests) notice its death on their own streams and
// come back for a new one.
type brokerConn struct {
	c    *Client
	addr string

	// mu guards the current connection and the dial state, so that one
	// caller dials while others wait for its result.
	mu struct {
		sync.Mutex
		conn     *quic.Conn
		dialing  chan struct{} // non-nil while a dial runs; closed when it ends
		failures int           // consecutive failed dials
		retryAt  time.Time     // no dial before this (backoff)
		lastErr  error         // error of the last failed dial
		dialed   bool          // a connection was established before
		dials    int           // connections established
		past     ConnStats     // the counters of the connections before conn
	}
}

// get returns a live connection to the broker, dialing if there is none.
// A dial after a failed one first waits out the backoff (or ctx). It makes
// at most one dial attempt: callers that retry (subscriptions) loop.
func (b *brokerConn) get(ctx context.Context) (*quic.Conn, error) {
	for {
		b.mu.Lock()
		if b.c.closed.Load() {
			b.mu.Unlock()
			return nil, ErrClosed
		}
		if conn := b.mu.conn; conn != nil {
			if conn.Context().Err() == nil {
				b.mu.Unlock()
				return conn, nil
			}
			b.mu.conn = nil
			b.mu.past.add(conn.ConnectionStats())
			b.c.cfg.logger.Info("client: connection to broker lost; will redial", "broker", b.addr, "cause", context.Cause(conn.Context()))
		}
		if ch := b.mu.dialing; ch != nil {
			b.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-b.c.ctx.Done():
				return nil, ErrClosed
			}
		}
		ch := make(chan struct{})
		b.mu.dialing = ch
		wait, lastErr, redial := time.Until(b.mu.retryAt), b.mu.lastErr, b.mu.dialed
		b.mu.Unlock()

		conn, err := b.dial(ctx, wait, lastErr)

		b.mu.Lock()
		b.mu.dialing = nil
		close(ch)
		switch {
		case err == nil && b.c.closed.Load():
			// Close ran while we dialed and did not see this conn.
			b.mu.Unlock()
			_ = conn.CloseWithError(0, "client closed")
			return nil, ErrClosed
		case err == nil:
			b.mu.conn, b.mu.failures, b.mu.lastErr, b.mu.dialed = conn, 0, nil, true
			b.mu.dials++
			b.mu.Unlock()
			if redial {
				b.c.cfg.logger.Info("client: reconnected to broker", "broker", b.addr)
			}
			return conn, nil
		case ctx.Err() != nil || b.c.closed.Load():
			// The caller gave up; that says nothing about the broker.
			b.mu.Unlock()
			return nil, err
		default:
			b.mu.failures++
			n := b.mu.failures
			b.mu.lastErr = err
			b.mu.retryAt = time.Now().Add(b.c.backoff(n))
			b.mu.Unlock()
			b.c.cfg.logger.Debug("client: dial failed", "broker", b.addr, "failures", n, "err", err)
			return nil, err
		}
	}
}

// dial waits wait (the backoff left after a failed dial), then dials once.
func (b *brokerConn) dial(ctx context.Context, wait time.Duration, lastErr error) (*quic.Conn, error) {
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			if lastErr != nil {
				return nil, &DialError{Addr: b.addr, Err: errors.Join(lastErr, ctx.Err())}
			}
			return nil, ctx.Err()
		case <-b.c.ctx.Done():
			return nil, ErrClosed
		}
	}
	dctx, cancel := context.WithTimeoutCause(ctx, b.c.cfg.dialTimeout, errDialTimeout)
	defer cancel()
	stop := context.AfterFunc(b.c.ctx, cancel)
	defer stop()
	conn, err := transport.Dial(dctx, b.addr, b.c.tlsFor(b.addr), b.c.cfg.transport)
	if err != nil {
		if b.c.closed.Load() {
			return nil, ErrClosed
		}
		if ctx.Err() == nil && errors.Is(context.Cause(dctx), errDialTimeout) {
			err = errors.Join(errDialTimeout, err)
		}
		return nil, &DialError{Addr: b.addr, Err: err}
	}
	return conn, nil
}

// current returns the live connection, if any, without dialing.
func (b *brokerConn) current() *quic.Conn {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.conn != nil && b.mu.conn.Context().Err() == nil {
		return b.mu.conn
	}
	return nil
}

// close closes the connection. The client is marked closed first, so no
// new connection is stored after this.
func (b *brokerConn) close() {
	b.mu.Lock()
	conn := b.mu.conn
	b.mu.conn = nil
	if conn != nil {
		b.mu.past.add(conn.ConnectionStats())
	}
	b.mu.Unlock()
	if conn != nil {
		_ = conn.CloseWithError(0, "client closed")
	}
}

// conn returns the pool entry for addr, creating it.
func (c *Client) conn(addr string) (*brokerConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return nil, ErrClosed
	}
	if b, ok := c.mu.conns[addr]; ok {
		return b, nil
	}
	b := &brokerConn{c: c, addr: addr}
	c.mu.conns[addr] = b
	return b, nil
}

// backoff returns the delay before the dial after the n-th consecutive
// failure: min·2^(n-1) capped at max, with ±20% jitter so clients that lost
// the same broker do not redial in lockstep.
func (c *Client) backoff(n int) time.Duration {
	d := c.cfg.backoffMin
	for i := 1; i < n && d < c.cfg.backoffMax; i++ {
		d *= 2
	}
	d = min(d, c.cfg.backoffMax)
	jitter := time.Duration(rand.Int64N(int64(d)/5 + 1))
	if rand.IntN(2) == 0 {
		return d - jitter
	}
	return min(d+jitter, c.cfg.backoffMax)
}

// tlsFor returns the TLS configuration to dial addr with.
func (c *Client) tlsFor(addr string) *tls.Config {
	if c.cfg.insecure {
		conf := transport.InsecureClientTLS(transport.ALPNClient)
		if c.cfg.cert != nil {
			conf.Certificates = []tls.Certificate{*c.cfg.cert}
		}
		return conf
	}
	name := c.cfg.serverName
	if name == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		name = host
	}
	// Only a broker's node certificate will do.
	return transport.VerifyPeer(transport.ClientTLS(c.cfg.ca, c.cfg.cert, name, transport.ALPNClient), transport.RoleNode, "")
}

// sleep waits d, or until ctx ends (false).
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
