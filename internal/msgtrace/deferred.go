package msgtrace

import (
	"sync"
	"time"
)

// DeferDelay is how often Deferred runs the work queued since its last
// run.
const DeferDelay = 2 * time.Millisecond

// parkAfter is how many runs in a row find nothing before the runner
// stops ticking: a second of idleness. Tests shorten it.
var parkAfter = 500

// Deferred runs telemetry work (ending spans, recording latencies) off the
// path of the records it describes, in batches: Add queues a function, and
// a goroutine of the Deferred's own runs what is queued every DeferDelay.
//
// Why not right away: on a machine that idles between records, every span
// costs several microseconds on cold caches, and whatever a broker does
// after writing an ack delays the ack, because the goroutine the write
// wakes (quic-go's sender) is queued behind the one that woke it. Measured
// on a traced publish, span work done inline added 5-15% to its latency;
// in a batch it runs on warm caches while the next records wait on their
// fsync. The timestamps the work records are taken when things happen, so
// deferring changes no figure.
//
// Add takes a mutex and appends: it arms no timer (arming one wakes the
// runtime's network poller, a system call on the path Add is meant to
// stay off) and wakes no goroutine, except the first Add after a second
// with none, which wakes the parked runner. The runner starts with the
// first Add; Close runs what is queued, stops the runner and makes later
// Adds run inline.
type Deferred struct {
	mu      sync.Mutex
	fns     []func()
	spare   []func()
	started bool // the runner was started
	parked  bool // the runner waits for kick
	closed  bool
	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}

	running sync.Mutex // held while a batch runs
}

// Add queues f.
func (d *Deferred) Add(f func()) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		f()
		return
	}
	d.fns = append(d.fns, f)
	wake := false
	switch {
	case !d.started:
		d.started = true
		d.kick, d.stop, d.done = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
		go d.run()
	case d.parked:
		d.parked, wake = false, true
	}
	d.mu.Unlock()
	if wake {
		d.kick <- struct{}{} // sent once per parking: never blocks
	}
}

// run runs the queue every DeferDelay until Close, parking while there is
// nothing to run.
func (d *Deferred) run() {
	defer close(d.done)
	t := time.NewTicker(DeferDelay)
	defer t.Stop()
	for idle := 0; ; {
		select {
		case <-d.stop:
			return
		case <-t.C:
		}
		if d.flush() > 0 {
			idle = 0
			continue
		}
		if idle++; idle < parkAfter {
			continue
		}
		d.mu.Lock()
		if len(d.fns) > 0 {
			d.mu.Unlock()
			continue
		}
		d.parked = true
		d.mu.Unlock()
		t.Stop()
		select {
		case <-d.stop:
			return
		case <-d.kick:
		}
		idle = 0
		t.Reset(DeferDelay)
	}
}

// flush runs the queued batch and returns its length.
func (d *Deferred) flush() int {
	d.running.Lock()
	defer d.running.Unlock()
	d.mu.Lock()
	fns := d.fns
	d.fns, d.spare = d.spare[:0], nil
	d.mu.Unlock()
	for i, f := range fns {
		f()
		fns[i] = nil
	}
	d.mu.Lock()
	if d.spare == nil {
		d.spare = fns[:0]
	}
	d.mu.Unlock()
	return len(fns)
}

// Close runs what is queued, stops the runner and makes later Adds run
// inline.
func (d *Deferred) Close() {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	d.closed = true
	started := d.started
	d.mu.Unlock()
	if started {
		close(d.stop)
		<-d.done
	}
	d.flush()
}
