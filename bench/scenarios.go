package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/felix-broker/felix/client"
)

// Scenario names.
const (
	Direct     = "direct"     // publisher connected to the shard's owner
	Forwarded  = "forwarded"  // publisher connected to another broker
	E2E        = "e2e"        // publish until a subscriber has the record
	Throughput = "throughput" // concurrent pipelined publishers
	Fanout     = "fanout"     // one stream, many subscribers

	// Load is open loop over the throughput scenario's publishers at
	// fractions of the throughput it measured (--load); it runs as part of
	// throughput, not on its own.
	Load = "load"
)

// Scenarios lists every scenario in the order they run.
var Scenarios = []string{Direct, Forwarded, E2E, Throughput, Fanout}

// Modes of a run.
const (
	ModeClosed    = "closed"    // one record in flight
	ModeOpen      = "open"      // fixed rate, latency from the intended send time
	ModePipelined = "pipelined" // many publishers, each with a window in flight
)

// trial is what one trial of a scenario measured.
type trial struct {
	hist *hdrhistogram.Histogram // latencies of the measured records
	lag  *hdrhistogram.Histogram // open loop: the generator's lag (timer overshoot), not charged
	wait *hdrhistogram.Histogram // open loop: what the send waited for (a full window), charged
	raw  *hdrhistogram.Histogram // open loop: latency from the actual send
	// open loop: latency from the intended send time with nothing
	// excused, the generator's lag included (hist excuses it)
	fromIntended *hdrhistogram.Histogram
	// open loop on a local cluster: latency split at the owner's batch
	// stamp (see coRecorder)
	toBatch, fromBatch *hdrhistogram.Histogram
	count              int64         // what throughput counts: acks or deliveries
	elapsed            time.Duration // wall time of the measured part
	acks               *ackGroups
	usage              []ProcUsage
	wal                *walHists   // throughput: the brokers' WAL batches and fsyncs over the measured part
	quic               *quicCounts // throughput, load: what the bench's QUIC connections sent and lost meanwhile
}

// publisherOn creates a one-shard stream named after name and returns a
// Publisher on it through its owner (scenario direct) or through another
// broker (forwarded), with the owner's and the via broker's ids.
func (e *env) publisherOn(ctx context.Context, scenario, name string) (pub *client.Publisher, owner, via string, err error) {
	stream, m, err := e.createStream(ctx, name, 1)
	if err != nil {
		return nil, "", "", err
	}
	owner, other, err := e.owner(m, stream, 0)
	if e.cfg.replicas > 1 {
		owner, other, err = e.leader(ctx, m, stream, 0)
	}
	if err != nil {
		return nil, "", "", err
	}
	via = owner
	if scenario == Forwarded {
		if other == "" {
			return nil, "", "", errSkip("one broker: nothing to forward to")
		}
		via = other
	}
	c, err := e.client(ctx, via)
	if err != nil {
		return nil, "", "", err
	}
	if pub, err = c.Publisher(ctx, stream); err != nil {
		return nil, "", "", fmt.Errorf("bench: %s: %w", name, err)
	}
	return pub, owner, via, nil
}

// onePath is a Publisher on a one-shard bench stream and the path its
// records take: through via to the shard's owner (its raft leader at
// replication factor 3). The closed-loop and open-loop rows of direct
// (and of forwarded) run on the same one, so that "light load costs no
// more than a lone record" compares one stream, shard and owner.
type onePath struct {
	pub                *client.Publisher
	stream, owner, via string
}

// pathFor creates scenario's stream (direct or forwarded) and returns a
// Publisher on it, which the caller closes.
func (e *env) pathFor(ctx context.Context, scenario string) (*onePath, error) {
	pub, owner, via, err := e.publisherOn(ctx, scenario, scenario)
	if err != nil {
		return nil, err
	}
	return &onePath{pub: pub, stream: e.names[scenario], owner: owner, via: via}, nil
}

// runPublish is the direct and forwarded scenarios, closed loop: one
// Publisher on the owner (or on another broker when forwarded), each
// record sent when the previous one is acked.
func (e *env) runPublish(ctx context.Context, scenario string, p *onePath) (*Result, error) {
	forwarded := scenario == Forwarded
	pub, owner, via := p.pub, p.owner, p.via
	value := make([]byte, e.cfg.size)
	check := pathCheck(scenario, via, owner, forwarded)

	var trials []trial
	for t := range e.cfg.trials {
		e.prog.phase(fmt.Sprintf("%s closed %d/%d", scenario, t+1, e.cfg.trials), e.cfg.warmup+e.cfg.count)
		tr := trial{hist: newHist(), acks: newAckGroups()}
		var start time.Time
		for i := range e.cfg.warmup + e.cfg.count {
			if i == e.cfg.warmup {
				start = time.Now()
			}
			t0 := time.Now()
			ack, err := pub.Publish(ctx, nil, value, client.WithShard(0))
			d := time.Since(t0)
			if err != nil {
				return nil, fmt.Errorf("bench: %s: publish: %w", scenario, err)
			}
			if err := check(ack); err != nil {
				return nil, err
			}
			if i >= e.cfg.warmup {
				record(tr.hist, d)
				tr.acks.add(ack)
				tr.count++
			}
			e.prog.add(1)
		}
		tr.elapsed = time.Since(start)
		trials = append(trials, tr)
	}
	res := summarize(scenario, ModeClosed, trials)
	res.Path, res.Stream = fmt.Sprintf("%s -> %s", via, owner), p.stream
	return res, nil
}

// pathCheck returns a check that an ack came the path the scenario is
// named for: from owner (the shard's owner, or its raft leader), and
// through another broker exactly when forwarded. Every record of the
// direct and forwarded rows is checked, so that a row never reports
// records that went another way.
func pathCheck(scenario, via, owner string, forwarded bool) func(client.Ack) error {
	return func(ack client.Ack) error {
		if ack.Forwarded != forwarded || ack.Owner != owner {
			return fmt.Errorf("bench: %s: record took the path %s -> %s (forwarded %v), expected %s -> %s: did the shard map change during the run?",
				scenario, ack.Via, ack.Owner, ack.Forwarded, via, owner)
		}
		return nil
	}
}

// checkedSend returns send with check applied to each ack: an ack that
// fails it resolves the record with check's error, which stops the open
// loop as a failed publish does.
func checkedSend(send sendFunc, check func(client.Ack) error) sendFunc {
	return func(ctx context.Context, then func(client.Ack, error)) error {
		return send(ctx, func(ack client.Ack, err error) {
			if err == nil {
				err = check(ack)
			}
			then(ack, err)
		})
	}
}

// runOpen is the direct or forwarded scenario in open loop: records sent
// at cfg.rate per second whatever the acks do, latency measured from each
// record's intended send time (or the generator's wake-up, when its timer
// overshot), on the closed loop's path p.
func (e *env) runOpen(ctx context.Context, scenario string, p *onePath) (*Result, error) {
	pub, owner, via := p.pub, p.owner, p.via
	value := make([]byte, e.cfg.size) // never modified: safe to share between records in flight
	n := max(1, int(float64(e.cfg.rate)*e.cfg.openDuration.Seconds()))
	warmup := max(1, e.cfg.rate/4) // a quarter of a second
	shard := client.WithShard(0)
	send := checkedSend(func(ctx context.Context, then func(client.Ack, error)) error {
		_, err := pub.PublishAsync(ctx, nil, value, shard, client.OnResolved(then))
		return err
	}, pathCheck(scenario+" open", via, owner, scenario == Forwarded))

	var trials []trial
	for t := range e.cfg.trials {
		e.prog.phase(fmt.Sprintf("%s open %d/s %d/%d", scenario, e.cfg.rate, t+1, e.cfg.trials), warmup+n)
		rec, acks, err := openLoop(ctx, e.cfg.rate, warmup, n, []sendFunc{send}, e.prog)
		if err != nil {
			return nil, fmt.Errorf("bench: %s: %w", scenario, err)
		}
		trials = append(trials, rec.trial(acks, e.sameClock()))
	}
	res := summarize(scenario, ModeOpen, trials)
	res.Path, res.Stream = fmt.Sprintf("%s -> %s", via, owner), p.stream
	res.RatePerSec = e.cfg.rate
	return res, nil
}

// stampLen is the bytes of a delivery payload that carry the send time.
const stampLen = 8

// runDelivery is the e2e (one subscriber) and fanout (cfg.subscribers)
// scenarios, closed loop: the publisher, on the owner, sends a record
// stamped with its send time, waits for its ack and for every subscriber
// to have it, then sends the next. Each subscriber has its own client,
// connected through a broker other than the owner where there is one (the
// SDK attaches the subscription to the owner), and records the time from
// the send to its delivery.
func (e *env) runDelivery(ctx context.Context, scenario string, subscribers int) (*Result, error) {
	stream, m, err := e.createStream(ctx, scenario, 1)
	if err != nil {
		return nil, err
	}
	owner, _, err := e.owner(m, stream, 0)
	if err != nil {
		return nil, err
	}
	pc, err := e.client(ctx, owner)
	if err != nil {
		return nil, err
	}
	pub, err := pc.Publisher(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("bench: %s: %w", scenario, err)
	}
	defer pub.Close()

	d := &delivery{base: e.base, arrived: make(chan struct{}, 1), failed: make(chan error, subscribers)}
	subCtx, stopSubs := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stopSubs()
		wg.Wait()
	}()
	for k := range subscribers {
		through := e.nodes[(k+1)%len(e.nodes)]
		if len(e.nodes) > 1 && through.ID == owner {
			through = e.nodes[(k+2)%len(e.nodes)]
		}
		sc, err := client.Connect(ctx, through.Addr, e.opts...)
		if err != nil {
			return nil, fmt.Errorf("bench: %s: connect subscriber %d to %s: %w", scenario, k, through.ID, err)
		}
		defer sc.Close()
		sub, err := sc.Subscribe(ctx, stream, client.Earliest())
		if err != nil {
			return nil, fmt.Errorf("bench: %s: subscribe %d through %s: %w", scenario, k, through.ID, err)
		}
		wg.Go(func() {
			defer sub.Stop()
			d.subscriber(subCtx, sub, k)
		})
	}

	value := make([]byte, max(e.cfg.size, stampLen))
	var trials []trial
	timeout := time.NewTimer(time.Hour)
	defer timeout.Stop()
	for t := range e.cfg.trials {
		e.prog.phase(fmt.Sprintf("%s closed %d/%d", scenario, t+1, e.cfg.trials), e.cfg.warmup+e.cfg.count)
		cur := &deliveryTrial{hists: make([]*hdrhistogram.Histogram, subscribers)}
		for k := range cur.hists {
			cur.hists[k] = newHist()
		}
		tr := trial{acks: newAckGroups()}
		var start time.Time
		for i := range e.cfg.warmup + e.cfg.count {
			if i == e.cfg.warmup {
				d.cur.Store(cur)
				start = time.Now()
			}
			d.pending.Store(int32(subscribers))
			binary.LittleEndian.PutUint64(value, uint64(time.Since(e.base)))
			ack, err := pub.Publish(ctx, nil, value, client.WithShard(0))
			if err != nil {
				return nil, fmt.Errorf("bench: %s: publish: %w", scenario, err)
			}
			timeout.Reset(10 * time.Second)
			select {
			case <-d.arrived:
			case err := <-d.failed:
				return nil, fmt.Errorf("bench: %s: subscriber: %w", scenario, err)
			case <-timeout.C:
				return nil, fmt.Errorf("bench: %s: record %d (offset %d) not delivered to %d of %d subscribers within 10s",
					scenario, i, ack.Offset, d.pending.Load(), subscribers)
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if i >= e.cfg.warmup {
				tr.acks.add(ack)
			}
			e.prog.add(1)
		}
		tr.elapsed = time.Since(start)
		d.cur.Store(nil)
		tr.hist = merged(cur.hists...) // every subscriber's record is in: they signalled arrival after recording
		tr.count = tr.hist.TotalCount()
		trials = append(trials, tr)
	}
	res := summarize(scenario, ModeClosed, trials)
	res.Subscribers = subscribers
	res.Path = fmt.Sprintf("%s -> %s -> subscribers", owner, owner)
	return res, nil
}

// delivery is the state the publisher of runDelivery shares with its
// subscribers.
type delivery struct {
	base    time.Time
	cur     atomic.Pointer[deliveryTrial] // nil during warm-up
	pending atomic.Int32                  // subscribers yet to receive the record in flight
	arrived chan struct{}                 // signalled by the last of them
	failed  chan error
}

// deliveryTrial holds one histogram per subscriber, each written only by
// its subscriber.
type deliveryTrial struct {
	hists []*hdrhistogram.Histogram
}

// subscriber records the delivery latency of each record until ctx ends.
func (d *delivery) subscriber(ctx context.Context, sub *client.Subscription, k int) {
	for rec, err := range sub.Records(ctx) {
		if err != nil {
			if ctx.Err() == nil {
				d.failed <- err // capacity: one per subscriber
			}
			return
		}
		now := time.Since(d.base)
		if len(rec.Value) < stampLen {
			d.failed <- fmt.Errorf("record %d of %d bytes: not the bench's", rec.Offset, len(rec.Value))
			return
		}
		sent := time.Duration(binary.LittleEndian.Uint64(rec.Value))
		if t := d.cur.Load(); t != nil {
			record(t.hists[k], now-sent)
		}
		if d.pending.Add(-1) == 0 {
			select {
			case d.arrived <- struct{}{}:
			default:
			}
		}
	}
}

// errSkip marks a scenario that cannot run against this cluster.
type errSkip string

func (e errSkip) Error() string { return string(e) }

func isSkip(err error) bool {
	var s errSkip
	return errors.As(err, &s)
}
