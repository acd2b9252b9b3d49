package msgtrace

import "runtime"

// Late is telemetry deferred until the answers it describes are on their
// way. A goroutine answering a batch of records (a shard log's committer,
// a forwarding lane's reader, the SDK's ack reader) adds each answer's
// spans and timings while it answers, and runs them once the batch is
// answered.
//
// Run first yields the processor. Writing an ack to a QUIC stream, or
// releasing a waiting publisher, only makes another goroutine runnable,
// and the Go scheduler queues it behind the goroutine that woke it: span
// work done right away holds the answer back by as long as the work takes,
// several microseconds per span on the cold caches of a machine that idles
// between records. Measured on a direct publish, that was ~5% of its
// latency; yielding first takes it off the answer's path.
//
// A Late belongs to one goroutine at a time.
type Late struct{ fns []func() }

// Add queues f for the next Run.
func (l *Late) Add(f func()) { l.fns = append(l.fns, f) }

// Run yields, then runs and forgets what was added.
func (l *Late) Run() {
	if len(l.fns) == 0 {
		return
	}
	runtime.Gosched()
	for i, f := range l.fns {
		f()
		l.fns[i] = nil
	}
	l.fns = l.fns[:0]
}
