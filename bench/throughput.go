package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/stats"
)

// pubSet is the throughput scenario's publishers: n Publishers on one
// stream of shards shards, publisher p writing shard p mod shards through
// that shard's owner.
type pubSet struct {
	stream string
	shards int
	pubs   []*client.Publisher
	value  []byte // never modified: shared by every record in flight

	// owned is how many shards each broker owns by the map the stream
	// was created in (for replicated shards, is first in the replica
	// set: the leader the bench waits for).
	owned map[string]int
}

// shardOf returns the shard publisher p writes.
func (ps *pubSet) shardOf(p int) int { return p % ps.shards }

func (ps *pubSet) close() {
	for _, p := range ps.pubs {
		p.Close()
	}
}

// throughputPublishers creates the stream bench-<runID>-<name> of shards
// shards and cfg.publishers Publishers on it.
func (e *env) throughputPublishers(ctx context.Context, name string, shards int) (*pubSet, error) {
	stream, m, err := e.createStream(ctx, name, shards)
	if err != nil {
		return nil, err
	}
	ps := &pubSet{stream: stream, shards: shards, value: make([]byte, e.cfg.size), owned: map[string]int{}}
	if e.cfg.replicas > 1 {
		// Let every shard's leadership settle on its owner first, so
		// that no hand-over stalls a measured trial.
		for s := range shards {
			if _, _, err := e.leader(ctx, m, stream, s); err != nil {
				return nil, err
			}
		}
	}
	for s := range shards {
		owner, _, err := e.owner(m, stream, s)
		if err != nil {
			return nil, err
		}
		ps.owned[owner]++
	}
	ps.pubs = make([]*client.Publisher, e.cfg.publishers)
	for p := range ps.pubs {
		owner, _, err := e.owner(m, stream, ps.shardOf(p))
		if err != nil {
			ps.close()
			return nil, err
		}
		c, err := e.client(ctx, owner)
		if err != nil {
			ps.close()
			return nil, err
		}
		if ps.pubs[p], err = c.Publisher(ctx, stream); err != nil {
			ps.close()
			return nil, fmt.Errorf("bench: %s: publisher %d: %w", name, p, err)
		}
	}
	return ps, nil
}

// memorySettle is how long the brokers get to act on a new stream (or on
// the first record of each shard) before their RSS is read.
const memorySettle = 500 * time.Millisecond

// shardMem is what a stream's shards cost the brokers in memory, per
// shard (see Result.IdleShardKiB).
type shardMem struct{ idle, open *float64 }

// memKey names a probe stream of measureShardMemory.
type memKey struct{ replicas, shards int }

// measureShardMemory measures, on a local cluster, what a stream of each
// shard count and replication factor of keys costs the brokers per shard,
// before any throughput load: on probe streams created one after another
// and deleted only once every one is measured. Measured after a load (or
// after deleting a stream) new shards land in heap the brokers already
// hold, and the RSS growth came out near zero or negative. It returns nil
// when the brokers' RSS cannot be read (not --local). It sets
// e.cfg.replicas to each probe's factor (createStream and deleteStream
// read it there) and puts it back before returning.
func (e *env) measureShardMemory(ctx context.Context, keys []memKey) (_ map[memKey]shardMem, err error) {
	before, ok := e.settledRSS(ctx)
	if !ok {
		return nil, nil
	}
	replicas := e.cfg.replicas
	var probes []memKey
	defer func() {
		for _, k := range probes {
			e.cfg.replicas = k.replicas
			if derr := e.deleteStream(ctx, k.probe()); err == nil {
				err = derr
			}
		}
		e.cfg.replicas = replicas
	}()
	out := make(map[memKey]shardMem, len(keys))
	for _, k := range keys {
		if _, done := out[k]; done {
			continue
		}
		e.cfg.replicas = k.replicas
		e.prog.phase(fmt.Sprintf("memory per shard: %d shards, replication factor %d", k.shards, k.replicas), 0)
		stream, _, err := e.createStream(ctx, k.probe(), k.shards)
		if err != nil {
			return nil, err
		}
		probes = append(probes, k)
		var m shardMem
		if m, before, err = e.shardMemory(ctx, stream, k.shards, before); err != nil {
			return nil, err
		}
		out[k] = m
	}
	return out, nil
}

// probe is the scenario name of k's probe stream.
func (k memKey) probe() string { return fmt.Sprintf("memory-%d-%d", k.shards, k.replicas) }

// shardMemory measures the brokers' RSS growth per shard of stream, of
// shards shards, from before (KiB): after its creation (idle shards),
// then after one record to each shard. It returns the last reading.
func (e *env) shardMemory(ctx context.Context, stream string, shards int, before uint64) (m shardMem, last uint64, err error) {
	perShard := func(after uint64) *float64 {
		grown := float64(after) - float64(before) // may be negative: the Go heap moves
		return ptr(round1(grown / float64(shards)))
	}
	if err := sleepCtx(ctx, memorySettle); err != nil {
		return m, 0, err
	}
	after, ok := e.settledRSS(ctx)
	if !ok {
		return m, 0, errors.New("bench: the brokers' RSS is gone")
	}
	m.idle = perShard(after)
	c, err := e.anyClient(ctx)
	if err != nil {
		return m, 0, err
	}
	pub, err := c.Publisher(ctx, stream)
	if err != nil {
		return m, 0, fmt.Errorf("bench: %s: %w", stream, err)
	}
	defer pub.Close()
	value := make([]byte, e.cfg.size)
	futs := make([]*client.Future, 0, shards)
	for s := range shards {
		f, err := pub.PublishAsync(ctx, nil, value, client.WithShard(s))
		if err != nil {
			return m, 0, fmt.Errorf("bench: %s: one record to shard %d: %w", stream, s, err)
		}
		futs = append(futs, f)
	}
	for s, f := range futs {
		if _, err := f.Wait(ctx); err != nil {
			return m, 0, fmt.Errorf("bench: %s: one record to shard %d: %w", stream, s, err)
		}
	}
	if err := sleepCtx(ctx, memorySettle); err != nil {
		return m, 0, err
	}
	if after, ok = e.settledRSS(ctx); !ok {
		return m, 0, errors.New("bench: the brokers' RSS is gone")
	}
	m.open = perShard(after)
	return m, after, nil
}

// rssQuiet is how little the brokers' RSS (summed, KiB) may move between
// two readings rssStep apart for settledRSS to take it as settled, and
// rssPatience how long it waits for that at most.
const (
	rssQuiet    = 256
	rssStep     = 200 * time.Millisecond
	rssPatience = 5 * time.Second
)

// settledRSS is brokersRSS once it holds still: after a scenario the Go
// heap of each broker goes on shrinking (its scavenger hands freed pages
// back over seconds) or growing (a collection still due), and a reading
// taken meanwhile made the memory per shard of the next stream come out
// negative, or megabytes for a handful of shards. It reads every rssStep
// until two readings are within rssQuiet KiB, or rssPatience has passed,
// and returns the last.
func (e *env) settledRSS(ctx context.Context) (uint64, bool) {
	last, ok := e.brokersRSS()
	if !ok {
		return 0, false
	}
	for end := time.Now().Add(rssPatience); time.Now().Before(end); {
		if sleepCtx(ctx, rssStep) != nil {
			break
		}
		now, ok := e.brokersRSS()
		if !ok {
			return 0, false
		}
		quiet := max(now, last)-min(now, last) <= rssQuiet
		last = now
		if quiet {
			break
		}
	}
	return last, true
}

// sleepCtx sleeps for d, or until ctx is done (its error).
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// brokersRSS returns the RSS of the watched brokers together, in KiB;
// false when there are none (a cluster that is not ours).
func (e *env) brokersRSS() (uint64, bool) {
	if e.watch == nil {
		return 0, false
	}
	var sum uint64
	n := 0
	for i, pid := range e.watch.pids {
		if e.watch.names[i] == selfName {
			continue
		}
		s, err := readProc(pid)
		if err != nil {
			return 0, false
		}
		sum += s.rssKiB
		n++
	}
	return sum, n > 0
}

// walHists are the brokers' WAL histograms, each merged over every
// broker: batches is felix_wal_batch_records (its Sum records written,
// its Count fsyncs), fsyncs felix_wal_fsync_duration_seconds.
type walHists struct {
	batches, fsyncs stats.Histogram
}

// add adds o's counts and sums to w's (buckets are not kept: the bench
// reads means).
func (w *walHists) add(o walHists) {
	w.batches.Count += o.batches.Count
	w.batches.Sum += o.batches.Sum
	w.fsyncs.Count += o.fsyncs.Count
	w.fsyncs.Sum += o.fsyncs.Sum
}

// sub returns the observations between an earlier scrape and w.
func (w walHists) sub(prev walHists) walHists {
	return walHists{batches: w.batches.Sub(prev.batches), fsyncs: w.fsyncs.Sub(prev.fsyncs)}
}

// walStats scrapes the brokers' WAL histograms. ok is false when any live
// broker's /metrics cannot be read.
func (e *env) walStats(ctx context.Context) (walHists, bool) {
	c, err := e.anyClient(ctx)
	if err != nil {
		return walHists{}, false
	}
	m, err := c.Map(ctx)
	if err != nil {
		return walHists{}, false
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var out walHists
	for _, s := range stats.ScrapeAll(sctx, &http.Client{}, m) {
		if !s.Live {
			continue
		}
		if s.Err != nil {
			return walHists{}, false
		}
		out.add(walHists{batches: s.Fams.Histogram(stats.MetricBatchRecords), fsyncs: s.Fams.Histogram(stats.MetricFsyncDuration)})
	}
	return out, true
}

// runThroughput is the throughput scenario over ps: each publisher keeps
// cfg.window records in flight. Each trial runs a warm-up, then counts the
// acks that arrive within cfg.duration; the brokers' CPU and memory and
// their WAL batches are sampled over the same interval.
func (e *env) runThroughput(ctx context.Context, ps *pubSet) (*Result, error) {
	var trials []trial
	for t := range e.cfg.trials {
		tr, err := e.throughputTrial(ctx, ps, fmt.Sprintf("%d/%d", t+1, e.cfg.trials))
		if err != nil {
			return nil, err
		}
		trials = append(trials, tr)
	}
	return e.throughputResult(ps, trials), nil
}

// throughputResult summarizes the trials of runThroughput.
func (e *env) throughputResult(ps *pubSet, trials []trial) *Result {
	res := summarize(Throughput, ModePipelined, trials)
	res.Publishers, res.Window, res.Shards = len(ps.pubs), e.cfg.window, ps.shards
	res.ShardsPerBroker = ps.owned
	res.Path = "publisher -> owner (each publisher on its shard's owner)"
	var wal walHists
	walOK := true
	for _, t := range trials {
		walOK = walOK && t.wal != nil
		if t.wal != nil {
			wal.add(*t.wal)
		}
	}
	if walOK && wal.batches.Count > 0 {
		res.WALRecordsPerFsync = ptr(float64(int64(wal.batches.Mean()*100+0.5)) / 100)
	}
	if walOK && wal.fsyncs.Count > 0 {
		res.WALFsyncMeanUS = ptr(float64(int64(wal.fsyncs.Mean()*1e7+0.5)) / 10)
	}
	return res
}

// throughputTrial runs one trial of the throughput scenario over ps.
func (e *env) throughputTrial(ctx context.Context, ps *pubSet, label string) (trial, error) {
	warm := e.cfg.throughputWarmup
	e.prog.timed(fmt.Sprintf("throughput %dx%d, %d shards %s", len(ps.pubs), e.cfg.window, ps.shards, label), warm+e.cfg.duration)
	start := time.Now()
	mStart, mEnd := start.Add(warm), start.Add(warm+e.cfg.duration)
	workers := make([]*tpWorker, len(ps.pubs))
	var wg sync.WaitGroup
	for p, pub := range ps.pubs {
		w := &tpWorker{pub: pub, shard: ps.shardOf(p), value: ps.value, window: e.cfg.window,
			mStart: mStart, mEnd: mEnd, hist: newHist(), acks: newAckGroups()}
		workers[p] = w
		wg.Go(func() { w.run(ctx) })
	}
	time.Sleep(time.Until(mStart))
	e.watch.begin()
	quic := e.quicTotals()
	walBefore, ok1 := e.walStats(ctx)
	time.Sleep(time.Until(mEnd))
	walAfter, ok2 := e.walStats(ctx)
	usage := e.watch.end(time.Since(mStart).Seconds())
	wg.Wait()

	tr := trial{hist: newHist(), acks: newAckGroups(), elapsed: mEnd.Sub(mStart), usage: usage, quic: e.quicSince(quic)}
	if ok1 && ok2 {
		d := walAfter.sub(walBefore)
		tr.wal = &d
	}
	for p, w := range workers {
		if w.err != nil {
			return trial{}, fmt.Errorf("bench: throughput: publisher %d (shard %d): %w", p, w.shard, w.err)
		}
		tr.hist.Merge(w.hist)
		tr.acks.merge(w.acks)
		tr.count += w.count
	}
	return tr, nil
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
		for len(queue)-head < w.window {
			sent := time.Now() // one clock read per record here, one at its ack
			if !sent.Before(w.mEnd) {
				break
			}
			if head > 0 && len(queue) == cap(queue) { // compact before growing
				n := copy(queue, queue[head:])
				clear(queue[n:])
				queue, head = queue[:n], 0
			}
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
