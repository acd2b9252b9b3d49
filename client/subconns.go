package client

import (
	"slices"
	"sync"
)

// # A subscription's own connections
//
// A subscription reads its shards over connections of its own, never
// over the client's (those of publishes and requests), nor another
// subscription's. A shard's records wait in its QUIC stream until the
// application takes them, up to the shard's credit, and what waits
// unread counts against the whole connection's flow-control window: on
// a shared connection, a loop that publishes each record it consumes
// stalled its own publish (its ack could not arrive), and a subscription
// whose application was slow stalled every other one of the client. On
// its own connections a subscription holds back only itself.
//
// A connection carries at most subsPerConn of the subscription's shards,
// the broker's default limit of subscriptions per connection
// (MaxSubsPerConn): a stream of more shards on one broker is read over
// several. Each counts against the principal's connections to the broker
// (MaxConnsPerPrincipal, 64 by default), as a Kafka consumer's fetch
// connections do: an application with many subscriptions at once shares
// them among fewer clients' principals, or raises that limit. A
// subscription whose connection the broker refuses for that limit ends
// with an error matching ErrLimitExceeded (link.refusal).

// subsPerConn bounds the shard subscriptions over one connection.
const subsPerConn = 128

// subConns are a subscription's connections, by broker address.
type subConns struct {
	c  *Client
	mu sync.Mutex // guards byAddr and each subConn's shards
	// byAddr holds each broker's connections; closed once the
	// subscription's shard goroutines have all ended.
	byAddr map[string][]*subConn
	closed bool
}

// subConn is one connection of a subscription and how many of its shards
// are attached over it.
type subConn struct {
	b      *brokerConn
	shards int
}

// get returns a connection to addr with room for one more shard, and
// counts it there; put gives the room back.
func (sc *subConns) get(addr string) (*subConn, error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.closed {
		return nil, ErrClosed
	}
	for _, conn := range sc.byAddr[addr] {
		if conn.shards < subsPerConn {
			conn.shards++
			return conn, nil
		}
	}
	b, err := sc.c.extraConn(addr)
	if err != nil {
		return nil, err
	}
	if sc.byAddr == nil {
		sc.byAddr = map[string][]*subConn{}
	}
	conn := &subConn{b: b, shards: 1}
	sc.byAddr[addr] = append(sc.byAddr[addr], conn)
	return conn, nil
}

func (sc *subConns) put(conn *subConn) {
	sc.mu.Lock()
	conn.shards--
	idle := conn.shards == 0 && !sc.closed
	if idle {
		// No shard is read over it (they moved to other brokers, or
		// reattach after a failure and will get one): close it rather
		// than hold a connection, one of the principal's, per broker
		// the subscription ever read from.
		sc.byAddr[conn.b.addr] = slices.DeleteFunc(sc.byAddr[conn.b.addr], func(c *subConn) bool { return c == conn })
	}
	sc.mu.Unlock()
	if idle {
		sc.c.retire(conn.b)
	}
}

// close closes every connection, once no shard uses them.
func (sc *subConns) close() {
	sc.mu.Lock()
	sc.closed = true
	all := sc.byAddr
	sc.byAddr = nil
	sc.mu.Unlock()
	for _, conns := range all {
		for _, conn := range conns {
			sc.c.retire(conn.b)
		}
	}
}

// extraConn returns a new connection to addr outside the client's pool
// (one per broker), counted in its ConnStats until retire.
func (c *Client) extraConn(addr string) (*brokerConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return nil, ErrClosed
	}
	b := &brokerConn{c: c, addr: addr}
	c.mu.extra[b] = struct{}{}
	return b, nil
}

// retire closes b, a connection of extraConn, keeping its counters for
// ConnStats.
func (c *Client) retire(b *brokerConn) {
	b.close()
	st := b.stats()
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.mu.extra, b)
	past := c.mu.retired[b.addr]
	past.Dials += st.Dials
	past.addCounters(st)
	c.mu.retired[b.addr] = past
}
