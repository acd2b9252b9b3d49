package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/felix-broker/felix/client"
)

// runLoad is latency under load, the way OpenMessaging Benchmark users
// read it: open loop over the throughput scenario's publishers (ps) at pct
// percent of maxRate, the acked records/s the throughput scenario measured
// just before in the same run. One generator goroutine sends record i
// through publisher i mod publishers, sleeping until each record is due
// (see pacer: it never spins), so the brokers keep the CPU; the latency
// runs from each record's intended send time, or from the generator's
// wake-up where its own timer overshot, and any wait the client or the
// brokers impose on the send (a full window, a blocked write) is charged.
// Each row also reports the CPU the brokers, the bench and the whole
// machine used.
func (e *env) runLoad(ctx context.Context, ps *pubSet, maxRate, pct float64) (*Result, error) {
	rate := max(1, int(maxRate*pct/100))
	n := max(1, int(float64(rate)*e.cfg.loadDuration.Seconds()))
	warmup := max(1, rate/4) // a quarter of a second
	sends := make([]sendFunc, len(ps.pubs))
	for p, pub := range ps.pubs {
		opt := client.WithShard(ps.shardOf(p))
		sends[p] = func(ctx context.Context, then func(client.Ack, error)) error {
			_, err := pub.PublishAsync(ctx, nil, ps.value, opt, client.OnResolved(then))
			return err
		}
	}
	var trials []trial
	for t := range e.cfg.trials {
		e.prog.phase(fmt.Sprintf("load %g%% %d/s %d/%d", pct, rate, t+1, e.cfg.trials), warmup+n)
		e.watch.begin()
		quic := e.quicTotals()
		start := time.Now()
		rec, acks, err := openLoop(ctx, rate, warmup, n, sends, e.prog)
		if err != nil {
			return nil, fmt.Errorf("bench: load %g%%: %w", pct, err)
		}
		tr := rec.trial(acks, e.sameClock())
		// What the processes and the machine used, warm-up included (it
		// runs at the same rate): whether the CPUs, not the disk, set
		// the row's latency.
		tr.usage = e.watch.end(time.Since(start).Seconds())
		tr.quic = e.quicSince(quic)
		trials = append(trials, tr)
	}
	res := summarize(Load, ModeOpen, trials)
	res.LoadPct, res.RatePerSec = pct, rate
	res.Publishers, res.Shards = len(ps.pubs), ps.shards
	res.Path = fmt.Sprintf("one generator, %d publishers -> owners, at %g%% of the throughput row's %.0f/s", len(ps.pubs), pct, maxRate)
	return res, nil
}
