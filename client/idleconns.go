package client

import "time"

// # Idle connections
//
// The client's pool holds a connection per broker it used for a request
// or a publisher stream (Client.mu.conns): its home's, and those it made
// to other brokers for a replica status, for a shard map the home did
// not give, or that were the home before it moved. The home's is kept
// for the client's life. Any other is closed by closeIdleConns once no
// one has held it (brokerConn.hold: a request in flight, a publisher
// stream open) for the idle timeout (WithConnIdleTimeout), or at once
// when its broker is no longer in the shard map; its pool entry stays,
// with its counters (ConnStats), and its next user dials again.
//
// One goroutine of the client's, idleCloser, does it: every half idle
// timeout, and on each new map the client takes (mapTaken). Nothing on a
// publish's or a request's path waits on a timer for it: they only count
// themselves in and out of the connection they hold, under the lock
// brokerConn.get takes anyway.

// idleCloser closes idle connections of the pool until the client is
// closed. It is the client's goroutine, started by Connect.
func (c *Client) idleCloser() {
	defer c.wg.Done()
	var tick <-chan time.Time
	if d := c.cfg.connIdleTimeout; d > 0 {
		t := time.NewTicker(max(d/2, time.Millisecond))
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-tick:
		case <-c.mapTaken:
		}
		c.closeIdleConns(time.Now())
	}
}

// closeIdleConns closes the pool's connections other than the home's
// that no one has held for the idle timeout by now, or at all if their
// broker is not in the cached shard map.
func (c *Client) closeIdleConns(now time.Time) {
	home := c.homeConn()
	inMap := map[string]bool{}
	if m := c.cachedMap(); m != nil {
		for _, n := range m.Nodes {
			inMap[n.Addr] = true
		}
	}
	c.mu.Lock()
	conns := make([]*brokerConn, 0, len(c.mu.conns))
	for _, b := range c.mu.conns {
		if b != home {
			conns = append(conns, b)
		}
	}
	c.mu.Unlock()
	for _, b := range conns {
		idle, why := c.cfg.connIdleTimeout, "unused for the idle timeout"
		if len(inMap) > 0 && !inMap[b.addr] {
			idle, why = 0, "its broker is no longer in the shard map"
		} else if idle < 0 {
			continue
		}
		if b.closeIdle(now, idle) {
			c.cfg.logger.Debug("client: closed an unused connection", "broker", b.addr, "why", why)
		}
	}
}

// tookMap wakes idleCloser after the client took a new shard map, which
// may have removed brokers.
func (c *Client) tookMap() {
	select {
	case c.mapTaken <- struct{}{}:
	default:
	}
}
