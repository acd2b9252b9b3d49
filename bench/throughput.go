package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/felix-broker/felix/client"
)

// runThroughput is the throughput scenario: cfg.publishers Publishers, each
// one QUIC stream with up to cfg.window records in flight, publisher p
// writing shard p mod shards through that shard's owner. Each trial runs a
// warm-up, then counts the acks that arrive within cfg.duration; the
// brokers' CPU and memory are sampled over the same interval.
func (e *env) runThroughput(ctx context.Context) (*Result, error) {
	shards := e.cfg.shards
	if shards <= 0 {
		shards = 2 * len(e.nodes)
	}
	stream, m, err := e.createStream(ctx, Throughput, shards)
	if err != nil {
		return nil, err
	}
	pubs := make([]*client.Publisher, e.cfg.publishers)
	for p := range pubs {
		owner, _, err := e.owner(m, stream, p%shards)
		if err != nil {
			return nil, err
		}
		c, err := e.client(ctx, owner)
		if err != nil {
			return nil, err
		}
		if pubs[p], err = c.Publisher(ctx, stream); err != nil {
			return nil, fmt.Errorf("bench: throughput: publisher %d: %w", p, err)
		}
		defer pubs[p].Close()
	}
	value := make([]byte, e.cfg.size) // never modified: shared by every record in flight

	var trials []trial
	for t := range e.cfg.trials {
		warm := e.cfg.throughputWarmup
		e.prog.timed(fmt.Sprintf("throughput %dx%d %d/%d", e.cfg.publishers, e.cfg.window, t+1, e.cfg.trials), warm+e.cfg.duration)
		start := time.Now()
		mStart, mEnd := start.Add(warm), start.Add(warm+e.cfg.duration)
		workers := make([]*tpWorker, len(pubs))
		var wg sync.WaitGroup
		for p, pub := range pubs {
			w := &tpWorker{pub: pub, shard: p % shards, value: value, window: e.cfg.window,
				mStart: mStart, mEnd: mEnd, hist: newHist(), acks: newAckGroups()}
			workers[p] = w
			wg.Go(func() { w.run(ctx) })
		}
		time.Sleep(time.Until(mStart))
		e.watch.begin()
		time.Sleep(time.Until(mEnd))
		usage := e.watch.end(time.Since(mStart).Seconds())
		wg.Wait()

		tr := trial{hist: newHist(), acks: newAckGroups(), elapsed: mEnd.Sub(mStart), usage: usage}
		for p, w := range workers {
			if w.err != nil {
				return nil, fmt.Errorf("bench: throughput: publisher %d (shard %d): %w", p, w.shard, w.err)
			}
			tr.hist.Merge(w.hist)
			tr.acks.merge(w.acks)
			tr.count += w.count
		}
		trials = append(trials, tr)
	}
	res := summarize(Throughput, ModePipelined, trials)
	res.Publishers, res.Window, res.Shards = e.cfg.publishers, e.cfg.window, shards
	res.Path = "publisher -> owner (each publisher on its shard's owner)"
	return res, nil
}

// tpWorker is one throughput publisher. Its goroutine keeps window records
// in flight until mEnd, then waits for the rest; it owns every field until
// run returns.
type tpWorker struct {
	pub          *client.Publisher
	shard        int
	value        []byte
	window       int
	mStart, mEnd time.Time

	hist  *hdrhistogram.Histogram // records sent within [mStart, mEnd)
	acks  *ackGroups              // the same records
	count int64                   // acks that arrived within [mStart, mEnd)
	err   error
}

type sentRecord struct {
	sent time.Time
	fut  *client.Future
}

func (w *tpWorker) run(ctx context.Context) {
	queue := make([]sentRecord, 0, w.window)
	head := 0
	opt := client.WithShard(w.shard)
	for {
		if len(queue)-head == 0 && head > 0 {
			queue, head = queue[:0], 0
		}
		for len(queue)-head < w.window && time.Now().Before(w.mEnd) {
			if head > 0 && len(queue) == cap(queue) { // compact before growing
				n := copy(queue, queue[head:])
				clear(queue[n:])
				queue, head = queue[:n], 0
			}
			sent := time.Now()
			fut, err := w.pub.PublishAsync(ctx, nil, w.value, opt)
			if err != nil {
				w.err = err
				return
			}
			queue = append(queue, sentRecord{sent: sent, fut: fut})
		}
		if len(queue)-head == 0 {
			return
		}
		r := queue[head]
		queue[head] = sentRecord{}
		head++
		select {
		case <-r.fut.Done():
		case <-ctx.Done():
			w.err = ctx.Err()
			return
		}
		done := time.Now()
		ack, err := r.fut.Wait(ctx)
		if err != nil {
			w.err = err
			return
		}
		if !r.sent.Before(w.mStart) && r.sent.Before(w.mEnd) {
			record(w.hist, done.Sub(r.sent))
			w.acks.add(ack)
		}
		if !done.Before(w.mStart) && done.Before(w.mEnd) {
			w.count++
		}
	}
}
