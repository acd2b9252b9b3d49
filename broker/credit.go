package broker

import (
	"sync"

	"github.com/felix-broker/felix/transport"
)

// credit counts the records a subscriber has allowed the broker to send,
// up to a bound (Config.MaxCredit).
type credit struct {
	mu  sync.Mutex
	n   uint64
	max uint64
	// held is what the writer took (take) and has not settled yet
	// (giveBack): still the subscriber's credit, so a grant meanwhile is
	// judged against n + held.
	held    uint64
	over    bool          // a grant took n past max: the subscription ends
	wake    chan struct{} // capacity 1: signalled when credit arrives, and on close
	done    chan struct{} // closed when the subscriber is gone, or broke a rule
	stopped bool
	closed  bool             // the subscriber closed its side: no more credit comes
	bad     *transport.Error // a frame the subscriber should not have sent ends it: the answer
}

// fail ends the subscription for a frame its subscriber should not have
// sent; the writer answers with err (failure).
func (c *credit) fail(err *transport.Error) {
	c.mu.Lock()
	if c.bad == nil {
		c.bad = err
	}
	c.mu.Unlock()
	c.stop()
}

// failure returns what fail was given, if it was called.
func (c *credit) failure() *transport.Error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bad
}

func newCredit(initial uint32, max uint64) *credit {
	return &credit{n: uint64(initial), max: max, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// add grants n more records. It returns false, and the subscription ends,
// if that takes the outstanding credit past the bound.
func (c *credit) add(n uint32) bool {
	c.mu.Lock()
	c.n += uint64(n)
	over := c.n+c.held > c.max
	if over {
		c.over = true
	}
	c.mu.Unlock()
	if over {
		c.stop()
		return false
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return true
}

// exceeded reports whether the subscription ended for going over the
// bound.
func (c *credit) exceeded() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.over
}

// available reports whether take would find credit without waiting.
func (c *credit) available() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n > 0
}

// take waits for credit and takes up to max of it. It returns false when
// the subscriber has gone, has closed its side and has no credit left, or
// abort is closed.
func (c *credit) take(max int, abort <-chan struct{}) (int, bool) {
	for {
		c.mu.Lock()
		if c.over {
			c.mu.Unlock()
			return 0, false
		}
		if c.n > 0 {
			n := min(uint64(max), c.n)
			c.n -= n
			c.held = n
			c.mu.Unlock()
			return int(n), true
		}
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return 0, false // spent, and no more is coming
		}
		select {
		case <-c.wake:
		case <-c.done:
			return 0, false
		case <-abort:
			return 0, false
		}
	}
}

// giveBack settles what take took: n records of it were not used and are
// credit again; the rest are being sent.
func (c *credit) giveBack(n int) {
	c.mu.Lock()
	c.n += uint64(max(n, 0))
	c.held = 0
	c.mu.Unlock()
}

// close notes that the subscriber closed its side of the stream (a
// half-close): it grants no more, and what it granted is still its own,
// so the subscription goes on until take finds it spent.
func (c *credit) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// stop ends the subscription: the subscriber is gone (its stream reset,
// its connection closed), or a frame it sent ends it.
func (c *credit) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.stopped {
		c.stopped = true
		close(c.done)
	}
}
