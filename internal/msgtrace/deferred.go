package msgtrace

import (
	"sync"
	"time"
)

// DeferDelay is how long Deferred lets work gather before running it.
const DeferDelay = 2 * time.Millisecond

// Deferred runs telemetry work (ending spans, recording latencies) off the
// path of the records it describes, in batches: Add queues a function, and
// the first Add of a batch arms a timer that runs the batch DeferDelay
// later on a goroutine of its own.
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
// Add never blocks on the work and never wakes a goroutine. Close runs
// what is queued, waits for a batch in progress, and runs later Adds
// inline.
type Deferred struct {
	mu     sync.Mutex
	fns    []func()
	spare  []func()
	timer  *time.Timer
	closed bool

	running sync.Mutex     // held while a batch runs
	armed   sync.WaitGroup // one per timer run due
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
	if len(d.fns) == 1 {
		if d.timer == nil {
			d.armed.Add(1)
			d.timer = time.AfterFunc(DeferDelay, d.fire)
		} else if !d.timer.Reset(DeferDelay) {
			d.armed.Add(1) // it had run or been stopped: one more run is due
		}
	}
	d.mu.Unlock()
}

// fire is the timer's function.
func (d *Deferred) fire() {
	defer d.armed.Done()
	d.flush()
}

// flush runs the queued batch.
func (d *Deferred) flush() {
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
}

// Close runs what is queued and makes later Adds run inline. It returns
// once no batch is running and no timer run is due.
func (d *Deferred) Close() {
	d.mu.Lock()
	d.closed = true
	if d.timer != nil && d.timer.Stop() {
		d.armed.Done() // the due run will not happen
	}
	d.mu.Unlock()
	d.flush()
	d.armed.Wait()
}
