package broker

import "sync"

// credit counts the records a subscriber has allowed the broker to send.
type credit struct {
	mu      sync.Mutex
	n       uint64
	wake    chan struct{} // capacity 1: signalled when credit arrives
	done    chan struct{} // closed when the subscriber's side ends
	stopped bool
}

func newCredit(initial uint32) *credit {
	return &credit{n: uint64(initial), wake: make(chan struct{}, 1), done: make(chan struct{})}
}

func (c *credit) add(n uint32) {
	c.mu.Lock()
	c.n += uint64(n)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// take waits for credit and takes up to max of it. It returns false when
// the subscriber has gone or abort is closed.
func (c *credit) take(max int, abort <-chan struct{}) (int, bool) {
	for {
		c.mu.Lock()
		if c.n > 0 {
			n := min(uint64(max), c.n)
			c.n -= n
			c.mu.Unlock()
			return int(n), true
		}
		c.mu.Unlock()
		select {
		case <-c.wake:
		case <-c.done:
			return 0, false
		case <-abort:
			return 0, false
		}
	}
}

// giveBack returns credit taken but not used.
func (c *credit) giveBack(n int) {
	if n > 0 {
		c.mu.Lock()
		c.n += uint64(n)
		c.mu.Unlock()
	}
}

func (c *credit) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.stopped {
		c.stopped = true
		close(c.done)
	}
}
