package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/internal/clustertest"
	"github.com/felix-broker/felix/internal/history"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// The kill loop's size: small enough for CI by default; a soak is
//
//	go test ./internal/e2e -run TestKillLoop -timeout 2h -args -felix.kill.cycles=200
var (
	killCycles     = flag.Int("felix.kill.cycles", 6, "kill -9 cycles in TestKillLoop")
	killPublishers = flag.Int("felix.kill.publishers", 6, "publishers in TestKillLoop (spread over the brokers)")
)

// TestKillLoop publishes through every broker from several publishers
// while a nemesis kills -9 a random broker and restarts it, cycle after
// cycle, with a subscriber attached throughout. Every publish's outcome is
// recorded, and the history is checked against the final logs: no
// acknowledged record lost, none duplicated, offsets dense, each
// publisher's records in order, acknowledgements linearizable
// (porcupine), and the subscriber saw every shard in offset order with
// neither a gap nor a duplicate.
func TestKillLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("the kill loop takes about a minute")
	}
	const shards = 3
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*killCycles)*20*time.Second+2*time.Minute)
	defer cancel()
	c := clustertest.Start(t, 3)
	admin := clustertest.Connect(t, c, "broker-0")
	createStream(t, ctx, admin, shardmap.StreamConfig{Name: "kl", Shards: shards})

	var rec history.Recorder
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range *killPublishers {
		via := c.Brokers()[i%len(c.Brokers())].ID
		opts := []client.Opt{client.WithReconnect(20*time.Millisecond, 500*time.Millisecond), client.WithDialTimeout(time.Second)}
		idempotent := i%2 == 1 // half the publishers retry unknown outcomes to exactly once
		if idempotent {
			opts = append(opts, client.WithIdempotence(), client.WithRetryTimeout(time.Minute))
		}
		cl := clustertest.Connect(t, c, via, opts...)
		wg.Go(func() { publishUntil(ctx, stop, cl, "kl", i, idempotent, &rec) })
	}
	sub := newTailChecker(t, ctx, c, "kl", shards)

	for cycle := range *killCycles {
		time.Sleep(time.Duration(400+rand.IntN(800)) * time.Millisecond)
		victim := c.Brokers()[rand.IntN(len(c.Brokers()))].ID
		if err := c.Kill(victim); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(200+rand.IntN(600)) * time.Millisecond)
		if err := c.Restart(ctx, victim); err != nil {
			t.Fatalf("cycle %d: restarting %s: %v", cycle, victim, err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()

	// One marker per shard, acknowledged last: reading up to it reads all.
	// (A new client: the first one's broker may have been killed.)
	admin = clustertest.Connect(t, c, "broker-0")
	ends := make([]uint64, shards)
	for s := range shards {
		v := fmt.Sprintf("end-%d", s)
		call := time.Now()
		ack, err := admin.Publish(ctx, "kl", nil, []byte(v), client.WithShard(s))
		if err != nil {
			t.Fatal(err)
		}
		rec.Add(history.Publish{Publisher: *killPublishers, Value: v, Outcome: history.Acked, Shard: s, Offset: ack.Offset, Call: call, Return: time.Now()})
		ends[s] = ack.Offset
	}
	logs := readShards(t, ctx, admin, "kl", ends)
	pubs := rec.Publishes()
	r := history.Check(pubs, logs, time.Minute)
	t.Logf("%d kill -9 cycles, %d publishers (%d idempotent) through 3 brokers: %s", *killCycles, *killPublishers, *killPublishers/2, r)
	for _, p := range pubs {
		if p.Publisher%2 == 1 && p.Publisher < *killPublishers && p.Outcome != history.Acked {
			t.Errorf("idempotent publisher %d: %s ended %v, want acked exactly once", p.Publisher, p.Value, p.Outcome)
		}
	}
	if !r.OK() {
		t.Errorf("history check failed: lost %v; duplicated %v; misplaced %v; phantom %v; gaps %v; reordered %v",
			r.Lost, r.Duplicated, r.Misplaced, r.Phantom, r.Gaps, r.Reordered)
	}
	if r.Acked < 100 {
		t.Errorf("only %d records acknowledged: the loop did not exercise the cluster", r.Acked)
	}
	sub.finish(t, ends)
}

// publishUntil publishes unique values one at a time, recording each
// outcome, until stop is closed. An idempotent publisher's client retries
// unknown outcomes itself, so it is given longer.
func publishUntil(ctx context.Context, stop <-chan struct{}, cl *client.Client, stream string, id int, idempotent bool, rec *history.Recorder) {
	timeout := 3 * time.Second
	if idempotent {
		timeout = time.Minute
	}
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		v := fmt.Sprintf("p%d-%d", id, n)
		pctx, cancel := context.WithTimeout(ctx, timeout)
		call := time.Now()
		ack, err := cl.Publish(pctx, stream, []byte(v), []byte(v))
		cancel()
		p := history.Publish{Publisher: id, Value: v, Call: call, Return: time.Now()}
		switch {
		case err == nil:
			p.Outcome, p.Shard, p.Offset, p.Retried = history.Acked, ack.Shard, ack.Offset, ack.Duplicate
		case definitelyNotWritten(err):
			p.Outcome = history.Failed
		default:
			p.Outcome = history.Unknown
			time.Sleep(20 * time.Millisecond) // the broker may be down: do not spin
		}
		rec.Add(p)
		if ctx.Err() != nil {
			return
		}
	}
}

// definitelyNotWritten reports whether err guarantees the record was not
// written: a refusal before anything was routed.
func definitelyNotWritten(err error) bool {
	for _, target := range []error{transport.ErrUnauthorized, transport.ErrInvalid, transport.ErrPayloadTooLarge, transport.ErrUnknownStream} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// readShards reads every shard of stream from offset 0 up to ends[shard].
func readShards(t *testing.T, ctx context.Context, cl *client.Client, stream string, ends []uint64) [][]history.Entry {
	t.Helper()
	logs := make([][]history.Entry, len(ends))
	for s, end := range ends {
		sub, err := cl.Subscribe(ctx, stream, client.Earliest(), client.Shard(s))
		if err != nil {
			t.Fatal(err)
		}
		for rec, err := range sub.Records(ctx) {
			if err != nil {
				t.Fatalf("reading shard %d: %v", s, err)
			}
			logs[s] = append(logs[s], history.Entry{Offset: rec.Offset, Value: string(rec.Value)})
			if rec.Offset >= end {
				break
			}
		}
		sub.Stop()
	}
	return logs
}

// tailChecker is a subscriber attached to every shard for the whole loop;
// it checks that each shard arrives in offset order with no gap and no
// duplicate, across the kills.
type tailChecker struct {
	sub  *client.Subscription
	done chan struct{}

	mu   sync.Mutex
	next []uint64 // per shard: the offset expected next
	errs []string
	seen int
}

func newTailChecker(t *testing.T, ctx context.Context, c *cluster.Cluster, stream string, shards int) *tailChecker {
	t.Helper()
	cl := clustertest.Connect(t, c, "broker-1", client.WithReconnect(20*time.Millisecond, 500*time.Millisecond))
	sub, err := cl.Subscribe(ctx, stream, client.Earliest())
	if err != nil {
		t.Fatal(err)
	}
	tc := &tailChecker{sub: sub, done: make(chan struct{}), next: make([]uint64, shards)}
	go func() {
		defer close(tc.done)
		for rec, err := range sub.Records(ctx) {
			tc.mu.Lock()
			if err != nil {
				tc.errs = append(tc.errs, err.Error())
				tc.mu.Unlock()
				return
			}
			if want := tc.next[rec.Shard]; rec.Offset != want {
				tc.errs = append(tc.errs, fmt.Sprintf("shard %d: got offset %d, want %d", rec.Shard, rec.Offset, want))
			}
			tc.next[rec.Shard] = rec.Offset + 1
			tc.seen++
			tc.mu.Unlock()
		}
	}()
	return tc
}

// finish waits until the subscriber has reached ends on every shard, then
// stops it and reports what went wrong.
func (tc *tailChecker) finish(t *testing.T, ends []uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		tc.mu.Lock()
		caught := true
		for s, end := range ends {
			caught = caught && tc.next[s] > end
		}
		errs, seen, next := append([]string(nil), tc.errs...), tc.seen, append([]uint64(nil), tc.next...)
		tc.mu.Unlock()
		if caught || len(errs) > 0 || time.Now().After(deadline) {
			tc.sub.Stop()
			<-tc.done
			t.Logf("the subscriber attached throughout received %d records", seen)
			if len(errs) > 0 {
				t.Errorf("subscriber: %v", errs)
			} else if !caught {
				t.Errorf("subscriber stuck at %v, want past %v", next, ends)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
