package e2e

import (
	"context"
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
	"github.com/felix-broker/felix/internal/workload"
	"github.com/felix-broker/felix/shardmap"
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
		wg.Go(func() { workload.Publish(ctx, stop, cl, "kl", i, idempotent, &rec) })
	}
	sub := tail(t, ctx, c, "kl", shards)

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
	ends, logs := readBack(t, ctx, admin, "kl", shards, *killPublishers, &rec)
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
	finishTail(t, sub, ends, logs)
}

// readBack publishes one marker per shard of stream through cl, last, as
// publisher id of rec (its values name id, so that a test that reads back
// more than once gives each read its own id), and reads every shard up
// to it: all of it. It returns the markers' offsets and the shards.
func readBack(t *testing.T, ctx context.Context, cl *client.Client, stream string, shards, id int, rec *history.Recorder) ([]uint64, [][]history.Entry) {
	t.Helper()
	ends := mark(t, ctx, cl, stream, shards, id, rec)
	logs, err := workload.ReadShards(ctx, cl, stream, ends)
	if err != nil {
		t.Fatal(err)
	}
	return ends, logs
}

// mark publishes readBack's marker on each shard and returns their
// offsets.
func mark(t *testing.T, ctx context.Context, cl *client.Client, stream string, shards, id int, rec *history.Recorder) []uint64 {
	t.Helper()
	marks := make([]uint64, shards)
	for s := range shards {
		ack, err := workload.Record(ctx, cl, rec, id, stream, s, fmt.Sprintf("end-%d-%d", id, s), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		marks[s] = ack.Offset
	}
	return marks
}

// tail attaches a subscriber through broker-1 to every shard of stream for
// the whole test (workload.Subscriber: offset order, no gap, no
// duplicate, across the kills).
func tail(t *testing.T, ctx context.Context, c *cluster.Cluster, stream string, shards int) *workload.Subscriber {
	t.Helper()
	cl := clustertest.Connect(t, c, "broker-1", client.WithReconnect(20*time.Millisecond, 500*time.Millisecond))
	sub, err := workload.Subscribe(ctx, cl, "the subscriber attached throughout", stream, shards)
	if err != nil {
		t.Fatal(err)
	}
	return sub
}

// finishTail waits until sub has reached ends on every shard, then stops
// it and reports what went wrong: a gap, a duplicate, a stall, or a
// record that is not the one logs hold at its offset (one a subscriber
// was sent and no log committed).
func finishTail(t *testing.T, sub *workload.Subscriber, ends []uint64, logs [][]history.Entry) {
	t.Helper()
	seen, errs := sub.Finish(ends, 30*time.Second)
	t.Logf("the subscriber attached throughout received %d records", seen)
	if errs = append(errs, sub.Committed(logs)...); len(errs) > 0 {
		t.Errorf("subscriber: %v", errs)
	}
}

// readBackToEnd reads back a replicated stream once its publishers have
// stopped: it waits until no record of unknown outcome can still be in
// flight (workload.Settle), publishes readBack's markers, and reads every
// shard to its end, the marker or the replicas' high-water mark,
// whichever is further (workload.ShardEnds): a record committed past the
// marker (written late, or a second time) is checked too.
func readBackToEnd(t *testing.T, ctx context.Context, cl *client.Client, stream string, shards, id int, rec *history.Recorder) ([]uint64, [][]history.Entry) {
	t.Helper()
	workload.Settle(ctx, rec.Publishes())
	ends, err := workload.ShardEnds(ctx, cl, stream, mark(t, ctx, cl, stream, shards, id, rec), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	logs, err := workload.ReadShards(ctx, cl, stream, ends)
	if err != nil {
		t.Fatal(err)
	}
	return ends, logs
}

// tailReplicas attaches a workload.ReplicaTail to every shard of stream
// at every broker, follower or leader, for the whole test: an SDK
// subscription reads the shard's leader only.
func tailReplicas(t *testing.T, ctx context.Context, c *cluster.Cluster, stream string, shards int) []*workload.ReplicaTail {
	t.Helper()
	var tails []*workload.ReplicaTail
	for _, b := range c.Brokers() {
		tlsConf := brokerTLS(t, c, b)
		for s := range shards {
			tails = append(tails, workload.TailReplica(ctx, fmt.Sprintf("%s's replica of %s/%d", b.ID, stream, s), b.Addr, tlsConf, stream, s))
		}
	}
	t.Cleanup(func() {
		for _, tl := range tails {
			tl.Finish(0, 0)
		}
	})
	return tails
}

// finishReplicaTails waits until every tail (shard s = i % shards) has
// reached ends, stops them and reports what went wrong: a gap, a
// duplicate, a stall, or a record a replica served that no log holds at
// its offset (an uncommitted one).
func finishReplicaTails(t *testing.T, tails []*workload.ReplicaTail, shards int, ends []uint64, logs [][]history.Entry) {
	t.Helper()
	seen := 0
	for i, tl := range tails {
		n, errs := tl.Finish(ends[i%shards], 30*time.Second)
		seen += n
		if errs = append(errs, tl.Committed(logs)...); len(errs) > 0 {
			t.Errorf("replica tail: %v", errs)
		}
	}
	t.Logf("%d tails of every broker's own replicas received %d records", len(tails), seen)
}
