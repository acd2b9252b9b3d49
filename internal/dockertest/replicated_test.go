package dockertest

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	hist "github.com/felix-broker/felix/internal/history"
	"github.com/felix-broker/felix/internal/workload"
	"github.com/felix-broker/felix/transport"
)

// replicatedFailover bounds how long a replicated shard may go without
// a leader taking publishes after a fault: raft's election timeout (1 to
// 2s with the broker's defaults), an election, and the probes' retries
// on a loaded machine.
const replicatedFailover = 20 * time.Second

// workloadRun is the clients of a test on a replicated stream: through
// every broker a plain publisher (one record at a time, every outcome
// recorded) and a subscriber from the earliest offset of every shard; an
// idempotent publisher through the first broker (it retries records of
// unknown outcome: each must end acked, exactly once); and a prober that
// finds a shard's raft leader by publishing to it (the ack's Owner is the
// leader that committed it); and a tail of each shard at each broker's own
// replica (workload.ReplicaTail: a subscriber through the SDK reads the
// leader only). Its publishes are all in one history.
type workloadRun struct {
	c      *Cluster
	stream string
	shards int

	rec     hist.Recorder
	clients []*client.Client // one per broker, for its publisher
	// probers, one per broker, publish the probes through it: they never
	// move their home to another broker (a client's home failover would
	// send a probe "through" broker i to another after an earlier fault
	// kept i down for a while).
	probers []*client.Client
	idem    *client.Client // the idempotent publisher's
	subs    []*workload.Subscriber
	// tails read every shard at every broker's own replica, follower or
	// leader (the subscribers read the leaders only): tails[i*shards+s]
	// is broker i's replica of shard s.
	tails   []*workload.ReplicaTail
	stop    chan struct{}
	wg      sync.WaitGroup
	stopped bool
	closed  bool
	probeID int // the prober's publisher id
	idemID  int // the idempotent publisher's id
	pipeID  int // the pipelined publisher's id
	probes  int
}

// startWorkload creates stream (replication factor 3, shards shards) and
// starts the publishers and subscribers; a cleanup stops them if the
// test ends first.
func (c *Cluster) startWorkload(ctx context.Context, t *testing.T, stream string, shards int) *workloadRun {
	t.Helper()
	admin := c.adminClient(ctx, t)
	if err := createRetrying(ctx, admin, client.StreamConfig{Name: stream, Shards: shards, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	c.waitStream(ctx, t, stream)
	r := &workloadRun{c: c, stream: stream, shards: shards, stop: make(chan struct{}), probeID: len(c.Brokers), idemID: len(c.Brokers) + 2, pipeID: len(c.Brokers) + 3}
	t.Cleanup(r.close)
	for i, b := range c.Brokers {
		cl, err := c.Client(ctx, b, client.WithReconnect(20*time.Millisecond, 500*time.Millisecond), client.WithDialTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		r.clients = append(r.clients, cl)
		pr, err := c.Client(ctx, b, client.WithReconnect(20*time.Millisecond, 500*time.Millisecond), client.WithDialTimeout(time.Second), client.WithHomeFailover(-1))
		if err != nil {
			t.Fatal(err)
		}
		r.probers = append(r.probers, pr)
		sub, err := workload.Subscribe(ctx, cl, "subscriber via "+b.Name, stream, shards)
		if err != nil {
			t.Fatal(err)
		}
		r.subs = append(r.subs, sub)
		r.wg.Go(func() { workload.Publish(ctx, r.stop, cl, stream, i, false, &r.rec) })
		for s := range shards {
			r.tails = append(r.tails, workload.TailReplica(ctx, fmt.Sprintf("%s's replica of %s/%d", b.Name, stream, s), b.Addr, c.brokerTLS(b), stream, s))
		}
	}
	idem, err := c.Client(ctx, c.Brokers[0], client.WithIdempotence(), client.WithRetryTimeout(time.Minute),
		client.WithReconnect(20*time.Millisecond, 500*time.Millisecond), client.WithDialTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r.idem = idem
	r.wg.Go(func() { workload.Publish(ctx, r.stop, idem, stream, r.idemID, true, &r.rec) })
	// Pipelined through broker 1, which forwards most of its records: the
	// history checks that each shard's acked ones keep the order sent
	// across re-routes and failovers.
	pipe := r.clients[1%len(r.clients)]
	r.wg.Go(func() { workload.PublishPipelined(ctx, r.stop, pipe, stream, r.pipeID, 8, &r.rec) })
	return r
}

// stopPublishers stops the publishers; the subscribers go on.
func (r *workloadRun) stopPublishers() {
	if r.stopped {
		return
	}
	r.stopped = true
	close(r.stop)
	r.wg.Wait()
}

// close stops the publishers and closes the clients (the subscribers end
// with them).
func (r *workloadRun) close() {
	r.stopPublishers()
	if r.closed {
		return
	}
	r.closed = true
	for _, tl := range r.tails {
		tl.Finish(0, 0)
	}
	for _, cl := range append(r.clients, r.probers...) {
		cl.Close()
	}
	if r.idem != nil {
		r.idem.Close()
	}
}

// leader publishes to shard through every broker but not in turn, until
// one is acknowledged by a leader other than not, and returns that
// leader, or an error after replicatedFailover. The probes are part of
// the history.
func (r *workloadRun) leader(ctx context.Context, shard int, not string) (string, error) {
	deadline := time.Now().Add(replicatedFailover)
	var last error
	for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
		b := i % len(r.c.Brokers)
		if r.c.Brokers[b].Name == not {
			continue
		}
		ack, err := r.probe(ctx, b, shard)
		if err == nil && ack.Owner != not {
			return ack.Owner, nil
		}
		if err != nil {
			last = err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "", fmt.Errorf("no leader of %s/%d other than %q acked within %v (last: %v)", r.stream, shard, not, replicatedFailover, last)
}

// probe publishes a probe record to shard through broker i's client.
func (r *workloadRun) probe(ctx context.Context, i, shard int) (client.Ack, error) {
	r.probes++
	return workload.Record(ctx, r.probers[i], &r.rec, r.probeID, r.stream, shard, fmt.Sprintf("probe-%d", r.probes), 3*time.Second)
}

// firstAckAfter returns how long after at the first publish to shard
// was acknowledged by a leader other than old, in the history so far.
func (r *workloadRun) firstAckAfter(at time.Time, shard int, old string) (time.Duration, bool) {
	var first time.Time
	for _, p := range r.rec.Publishes() {
		if p.Outcome == hist.Acked && p.Shard == shard && p.Owner != old && p.Return.After(at) && (first.IsZero() || p.Return.Before(first)) {
			first = p.Return
		}
	}
	return first.Sub(at), !first.IsZero()
}

// brokerTLS is a client's TLS configuration for a connection to broker b
// alone.
func (c *Cluster) brokerTLS(b *Node) *tls.Config {
	return transport.VerifyPeer(transport.ClientTLS(c.ca, &c.admin, b.IP), transport.RoleNode, b.Name)
}

// finish stops the load once the cluster is healthy again, then reads
// every shard back to its end and checks the history (package history,
// porcupine included), the subscribers and the replica tails but those of
// skip (offset order, no gap, committed records only) and every replica
// but those of skip, read from its own broker
// (the same records at the same offsets). It returns the report and the
// shards as read.
func (r *workloadRun) finish(ctx context.Context, t *testing.T, skip ...*Node) (hist.Report, [][]hist.Entry) {
	t.Helper()
	if err := r.c.WaitHealthy(ctx); err != nil {
		t.Fatalf("the cluster did not heal: %v", err)
	}
	r.stopPublishers()
	// No record of unknown outcome still in flight, then a marker per
	// shard, and a read of every shard to its end: the marker or the
	// replicas' high-water mark, whichever is further (a record committed
	// past the marker, late or a second time, is checked too).
	workload.Settle(ctx, r.rec.Publishes())
	fresh := r.c.adminClient(ctx, t)
	marks := make([]uint64, r.shards)
	for s := range r.shards {
		ack, err := workload.Record(ctx, fresh, &r.rec, r.probeID+1, r.stream, s, fmt.Sprintf("end-%d", s), replicatedFailover)
		if err != nil {
			t.Fatalf("publishing the end of %s/%d: %v", r.stream, s, err)
		}
		marks[s] = ack.Offset
	}
	ends, err := workload.ShardEnds(ctx, fresh, r.stream, marks, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	logs, err := workload.ReadShards(ctx, fresh, r.stream, ends)
	if err != nil {
		t.Fatal(err)
	}
	rep := hist.Check(r.rec.Publishes(), logs, time.Minute)
	idem, piped := 0, 0
	for _, p := range r.rec.Publishes() {
		if p.Publisher == r.pipeID && p.Outcome == hist.Acked {
			piped++
		}
		if p.Publisher == r.idemID {
			idem++
			if p.Outcome != hist.Acked {
				t.Errorf("idempotent publisher: %s ended %v, want acked exactly once", p.Value, p.Outcome)
			}
		}
	}
	if idem == 0 {
		t.Errorf("the idempotent publisher published nothing")
	}
	if piped == 0 {
		t.Errorf("the pipelined publisher had nothing acknowledged")
	}
	if !rep.OK() {
		t.Errorf("history check failed: %s\nlost %v\nduplicated %v\nmisplaced %v\nphantom %v\ngaps %v\nreordered %v",
			rep, rep.Lost, rep.Duplicated, rep.Misplaced, rep.Phantom, rep.Gaps, rep.Reordered)
	}
	received := 0
	for i, sub := range r.subs {
		seen, errs := sub.Finish(ends, 30*time.Second)
		received += seen
		errs = append(errs, sub.Committed(logs)...)
		if len(errs) > 0 {
			t.Errorf("subscriber via %s: %v", r.c.Brokers[i].Name, errs)
		}
	}
	t.Logf("%d subscribers (one through each broker) received %d records", len(r.subs), received)
	received = 0
	for i, tl := range r.tails {
		b := r.c.Brokers[i/r.shards]
		if slices.Contains(skip, b) {
			tl.Finish(0, 0)
			continue
		}
		seen, errs := tl.Finish(ends[i%r.shards], 30*time.Second)
		received += seen
		if errs = append(errs, tl.Committed(logs)...); len(errs) > 0 {
			t.Errorf("replica tail: %v", errs)
		}
	}
	t.Logf("%d tails of every broker's own replicas received %d records", len(r.tails), received)
	for _, b := range r.c.Brokers {
		if slices.Contains(skip, b) {
			continue
		}
		for s := range r.shards {
			got, err := workload.ReadReplica(ctx, b.Addr, r.c.brokerTLS(b), r.stream, s, ends[s], 30*time.Second)
			if err != nil {
				t.Errorf("reading %s's replica of %s/%d: %v", b.Name, r.stream, s, err)
			}
			if !slices.Equal(got, logs[s]) {
				t.Errorf("%s's replica of %s/%d differs from the shard read through the SDK: %d records vs %d; %v",
					b.Name, r.stream, s, len(got), len(logs[s]), workload.Compare(b.Name, perShard(r.shards, s, got), logs))
			}
		}
	}
	return rep, logs
}
