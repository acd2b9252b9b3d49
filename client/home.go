package client

import (
	"context"
	"time"

	"github.com/felix-broker/felix/transport"
)

// The home broker is the one publisher streams and admin requests go
// through: the one given to Connect until it has failed every dial for
// WithHomeFailover, when the client moves its home to another live broker
// of the cached map (moveHome). brokerConn.get calls moveHome after a
// failed dial; it owns no goroutine and adds none: a home that nobody
// dials is not moved.

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

// nextHome returns the broker to move the home to from failed: of the
// live brokers of the cached map other than failed, the first one the
// client has a live connection to, else the first, both in the map's
// order starting after failed (so that clients that lost the same broker
// do not all pick the same one, and a client whose new home fails too
// goes on to the next); nil if there is none.
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
	for i := range m.Nodes {
		n := m.Nodes[(start+i)%len(m.Nodes)]
		if n.Live && n.Addr != "" && n.Addr != failed {
			addrs = append(addrs, n.Addr)
		}
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
