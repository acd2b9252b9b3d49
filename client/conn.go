package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
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
//
// Its users hold the connection while they use it (hold and release: a
// request in flight, a publisher stream open), so that the client's
// closer of idle connections (idleconns.go) closes it only while no one
// does.
//
// A completed handshake is not yet a working connection: a broker refuses
// a client's connection by closing it right after the handshake, with
// limit_exceeded (the principal has MaxConnsPerPrincipal connections to
// it already, or the broker has MaxConns) or unauthorized (a certificate
// of the wrong role). So the backoff starts over only once a connection
// carried an answer of the broker (link.answer) or lived longer than the
// shortest backoff; one that ended before counts as a failed dial.
type brokerConn struct {
	c    *Client
	addr string

	// mu guards the current connection and the dial state, so that one
	// caller dials while others wait for its result.
	mu struct {
		sync.Mutex
		link     *link         // the current connection, nil before the first dial and after close
		dialing  chan struct{} // non-nil while a dial runs; closed when it ends
		failures int           // consecutive failed dials
		// missed counts the dials since the last connection established
		// that ended without one, failed or cut short by their caller's
		// context (which the backoff does not count), the first at
		// missedAt: moveHome judges the home by them.
		missed   int
		missedAt time.Time
		retryAt  time.Time // no dial before this (backoff)
		lastErr  error     // error of the last failed dial (not a *DialError: dial wraps it)
		dialed   bool      // a connection was established before (and not closed as idle since)
		dials    int       // connections established
		past     ConnStats // the counters of the connections before link
		// users counts those holding the connection (hold): requests in
		// flight and publisher streams open, on link or an earlier one;
		// idleSince is when the last let go, or link was dialed.
		users     int
		idleSince time.Time
	}
}

// link is one connection of a brokerConn, as its users see it.
type link struct {
	b    *brokerConn
	conn *quic.Conn
	at   time.Time // when the handshake completed
	// answered: a frame of the broker's arrived on one of the
	// connection's streams, so the broker accepted the connection.
	answered atomic.Bool
	// unwatch stops watchEnd's count of the connection's end, for a
	// connection the client closes itself.
	unwatch func() bool
}

// watchEnd counts l's connection in Client.connsEnded when it ends other
// than by the client's closing it (takeLinkLocked stops the count first).
func (l *link) watchEnd() {
	c := l.b.c
	l.unwatch = context.AfterFunc(l.conn.Context(), func() { c.connsEnded.Add(1) })
}

// answer records that a frame of the broker's arrived on one of l's
// streams: the broker took the connection, and the dial backoff starts
// over. Users call it for the first frame they read.
func (l *link) answer() {
	if l.answered.Load() || !l.answered.CompareAndSwap(false, true) {
		return
	}
	l.b.mu.Lock()
	l.b.mu.failures, l.b.mu.lastErr = 0, nil
	l.b.mu.Unlock()
}

// closeReason returns the broker's reason for closing l's connection, as
// a typed error, when err (an operation's on one of its streams) or the
// connection's end carries one (transport.ClosedWith); nil otherwise.
func (l *link) closeReason(err error) *transport.Error {
	if reason := transport.ClosedWith(err); reason != nil {
		return reason
	}
	if ctx := l.conn.Context(); ctx.Err() != nil {
		return transport.ClosedWith(context.Cause(ctx))
	}
	return nil
}

// refusal returns the error of a broker that refused l's connection, or
// nil: it closed the connection with unauthorized, limit_exceeded or
// unavailable (it serves nothing yet: started while the control plane is
// out of reach, it has no shard map) and nothing was answered on it. A
// broker closes a connection with those codes only as it accepts it,
// before it reads any stream (broker serveConn), so nothing sent on it
// was processed: records sent on it were not written, and their
// publishes fail with this error rather than as of unknown outcome. Like
// any refusal it counts as a failed dial (ended): the home does not move
// off a broker for one. A connection closed with shutting_down is not a
// refusal: a broker going away closes connections whose records it may
// have written.
func (l *link) refusal(err error) error {
	if l.answered.Load() {
		return nil
	}
	reason := l.closeReason(err)
	if reason == nil {
		return nil
	}
	switch reason.Code {
	case transport.CodeUnauthorized, transport.CodeLimitExceeded, transport.CodeUnavailable:
		return &DialError{Addr: l.b.addr, Err: reason}
	}
	return nil
}

// failure returns the error of an operation on one of l's streams that
// failed with err (opening, writing or reading it): a [*DialError]
// carrying the broker's refusal if it refused the connection (see
// refusal), else an error wrapping [ErrConnectionLost] and the broker's
// reason for closing the connection, typed, if it gave one
// (errors.Is(err, ErrShuttingDown)), or err. A broker that closed it with
// shutting_down is noted as leaving, which moves the home off it
// (brokerLeaving).
func (l *link) failure(err error) error {
	if rerr := l.refusal(err); rerr != nil {
		return rerr
	}
	if reason := l.closeReason(err); reason != nil {
		if reason.Code == transport.CodeShuttingDown {
			l.b.c.brokerLeaving(l.b.addr, reason)
		}
		return lost(reason)
	}
	return lost(err)
}

// get returns a live connection to the broker, dialing if there is none.
// A dial after a failed one first waits out the backoff (or ctx). It makes
// at most one dial attempt: callers that retry (subscriptions) loop.
func (b *brokerConn) get(ctx context.Context) (*link, error) { return b.connect(ctx, false) }

// hold is get for a user of one of the client's pooled connections (a
// request, a publisher stream): the connection it returns is held, and
// not closed as idle, until the caller calls release once. It is counted
// under the lock that hands the connection out, the one the closer of
// idle connections takes to close it: a connection is either closed
// before hold finds it (hold dials again) or held before it is judged.
func (b *brokerConn) hold(ctx context.Context) (*link, error) { return b.connect(ctx, true) }

// release lets go of a connection hold returned.
func (b *brokerConn) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mu.users--
	if b.mu.users == 0 {
		b.mu.idleSince = time.Now()
	}
}

func (b *brokerConn) connect(ctx context.Context, hold bool) (*link, error) {
	for {
		b.mu.Lock()
		if b.c.closed.Load() {
			b.mu.Unlock()
			return nil, ErrClosed
		}
		if l := b.mu.link; l != nil {
			if l.conn.Context().Err() == nil {
				if hold {
					b.mu.users++
				}
				b.mu.Unlock()
				return l, nil
			}
			b.mu.link = nil
			b.mu.past.add(l.conn.ConnectionStats())
			failures, refused := b.ended(l)
			b.mu.Unlock()
			cause := context.Cause(l.conn.Context())
			switch {
			case refused != nil:
				b.c.cfg.logger.Warn("client: broker refused the connection; will redial after backoff", "broker", b.addr, "failures", failures, "err", refused)
			case failures > 0:
				b.c.cfg.logger.Info("client: connection to broker closed before it carried an answer; will redial after backoff", "broker", b.addr, "failures", failures, "cause", cause)
			default:
				b.c.cfg.logger.Info("client: connection to broker lost; will redial", "broker", b.addr, "cause", cause)
			}
			if shuttingDown(cause) {
				// Going away: the home moves off it at once, and the caller,
				// who had it as the home, goes to the new one (nothing was
				// sent) rather than wait out a dial of a broker that is gone.
				b.c.brokerLeaving(b.addr, cause)
				if b.c.homeConn() != b {
					return nil, fmt.Errorf("client: broker %s is shutting down: %w", b.addr, l.closeReason(cause))
				}
			}
			continue
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

		conn, tried, err := b.dial(ctx, wait, lastErr)

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
			// failures is kept until the connection proves itself
			// (ended, link.answer).
			l := &link{b: b, conn: conn, at: time.Now()}
			l.watchEnd()
			b.mu.link, b.mu.dialed = l, true
			b.mu.missed = 0
			b.mu.dials++
			b.mu.idleSince = l.at
			if hold {
				b.mu.users++
			}
			b.mu.Unlock()
			if redial {
				b.c.cfg.logger.Info("client: reconnected to broker", "broker", b.addr)
			}
			return l, nil
		case ctx.Err() != nil || b.c.closed.Load():
			// The caller gave up; that says nothing about the broker to
			// the backoff. A dial it cut short still went unanswered:
			// against a host that is gone, every dial of callers whose
			// contexts are shorter than the dial timeout ends so.
			if !tried || b.c.closed.Load() {
				b.mu.Unlock()
				return nil, err
			}
			missed, since := b.missedDial()
			b.mu.Unlock()
			b.c.moveHome(b, missed, since, err)
			return nil, err
		default:
			b.mu.failures++
			n := b.mu.failures
			missed, since := b.missedDial()
			b.mu.lastErr = err
			var derr *DialError
			if errors.As(err, &derr) {
				b.mu.lastErr = derr.Err // dial wraps it again
			}
			b.mu.retryAt = time.Now().Add(b.c.backoff(n))
			b.mu.Unlock()
			b.c.cfg.logger.Debug("client: dial failed", "broker", b.addr, "failures", n, "err", err)
			b.c.moveHome(b, missed, since, err)
			return nil, err
		}
	}
}

// ended accounts for l, the current connection, found closed. A
// connection the broker refused, or one that carried no answer and ended
// within the shortest backoff (a broker that takes the handshake and
// closes the connection at once), counts as a failed dial: the next dial
// waits out the backoff, so that a broker refusing this client is not
// redialed in a loop. Any other starts the backoff over. It returns the
// failures counted and, for a refused connection, the refusal. b.mu is
// held.
func (b *brokerConn) ended(l *link) (failures int, refused error) {
	if l.answered.Load() {
		b.mu.failures, b.mu.lastErr = 0, nil
		return 0, nil
	}
	cause := context.Cause(l.conn.Context())
	refused = l.refusal(cause)
	if refused == nil && time.Since(l.at) >= b.c.cfg.backoffMin {
		b.mu.failures, b.mu.lastErr = 0, nil
		return 0, nil
	}
	b.mu.failures++
	b.mu.lastErr = cause
	if reason := l.closeReason(cause); reason != nil {
		b.mu.lastErr = reason
	}
	b.mu.retryAt = time.Now().Add(b.c.backoff(b.mu.failures))
	return b.mu.failures, refused
}

// missedDial counts a dial that ended without a connection, and returns
// the count since the last connection established and when the first of
// them ended. b.mu is held.
func (b *brokerConn) missedDial() (int, time.Time) {
	b.mu.missed++
	if b.mu.missed == 1 {
		b.mu.missedAt = time.Now()
	}
	return b.mu.missed, b.mu.missedAt
}

// dial waits wait (the backoff left after a failed dial), then dials once;
// tried says whether it got to dial.
func (b *brokerConn) dial(ctx context.Context, wait time.Duration, lastErr error) (_ *quic.Conn, tried bool, _ error) {
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			if lastErr != nil {
				return nil, false, &DialError{Addr: b.addr, Err: errors.Join(lastErr, ctx.Err())}
			}
			return nil, false, ctx.Err()
		case <-b.c.ctx.Done():
			return nil, false, ErrClosed
		}
	}
	dctx, cancel := context.WithTimeoutCause(ctx, b.c.cfg.dialTimeout, errDialTimeout)
	defer cancel()
	stop := context.AfterFunc(b.c.ctx, cancel)
	defer stop()
	conn, err := transport.Dial(dctx, b.addr, b.c.tlsFor(b.addr), b.c.cfg.transport)
	if err != nil {
		if b.c.closed.Load() {
			return nil, true, ErrClosed
		}
		if ctx.Err() == nil && errors.Is(context.Cause(dctx), errDialTimeout) {
			err = errors.Join(errDialTimeout, err)
		}
		return nil, true, &DialError{Addr: b.addr, Err: err}
	}
	return conn, true, nil
}

// current returns the live connection, if any, without dialing.
func (b *brokerConn) current() *quic.Conn {
	b.mu.Lock()
	defer b.mu.Unlock()
	if l := b.mu.link; l != nil && l.conn.Context().Err() == nil {
		return l.conn
	}
	return nil
}

// close closes the connection. The client is marked closed first, so no
// new connection is stored after this.
func (b *brokerConn) close() {
	b.mu.Lock()
	l := b.takeLinkLocked()
	b.mu.Unlock()
	if l != nil {
		_ = l.conn.CloseWithError(0, "client closed")
	}
}

// closeIdle closes the connection if no one has held it (hold) for idle
// by now, and reports whether it did; the next user dials again. A
// connection already dead is left to its next user, who accounts for
// its end (ended).
func (b *brokerConn) closeIdle(now time.Time, idle time.Duration) bool {
	b.mu.Lock()
	l := b.mu.link
	if l == nil || b.mu.users > 0 || now.Sub(b.mu.idleSince) < idle || l.conn.Context().Err() != nil {
		b.mu.Unlock()
		return false
	}
	b.takeLinkLocked()
	b.mu.dialed = false // the next dial is no reconnection
	b.mu.Unlock()
	_ = l.conn.CloseWithError(0, "idle")
	return true
}

// takeLinkLocked removes the current connection, keeping its counters,
// and returns it. b.mu is held.
func (b *brokerConn) takeLinkLocked() *link {
	l := b.mu.link
	b.mu.link = nil
	if l != nil {
		l.unwatch()
		b.mu.past.add(l.conn.ConnectionStats())
	}
	return l
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
