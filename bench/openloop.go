package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/felix-broker/felix/client"
)

// schedule is an open-loop send schedule: record i is meant to be sent at
// start + i*interval, whatever happened to the records before it.
type schedule struct {
	start    time.Time
	interval time.Duration
}

func newSchedule(start time.Time, ratePerSec int) schedule {
	return schedule{start: start, interval: time.Second / time.Duration(ratePerSec)}
}

// at returns the intended send time of record i.
func (s schedule) at(i int) time.Time { return s.start.Add(time.Duration(i) * s.interval) }

// pacer is the open-loop generator's clock. It sleeps on a timer until
// each record's intended send time and never spins: on a 2-core machine a
// busy-waiting generator takes the CPU the brokers need (measured: 93% of
// a core, and three times the brokers' latency). Timers there are coarse
// (a 200 µs sleep can take over a millisecond), so a wake-up often finds
// several records due; they are sent back to back.
type pacer struct {
	sched schedule
	timer *time.Timer
	wake  time.Time // when the last sleep ended
}

func newPacer(ratePerSec int) *pacer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &pacer{sched: newSchedule(time.Now(), ratePerSec), timer: t}
}

// next waits until record i is due and returns its intended send time and
// the time Felix is charged from: the intended time, or the pacer's
// wake-up when its own timer overshot past it. Whatever delays the send
// after that (a full window, a blocked write, the sends before it in the
// same burst) is charged; the timer's overshoot is the generator's lag,
// not Felix's.
func (p *pacer) next(ctx context.Context, i int) (intended, charged time.Time, err error) {
	intended = p.sched.at(i)
	if d := time.Until(intended); d > 0 {
		p.timer.Reset(d)
		select {
		case <-p.timer.C:
		case <-ctx.Done():
			p.timer.Stop()
			return intended, intended, context.Cause(ctx)
		}
		p.wake = time.Now()
	}
	charged = intended
	if p.wake.After(intended) {
		charged = p.wake
	}
	return intended, charged, nil
}

func (p *pacer) stop() { p.timer.Stop() }

// coRecorder records open-loop latencies corrected for coordinated
// omission: a record's latency runs from the time it was due, not from
// when the generator got round to sending it. A generator held up by the
// system (a full window, a stalled connection) therefore cannot hide the
// stall by sending late: every record scheduled during it carries the
// wait. "Due" is the intended send time, or the generator's wake-up when
// its timer overshot: that overshoot is the generator's, recorded apart as
// its lag and not charged.
type coRecorder struct {
	lat  *hdrhistogram.Histogram // done - charged: what open loop reports
	full *hdrhistogram.Histogram // done - intended: nothing excused, the generator's lag included
	raw  *hdrhistogram.Histogram // done - sent: what a naive harness reports
	lag  *hdrhistogram.Histogram // charged - intended: the generator's timer overshoot
	wait *hdrhistogram.Histogram // sent - charged: what the send waited for (charged)
	// lat split at the ack's batch stamp (the owner's clock when it began
	// the batch the record was written in, before its write and fsync):
	// charged - stamp is the way in (the client, the network, the
	// broker's read and the wait for the owner's committer), done - stamp
	// the write, the fsync and the way back. Meaningful only when the
	// owner's clock is this process's (a local cluster).
	toBatch, fromBatch *hdrhistogram.Histogram

	first, last time.Time // earliest intended send, latest ack
}

func newCORecorder() *coRecorder {
	return &coRecorder{lat: newHist(), full: newHist(), raw: newHist(), lag: newHist(), wait: newHist(), toBatch: newHist(), fromBatch: newHist()}
}

// Record adds one record meant to be sent at intended, charged from
// charged (intended, or the generator's later wake-up), sent at sent,
// written in the batch the owner stamped stamp, whose ack arrived at done.
func (r *coRecorder) Record(intended, charged, sent, stamp, done time.Time) {
	record(r.lat, done.Sub(charged))
	record(r.full, done.Sub(intended))
	record(r.raw, done.Sub(sent))
	record(r.lag, charged.Sub(intended))
	record(r.wait, sent.Sub(charged))
	record(r.toBatch, stamp.Sub(charged))
	record(r.fromBatch, done.Sub(stamp))
	if r.first.IsZero() || intended.Before(r.first) {
		r.first = intended
	}
	if done.After(r.last) {
		r.last = done
	}
}

// merge adds o's records to r.
func (r *coRecorder) merge(o *coRecorder) {
	r.lat.Merge(o.lat)
	r.full.Merge(o.full)
	r.raw.Merge(o.raw)
	r.lag.Merge(o.lag)
	r.wait.Merge(o.wait)
	r.toBatch.Merge(o.toBatch)
	r.fromBatch.Merge(o.fromBatch)
	if !o.first.IsZero() && (r.first.IsZero() || o.first.Before(r.first)) {
		r.first = o.first
	}
	if o.last.After(r.last) {
		r.last = o.last
	}
}

// trial returns what the recorder saw as one trial; the split at the
// batch stamp only when sameClock (the owners' clock is this process's).
func (r *coRecorder) trial(acks *ackGroups, sameClock bool) trial {
	t := trial{hist: r.lat, fromIntended: r.full, lag: r.lag, raw: r.raw, wait: r.wait, acks: acks,
		count: r.lat.TotalCount(), elapsed: r.last.Sub(r.first)}
	if sameClock {
		t.toBatch, t.fromBatch = r.toBatch, r.fromBatch
	}
	return t
}

// sendFunc sends one record without waiting for its ack (PublishAsync),
// with then to be called with its outcome (client.OnResolved).
type sendFunc func(ctx context.Context, then func(client.Ack, error)) error

// openLoop sends warmup+n records at ratePerSec, record i through
// sends[i mod len(sends)], and returns the measured ones (those after the
// warm-up). The calling goroutine is the generator: it sleeps on a pacer
// until each record is due and sends it. Each record's ack is timestamped
// and recorded by its OnResolved function, on the publisher's ack reader
// as the ack is read: no goroutine of the bench's waits per record (a
// collector goroutine per publisher did, one wake-up per record, and its
// wake-up was charged to the record).
func openLoop(ctx context.Context, ratePerSec, warmup, n int, sends []sendFunc, prog *progress) (*coRecorder, *ackGroups, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	cols := make([]*collector, len(sends))
	for k := range sends {
		cols[k] = &collector{rec: newCORecorder(), acks: newAckGroups()}
	}
	// Records sent and not yet resolved; resolved is closed once the
	// generator is done and none is left (no goroutine waits for it).
	var outstanding atomic.Int64
	var sentAll atomic.Bool
	resolved := make(chan struct{})
	var closeOnce sync.Once
	settle := func() {
		if sentAll.Load() && outstanding.Load() == 0 {
			closeOnce.Do(func() { close(resolved) })
		}
	}

	p := newPacer(ratePerSec)
	defer p.stop()
	var sendErr error
	for i := range warmup + n {
		intended, charged, err := p.next(ctx, i)
		if err != nil {
			break
		}
		col, measured := cols[i%len(cols)], i >= warmup
		// The record goes out when the send returns: a wait inside it
		// (a full window, a blocked write) is the system's, the send
		// wait. Its ack may come first; then it went out by the call.
		calling := time.Now()
		var sentAt atomic.Int64 // since calling; 0 until the send returns
		outstanding.Add(1)
		err = sends[i%len(sends)](ctx, func(ack client.Ack, err error) {
			done := time.Now()
			sent := calling.Add(time.Duration(sentAt.Load()))
			defer func() {
				outstanding.Add(-1)
				settle()
			}()
			if err != nil {
				cancel(fmt.Errorf("open loop: %w", err)) // stops the generator
				return
			}
			if measured {
				col.record(intended, charged, sent, done, ack)
			}
			prog.add(1)
		})
		sentAt.Store(int64(max(time.Since(calling), 1)))
		if err != nil {
			outstanding.Add(-1) // not sent: no call will come
			if ctx.Err() == nil {
				sendErr = fmt.Errorf("open loop: record %d: %w", i, err)
			}
			break
		}
		if ctx.Err() != nil {
			break
		}
	}
	sentAll.Store(true)
	settle()
	select {
	case <-resolved:
	case <-ctx.Done():
		// Failed or cancelled: what is still in flight resolves when its
		// publisher closes, and is not read.
	}
	if sendErr != nil {
		return nil, nil, sendErr
	}
	if err := context.Cause(ctx); err != nil {
		return nil, nil, err
	}
	rec, acks := newCORecorder(), newAckGroups()
	for _, col := range cols {
		col.mu.Lock()
		rec.merge(col.rec)
		acks.merge(col.acks)
		col.mu.Unlock()
	}
	return rec, acks, nil
}

// collector records one publisher's acks. Its functions are called on
// the publisher's ack reader, and on another goroutine for a failure: mu
// keeps them apart (uncontended in the usual case).
type collector struct {
	mu   sync.Mutex
	rec  *coRecorder
	acks *ackGroups
}

func (c *collector) record(intended, charged, sent, done time.Time, ack client.Ack) {
	c.mu.Lock()
	c.rec.Record(intended, charged, sent, ack.Timestamp, done)
	c.acks.add(ack)
	c.mu.Unlock()
}
