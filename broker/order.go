package broker

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// A publisher stream's records of one shard are committed in the order
// the stream sent them, also when some of them must be routed again (an
// owner refused a forward with NotOwner, a replicated shard had no
// leader, a lane died before a record went out) and the client never
// sees that retry. The records after one being routed again must not
// overtake it, and neither may a record routed by a newer map to another
// owner while earlier ones are still unanswered on the old route.
//
// So each shard's unanswered records of the stream are on one route at a
// time: a lane (one owner, one QUIC stream, first in first out) or this
// broker's own replica. A record whose shard has unanswered records on
// another route, or records waiting to be routed again, waits behind
// them, in the order received. The retrier routes the waiting records of
// a shard oldest first, one after the other without waiting for their
// answers while each takes the route of the shard's unanswered records
// (so a backlog that built up during a leader change leaves pipelined,
// and the shard is back on the fast path once it is gone); a record that
// would take another route waits until nothing of the shard is unanswered
// (blocked). A waiting record whose successor was acknowledged meanwhile
// (an owner that refused one record and then took the next) can no
// longer be committed in order: it fails, and nothing of it was written.
//
// Replication factor 1 records appended to this broker's own log cannot
// be refused, so they are not counted: they only check, with one atomic
// load when nothing waits, that their shard has nothing unanswered
// elsewhere.

// routeOrder is a session's per-shard routes and waiting records.
type routeOrder struct {
	sync.Mutex
	shards  map[shardmap.ShardID]*shardRoute
	running bool          // the retrier runs
	wake    chan struct{} // a shard may be ready for the retrier
	tracked atomic.Int32  // len(shards), read without the lock
}

// shardRoute is where a session's unanswered records of one shard went,
// and what waits behind them.
type shardRoute struct {
	lane *lane  // the route of the unanswered records; nil: this broker's replica
	n    int    // records counted on it, not yet answered or handed back
	last uint64 // the highest receipt number counted on it

	// waiting are the records to route again and those that came after
	// them, by receipt (inbound.n).
	waiting []refused
	// resuming: the retrier took the first waiting record and has not
	// routed it yet; the others keep waiting.
	resuming bool
	// blocked: a waiting record may not follow the unanswered records
	// (its route is another one, or it was received before one of them),
	// so none is routed again until n is 0.
	blocked bool
	// acked is the highest receipt number of the shard acknowledged since
	// the shard last had nothing unanswered: a waiting record below it
	// fails.
	acked uint64
}

func (o *routeOrder) init() {
	o.shards = map[shardmap.ShardID]*shardRoute{}
	o.wake = make(chan struct{}, 1)
}

// refused is a record to route again: an owner refused it with NotOwner
// at epoch, or it found no leader, or it came while others waited.
type refused struct {
	in      inbound
	attempt int
	epoch   uint64 // the refusing owner's map epoch; 0: no map to wait for
	by      string // the refusing owner's id
	// delay is how long after queued to wait before routing it again: a
	// replicated shard's record waiting for a leader to be elected. It
	// counts from the requeue, not from when the retrier gets to it, so
	// that records handed back together wait once, not one after another.
	delay  time.Duration
	queued time.Time
}

// onRoute reports whether in, a record of shard id on its attempt-th
// routing, may go on route l (a lane, or nil for this broker's replica)
// now, and if count, counts it there until it is answered or handed back
// (resolved). Otherwise it queues in behind the shard's earlier records
// and the caller drops it: the retrier routes it. It never blocks.
func (p *pubSession) onRoute(in *inbound, id shardmap.ShardID, l *lane, attempt int, count bool) bool {
	o := &p.order
	if !count && o.tracked.Load() == 0 {
		return true
	}
	o.Lock()
	defer o.Unlock()
	r := o.shards[id]
	if r != nil && (!r.follows(in, l) || (len(r.waiting) > 0 || r.resuming) && !in.resumed) {
		if !r.follows(in, l) {
			r.blocked = true
		}
		r.wait(refused{in: in.rerouted(), attempt: attempt})
		p.startRetrier()
		return false
	}
	if count {
		if r == nil {
			r = &shardRoute{}
			o.shards[id] = r
			o.tracked.Add(1)
		}
		r.lane = l
		r.n++
		r.last = max(r.last, in.n)
		in.route = r
	}
	return true
}

// follows reports whether in may go on route l behind the shard's
// unanswered records: they are on l, and were all received before it
// (a route is first in first out, so it keeps their order), or there are
// none. Called with the lock held.
func (r *shardRoute) follows(in *inbound, l *lane) bool {
	return r.n == 0 || r.lane == l && in.n > r.last
}

// wait queues w by receipt. Called with the lock held.
func (r *shardRoute) wait(w refused) {
	w.in.resumed, w.in.route = false, nil
	i, _ := slices.BinarySearchFunc(r.waiting, w.in.n, func(x refused, n uint64) int {
		switch {
		case x.in.n < n:
			return -1
		case x.in.n > n:
			return 1
		}
		return 0
	})
	r.waiting = slices.Insert(r.waiting, i, w)
}

// resolved uncounts in from its shard's route: it was answered (acked
// or not) or handed back to be routed again.
func (p *pubSession) resolved(in *inbound, acked bool) {
	if in.route == nil {
		return
	}
	o := &p.order
	o.Lock()
	ready := p.uncount(in, acked)
	o.Unlock()
	if ready {
		select {
		case o.wake <- struct{}{}:
		default:
		}
	}
}

// uncount is resolved with the lock held: it reports whether the records
// waiting behind in's route may go now.
func (p *pubSession) uncount(in *inbound, acked bool) (ready bool) {
	r := in.route
	if r == nil {
		return false
	}
	in.route = nil
	r.n--
	if acked && in.n > r.acked {
		r.acked = in.n
	}
	if r.n == 0 {
		r.blocked = false
	}
	if r.n == 0 && len(r.waiting) == 0 && !r.resuming {
		p.forget(r, in.pub.Stream, in.ev.shard)
	}
	return r.n == 0 && len(r.waiting) > 0
}

// forget drops r, the route of shard stream/shard with nothing on it, so
// that a session holds routes only for shards with records in flight.
// Called with the lock held.
func (p *pubSession) forget(r *shardRoute, stream string, shard int) {
	id := shardmap.ShardID{Stream: stream, Shard: shard}
	if p.order.shards[id] == r {
		delete(p.order.shards, id)
		p.order.tracked.Add(-1)
	}
}

// requeue hands r, a record of shard id refused or without a leader on
// attempt r.attempt, to the retrier, which routes it on the next
// attempt. It never blocks.
func (p *pubSession) requeue(r refused, id shardmap.ShardID) {
	r.attempt++
	if r.delay > 0 {
		r.queued = time.Now()
	}
	o := &p.order
	o.Lock()
	// Uncounted and queued in one critical section: between the two, a
	// record's route left empty was dropped, and the reader could send
	// the shard's next record ahead of it (a forward, which then made
	// this one fail as overtaken, or an append here, committed before
	// it: both acked, out of order).
	p.uncount(&r.in, false)
	sr := o.shards[id]
	if sr == nil {
		sr = &shardRoute{}
		o.shards[id] = sr
		o.tracked.Add(1)
	}
	sr.wait(r)
	p.startRetrier()
	o.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// startRetrier starts the retrier unless it runs. Called with the lock
// held.
func (p *pubSession) startRetrier() {
	if p.order.running {
		return
	}
	p.order.running = true
	p.workers.Add(1)
	go p.retrier()
}

// next takes the first waiting record of a shard that is ready (nothing
// else of it being resumed, and nothing of it unanswered unless on the
// route the record may take too: not blocked), or of any shard once the
// session has ended. It reports done when nothing waits: the retrier
// then ends.
func (p *pubSession) next() (w refused, r *shardRoute, ok, done bool) {
	o := &p.order
	o.Lock()
	defer o.Unlock()
	ending := p.ctx.Err() != nil
	waits := false
	for id, sr := range o.shards {
		if len(sr.waiting) == 0 {
			if sr.n == 0 && !sr.resuming {
				p.forget(sr, id.Stream, id.Shard)
			}
			continue
		}
		waits = true
		if ending || !sr.resuming && (sr.n == 0 || !sr.blocked && sr.waiting[0].in.n > sr.last) {
			w = sr.waiting[0]
			sr.waiting = slices.Delete(sr.waiting, 0, 1)
			sr.resuming = true
			return w, sr, true, false
		}
	}
	if !waits {
		o.running = false
		return w, nil, false, true
	}
	return w, nil, false, false
}

// retrier routes the waiting records again, each shard's in the order
// received: for a refused one it first catches up to the refusing
// owner's map (waiting for the control plane if need be, holding
// nothing). It runs while records wait; whoever queues the first starts
// it, so no reader ever waits for a map.
func (p *pubSession) retrier() {
	defer p.workers.Done()
	for {
		w, r, ok, done := p.next()
		if done {
			return
		}
		if !ok {
			select {
			case <-p.order.wake:
			case <-p.ctx.Done():
			}
			continue
		}
		p.resume(w, r)
		p.order.Lock()
		r.resuming = false
		p.order.Unlock()
		// Its shard's route is dropped by resolved, or by next once
		// nothing is left on it.
	}
}

// resume routes w, the first waiting record of its shard, again.
func (p *pubSession) resume(w refused, r *shardRoute) {
	if p.ctx.Err() != nil {
		p.fail(w.in, &transport.Error{Code: transport.CodeShuttingDown,
			Message: fmt.Sprintf("the publisher stream on %s closed before the record could be routed again; nothing was written", p.b.cfg.NodeID)})
		return
	}
	p.order.Lock()
	overtaken := w.in.n < r.acked
	p.order.Unlock()
	if overtaken {
		p.fail(w.in, &transport.Error{Code: transport.CodeUnavailable,
			Message: fmt.Sprintf("%s took a later record of this stream's shard after refusing this one, which can no longer be committed in order; nothing was written", w.by)})
		return
	}
	if d := time.Until(w.queued.Add(w.delay)); w.delay > 0 && d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-p.ctx.Done():
			t.Stop()
		}
	}
	if w.epoch > 0 {
		if _, err := p.b.catchUp(p.ctx, w.epoch); err != nil {
			p.fail(w.in, &transport.Error{Code: transport.CodeUnavailable,
				Message: fmt.Sprintf("%s was refused by %s (not the owner at epoch %d) and could not get that map: %v", p.b.cfg.NodeID, w.by, w.epoch, err)})
			return
		}
	}
	w.in.resumed = true
	p.dispatch(w.in, w.attempt)
}
