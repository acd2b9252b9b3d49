package client

import (
	"context"
	"errors"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/transport"
)

// The home broker is the one publisher streams and admin requests go
// through: the one given to Connect until it has failed every dial for
// WithHomeFailover, or said it is shutting down, when the client moves
// its home to another live broker of the cached map (moveHome,
// brokerLeaving). brokerConn.get calls moveHome after a failed dial; it
// owns no goroutine and adds none: a home that nobody dials is not moved.
//
// A broker that said it is shutting down (it closed a connection, or
// stopped reading a publish stream, with shutting_down) is "leaving" for
// the failover delay: no home moves to it, so that clients of two brokers
// restarted one after the other do not move back and forth between them,
// and a subscription reads from another replica while there is one.

// homeFailoverDials is the fewest dials of the home broker in a row that
// got no connection (brokerConn.mu.missed) that move the home, the last
// WithHomeFailover or more after the first.
const homeFailoverDials = 2

// homeConn returns the connection to the home broker.
func (c *Client) homeConn() *brokerConn { return c.home.Load() }

// Addr returns the address of the client's home broker: the one given to
// [Connect], or the one the client moved its home to after that one
// failed every dial for [WithHomeFailover].
func (c *Client) Addr() string { return c.homeConn().addr }

// moveHome moves the home from b, whose last missed dials in a row got
// no connection, the first ending at since and the last with err, to another live broker of the
// cached map (nextHome), if b is the home and has failed for
// WithHomeFailover; else it does nothing. Called with no lock held.
func (c *Client) moveHome(b *brokerConn, missed int, since time.Time, err error) {
	d := c.cfg.homeFailover
	if d < 0 || missed < homeFailoverDials || time.Since(since) < d || c.homeConn() != b || c.closed.Load() {
		return
	}
	next := c.nextHome(b.addr)
	if next == nil {
		c.cfg.logger.Debug("client: home broker failed every dial, and the shard map shows no other live broker to move to", "broker", b.addr, "dials", missed, "err", err)
		return
	}
	if c.home.CompareAndSwap(b, next) {
		c.cfg.logger.Info("client: home broker failed every dial; publishes and requests go through another broker from now on",
			"from", b.addr, "to", next.addr, "dials", missed, "for", time.Since(since).Round(time.Millisecond), "err", err)
	}
}

// brokerLeaving notes that the broker at addr said it is shutting down
// (shuttingDown(err)): it is skipped as a new home (nextHome) and by
// subscriptions choosing a replica (isLeaving) for the failover delay, and
// if it is the home, the home moves at once to another live broker of
// the cached map, as after WithHomeFailover of failed dials: a broker
// going away gracefully asked to be published through another, and
// waiting for its dials to fail only stalled the client. Called with no
// lock held.
func (c *Client) brokerLeaving(addr string, err error) {
	d := c.cfg.homeFailover
	if d < 0 {
		d = DefaultHomeFailover // the home stays; subscriptions still skip it
	}
	c.leaving.Lock()
	if c.leaving.until == nil {
		c.leaving.until = map[string]time.Time{}
	}
	now := time.Now()
	for a, t := range c.leaving.until {
		if now.After(t) {
			delete(c.leaving.until, a)
		}
	}
	_, known := c.leaving.until[addr]
	c.leaving.until[addr] = now.Add(d)
	c.leaving.Unlock()
	if !known {
		c.cfg.logger.Info("client: broker is shutting down; it is not chosen as home or replica to read from for a while", "broker", addr, "for", d, "err", err)
	}
	b := c.homeConn()
	if c.cfg.homeFailover < 0 || b.addr != addr || c.closed.Load() {
		return
	}
	next := c.nextHome(addr)
	if next == nil {
		c.cfg.logger.Debug("client: home broker is shutting down, and the shard map shows no other live broker to move to", "broker", addr)
		return
	}
	if c.home.CompareAndSwap(b, next) {
		c.cfg.logger.Info("client: home broker is shutting down; publishes and requests go through another broker from now on", "from", addr, "to", next.addr)
	}
}

// leaving reports whether the broker at addr said it is shutting down
// within the failover delay (brokerLeaving).
func (c *Client) isLeaving(addr string) bool {
	_, ok := c.leavingUntil(addr)
	return ok
}

// leavingUntil returns until when the broker at addr counts as leaving
// (brokerLeaving), and whether it does now.
func (c *Client) leavingUntil(addr string) (time.Time, bool) {
	c.leaving.Lock()
	defer c.leaving.Unlock()
	t, ok := c.leaving.until[addr]
	return t, ok && time.Now().Before(t)
}

// shuttingDown reports whether err says its broker is going away: the
// connection was closed, or the stream's read side cancelled
// (STOP_SENDING), by the broker with shutting_down. A shutting_down error
// frame alone does not say it: a broker relays the one of a shard's owner
// that is shutting down.
func shuttingDown(err error) bool {
	if err == nil {
		return false
	}
	if reason := transport.ClosedWith(err); reason != nil {
		return reason.Code == transport.CodeShuttingDown
	}
	var se *quic.StreamError
	return errors.As(err, &se) && se.Remote && se.ErrorCode == quic.StreamErrorCode(transport.CodeShuttingDown)
}

// nextHome returns the broker to move the home to from failed: of the
// live brokers of the cached map other than failed and those leaving
// (brokerLeaving), the first one the
// client has a live connection to, else the first, both in the map's
// order starting after failed (so that clients that lost the same broker
// do not all pick the same one, and a client whose new home fails too
// goes on to the next). If every other live broker is leaving, the one
// that said so longest ago: in a rolling restart it is back first, and a
// client that stayed on the broker stopping after it had every record
// refused until that broker closed the connection under them. nil if
// there is none.
func (c *Client) nextHome(failed string) *brokerConn {
	m := c.cachedMap()
	if m == nil {
		return nil
	}
	start := 0
	for i, n := range m.Nodes {
		if n.Addr == failed {
			start = i + 1
		}
	}
	var addrs []string
	oldest, since := "", time.Time{}
	for i := range m.Nodes {
		n := m.Nodes[(start+i)%len(m.Nodes)]
		if !n.Live || n.Addr == "" || n.Addr == failed {
			continue
		}
		if until, leaving := c.leavingUntil(n.Addr); !leaving {
			addrs = append(addrs, n.Addr)
		} else if oldest == "" || until.Before(since) {
			oldest, since = n.Addr, until
		}
	}
	if len(addrs) == 0 && oldest != "" {
		addrs = []string{oldest}
	}
	if len(addrs) == 0 {
		return nil
	}
	c.mu.Lock()
	known := make([]*brokerConn, 0, len(addrs))
	for _, a := range addrs {
		if b, ok := c.mu.conns[a]; ok {
			known = append(known, b)
		}
	}
	c.mu.Unlock()
	for _, b := range known {
		if b.current() != nil {
			return b
		}
	}
	b, err := c.conn(addrs[0])
	if err != nil {
		return nil // closed
	}
	return b
}

// homeRoundTrip is roundTrip to the home broker. If it fails before
// sending req because dialing the home failed and that moved the home,
// it tries the new home once: nothing was sent. It returns the broker it
// sent req to last.
func (c *Client) homeRoundTrip(ctx context.Context, req *transport.Request) (*transport.Response, bool, *brokerConn, error) {
	home := c.homeConn()
	resp, sent, err := c.roundTrip(ctx, home, req)
	if err != nil && !sent && ctx.Err() == nil {
		if next := c.homeConn(); next != home {
			home = next
			resp, sent, err = c.roundTrip(ctx, home, req)
		}
	}
	return resp, sent, home, err
}

// homeRequest is request to the home broker, as homeRoundTrip.
func (c *Client) homeRequest(ctx context.Context, req *transport.Request) (*transport.Response, error) {
	resp, _, _, err := c.homeRoundTrip(ctx, req)
	return resp, err
}
