package bench

import (
	"context"
	"fmt"
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

// coRecorder records open-loop latencies corrected for coordinated
// omission: a record's latency runs from its intended send time, not from
// when the generator got round to sending it. A generator that is held up
// (a full window, a stalled connection, a late timer) therefore cannot hide
// the stall by sending late: every record scheduled during it carries the
// wait. The lag between intended and actual send is recorded apart, so a
// reader can see how much of the latency is the generator's own.
type coRecorder struct {
	lat *hdrhistogram.Histogram // done - intended
	raw *hdrhistogram.Histogram // done - sent: what a naive harness reports
	lag *hdrhistogram.Histogram // sent - intended

	first, last time.Time // earliest intended send, latest ack
}

func newCORecorder() *coRecorder {
	return &coRecorder{lat: newHist(), raw: newHist(), lag: newHist()}
}

// Record adds one record sent at sent, meant to be sent at intended, whose
// ack arrived at done.
func (r *coRecorder) Record(intended, sent, done time.Time) {
	record(r.lat, done.Sub(intended))
	record(r.raw, done.Sub(sent))
	record(r.lag, sent.Sub(intended))
	if r.first.IsZero() || intended.Before(r.first) {
		r.first = intended
	}
	if done.After(r.last) {
		r.last = done
	}
}

// inflight is one open-loop record waiting for its ack.
type inflight struct {
	intended, sent time.Time
	fut            *client.Future
	measured       bool
}

// openLoop sends warmup+n records at ratePerSec through send, which must
// not wait for the ack (PublishAsync), and records every measured one in
// rec. The calling goroutine sends; one collector goroutine, owned and
// waited for here, takes the futures in send order and timestamps each ack
// as it resolves. Between sends the sender sleeps until the next intended
// time; when it is behind (the sleep overshot, or send blocked on a full
// window) it sends at once, and the lag counts against the latency.
func openLoop(ctx context.Context, ratePerSec, warmup, n int, rec *coRecorder, acks *ackGroups, prog *progress,
	send func(context.Context) (*client.Future, error)) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	queue := make(chan inflight, 1<<14)
	collected := make(chan error, 1)
	go func() {
		err := collect(ctx, queue, rec, acks, prog)
		if err != nil {
			cancel(err) // stops the sender
			for range queue {
			}
		}
		collected <- err
	}()

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	sched := newSchedule(time.Now(), ratePerSec)
	var sendErr error
	for i := range warmup + n {
		intended := sched.at(i)
		if d := time.Until(intended); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		sent := time.Now()
		fut, err := send(ctx)
		if err != nil {
			sendErr = fmt.Errorf("open loop: record %d: %w", i, err)
			break
		}
		select {
		case queue <- inflight{intended: intended, sent: sent, fut: fut, measured: i >= warmup}:
		case <-ctx.Done():
		}
	}
	close(queue)
	if collErr := <-collected; collErr != nil {
		return collErr
	}
	if sendErr != nil {
		return sendErr
	}
	return ctx.Err()
}

// collect waits for each queued future in order and records it.
func collect(ctx context.Context, queue <-chan inflight, rec *coRecorder, acks *ackGroups, prog *progress) error {
	for f := range queue {
		select {
		case <-f.fut.Done():
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		done := time.Now()
		ack, err := f.fut.Wait(ctx)
		if err != nil {
			return fmt.Errorf("open loop: %w", err)
		}
		if f.measured {
			rec.Record(f.intended, f.sent, done)
			acks.add(ack)
		}
		prog.add(1)
	}
	return nil
}
