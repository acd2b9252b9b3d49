package msgtrace

import (
	"runtime"
	"sync"
	"time"
)

// DeferDelay is how often Deferred runs the work queued since its last
// run.
const DeferDelay = 2 * time.Millisecond

// tick is the runner's period: DeferDelay; tests lengthen it.
var tick = DeferDelay

// parkAfter is how many runs in a row find nothing before the runner
// stops ticking: a second of idleness. Tests shorten it.
var parkAfter = 500

// Deferred runs telemetry work (ending spans, recording latencies) off the
// path of the records it describes, in batches: Add queues a function, and
// a goroutine of the Deferred's own runs what is queued every DeferDelay,
// or sooner when its owner says the process is about to idle (Soon).
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
// But a tick falls anywhere, also inside the next record's path (in a
// broker with one P, a batch that starts while a publish waits on its
// fsync delays its ack by the batch's length). So at light load the owner
// calls Soon where it knows it is about to idle (a broker that has just
// answered every record it held, a client that has just sent its only
// record in flight), and the runner parks after such a run instead of
// ticking on: measured with `felixctl bench --local --telemetry`, a closed
// loop's traced p50 over untraced went from 1.08-1.09 to 1.02-1.04 direct
// and from 1.13-1.17 to 1.08-1.13 forwarded.
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
	soon    chan struct{} // Soon's requests, made when the runner starts
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
		d.kick, d.soon = make(chan struct{}, 1), make(chan struct{}, 1)
		d.stop, d.done = make(chan struct{}), make(chan struct{})
		go d.run()
	case d.parked:
		d.parked, wake = false, true
	}
	d.mu.Unlock()
	if wake {
		d.kick <- struct{}{} // sent once per parking: never blocks
	}
}

// Soon asks the runner to run what is queued as soon as the goroutines
// runnable now have run: a caller that has just written its last answer
// and has nothing else in hand (the process is about to idle) calls it, so
// that the work runs in the idle time before the next request, on caches
// still warm, rather than at a tick that may fall inside a request's path.
// The runner yields once first, so the goroutines the caller's writes
// woke (quic-go's sender) go before it. It never blocks; before the first
// Add and after Close it does nothing.
func (d *Deferred) Soon() {
	d.mu.Lock()
	off := !d.started || d.closed
	d.mu.Unlock()
	if off {
		return
	}
	select {
	case d.soon <- struct{}{}:
	default: // already asked
	}
}

// run runs the queue every DeferDelay, and when asked by Soon, until
// Close. It parks (stops ticking) once a second of ticks found nothing,
// or right after a run Soon asked for left nothing queued: at light load
// each record's work runs when Soon asks, with no tick in between to wake
// the process; an Add to an empty queue wakes it and starts the ticks
// again, which run the batches under load, where Soon is seldom asked.
func (d *Deferred) run() {
	defer close(d.done)
	t := time.NewTicker(tick)
	defer t.Stop()
	for idle := 0; ; {
		select {
		case <-d.stop:
			return
		case <-d.soon:
			d.runSoon()
			idle = parkAfter
		case <-t.C:
			if d.flush() > 0 {
				idle = 0
				continue
			}
			idle++
		}
		if idle < parkAfter {
			continue
		}
		d.mu.Lock()
		if len(d.fns) > 0 {
			d.mu.Unlock()
			idle = 0
			continue
		}
		d.parked = true
		d.mu.Unlock()
		t.Stop()
		if !d.waitParked() {
			return
		}
		idle = 0
		t.Reset(tick)
	}
}

// waitParked waits, ticker stopped, for an Add to kick the runner (true)
// or for Close (false), running what Soon asks for meanwhile.
func (d *Deferred) waitParked() bool {
	for {
		select {
		case <-d.stop:
			return false
		case <-d.kick:
			return true
		case <-d.soon:
			d.runSoon()
		}
	}
}

// runSoon runs the queue for Soon, after yielding once to the process's
// goroutines and once to the machine's threads (yieldCPU): the caller's
// last write woke a thread of another process (the receiver of its
// packet), which Linux tends to queue on this CPU, the waker's, expecting
// the waker to sleep. Building spans instead would keep it waiting.
// Measured, seven alternated pairs of `felixctl bench --local
// --telemetry`: traced over untraced p50 1.013 direct and 1.072
// forwarded (medians) with the yield, 1.033 and 1.094 without.
func (d *Deferred) runSoon() {
	runtime.Gosched()
	yieldCPU()
	d.flush()
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
