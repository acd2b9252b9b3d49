package e2e

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/internal/clustertest"
	"github.com/felix-broker/felix/internal/history"
	"github.com/felix-broker/felix/internal/workload"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// The size of TestReplicatedFailover; a longer run is
//
//	go test ./internal/e2e -run TestReplicatedFailover -timeout 1h -args -felix.repl.kills=20
var replKills = flag.Int("felix.repl.kills", 3, "leader kills in TestReplicatedFailover")

// failoverBound is how long a replicated shard may be without a leader
// after its leader is killed: raft's election timeout (1 to 2 s with the
// broker's defaults: 10 ticks of 100 ms, randomized up to twice that),
// an election round, and the probes' own retries on a loaded machine.
const failoverBound = 15 * time.Second

// TestReplicatedFailover runs a stream of replication factor 3 on three
// real broker processes: publishers through every broker while the
// leader of shard 0 is killed -9 and restarted, cycle after cycle (one
// publisher idempotent: each of its records acked exactly once), and a
// subscriber attached throughout. It checks that a new leader takes
// publishes within failoverBound of each kill, the history (no acked
// record lost or duplicated, offsets dense, each publisher's order kept,
// acks linearizable: porcupine, every shard read to its end, past the
// end markers), that the subscriber saw every shard in offset order
// without a gap or a duplicate, and so did a subscriber to each shard at
// each broker's own replica, follower or leader (committed records only),
// and that every replica,
// the restarted ones included, holds the same records at the same
// offsets; and that a broker whose data directory was deleted (a machine
// lost) comes back serving, with no acked record lost.
func TestReplicatedFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("the replicated failover test takes about a minute")
	}
	const stream, shards, publishers = "r3", 2, 3
	// One publisher is idempotent: it retries records of unknown outcome
	// (a leader killed under them) across the failover, and must end with
	// each acked exactly once.
	const idempotentPublisher = 1
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*replKills)*30*time.Second+2*time.Minute)
	defer cancel()
	c := clustertest.Start(t, 3)
	admin := clustertest.Connect(t, c, "broker-0")
	createReplicated(t, ctx, c, admin, stream, shards)

	var rec history.Recorder
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range publishers {
		via := c.Brokers()[i%len(c.Brokers())].ID
		opts := []client.Opt{client.WithReconnect(20*time.Millisecond, 500*time.Millisecond), client.WithDialTimeout(time.Second)}
		if i == idempotentPublisher {
			opts = append(opts, client.WithIdempotence(), client.WithRetryTimeout(time.Minute))
		}
		cl := clustertest.Connect(t, c, via, opts...)
		wg.Go(func() { workload.Publish(ctx, stop, cl, stream, i, i == idempotentPublisher, &rec) })
	}
	// One more, pipelined (8 in flight) through broker-1: its acked
	// records of each shard must keep the order sent across the kills.
	pipe := clustertest.Connect(t, c, c.Brokers()[1].ID, client.WithReconnect(20*time.Millisecond, 500*time.Millisecond), client.WithDialTimeout(time.Second))
	const pipelined = publishers + 2 // publishers is the prober, +1 the read-back
	wg.Go(func() { workload.PublishPipelined(ctx, stop, pipe, stream, pipelined, 8, &rec) })
	sub := tail(t, ctx, c, stream, shards)
	replicas := tailReplicas(t, ctx, c, stream, shards)

	probes := &prober{t: t, c: c, stream: stream, rec: &rec, id: publishers}
	var failovers []time.Duration
	for cycle := range *replKills {
		time.Sleep(time.Second)
		leader := probes.leader(ctx, "")
		if leader == "" {
			t.Fatalf("cycle %d: no leader of %s/0 before the kill", cycle, stream)
		}
		if err := c.Kill(leader); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		next := probes.leader(ctx, leader)
		took := time.Since(killed)
		if next == "" {
			t.Fatalf("cycle %d: no new leader of %s/0 within %v of killing %s", cycle, stream, failoverBound, leader)
		}
		failovers = append(failovers, took)
		t.Logf("cycle %d: killed leader %s; %s acknowledged %s/0 publishes %v later", cycle, leader, next, stream, took.Round(time.Millisecond))
		time.Sleep(500 * time.Millisecond)
		if err := c.Restart(ctx, leader); err != nil {
			t.Fatalf("cycle %d: restarting %s: %v", cycle, leader, err)
		}
	}
	// A machine lost: a follower's data directory is deleted while the
	// shard keeps its majority. It comes back empty and serves (its
	// publishers' records go to the leaders); its replicas rejoin their
	// groups under new raft ids and catch up (broker/rejoin.go), and no
	// acked record is lost (checked below on every replica, its own
	// included).
	leader := probes.leader(ctx, "")
	var lost *cluster.Broker
	for _, b := range c.Brokers() {
		if b.ID != leader {
			lost = b
			break
		}
	}
	if err := c.Kill(lost.ID); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(lost.DataDir); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if err := c.Restart(ctx, lost.ID); err != nil {
		t.Fatalf("restarting %s with an empty data directory: %v", lost.ID, err)
	}
	t.Logf("deleted the data directory of %s (a follower; %s leads %s/0) and restarted it", lost.ID, leader, stream)

	time.Sleep(time.Second)
	close(stop)
	wg.Wait()

	fresh := clustertest.Connect(t, c, "broker-0", client.WithReconnect(20*time.Millisecond, 500*time.Millisecond))
	ends, logs := readBackToEnd(t, ctx, fresh, stream, shards, publishers+1, &rec)
	r := history.Check(rec.Publishes(), logs, time.Minute)
	sorted := slices.Clone(failovers)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	if len(sorted) > 0 {
		t.Logf("%d leader kills; time from kill -9 to the first ack by a new leader: median %v, max %v", len(sorted),
			sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond))
	}
	idem, piped := 0, 0
	for _, p := range rec.Publishes() {
		if p.Publisher == pipelined && p.Outcome == history.Acked {
			piped++
		}
		if p.Publisher == idempotentPublisher {
			idem++
			if p.Outcome != history.Acked {
				t.Errorf("idempotent publisher %d: %s ended %v, want acked exactly once", p.Publisher, p.Value, p.Outcome)
			}
		}
	}
	t.Logf("%d publishers (one idempotent, one pipelined with %d acked) through 3 brokers, R=3: %s", publishers+1, piped, r)
	if idem == 0 {
		t.Errorf("the idempotent publisher published nothing")
	}
	if piped == 0 {
		t.Errorf("the pipelined publisher had nothing acknowledged")
	}
	if !r.OK() {
		t.Errorf("history check failed: lost %v; duplicated %v; misplaced %v; phantom %v; gaps %v; reordered %v",
			r.Lost, r.Duplicated, r.Misplaced, r.Phantom, r.Gaps, r.Reordered)
	}
	if r.Acked < 50 {
		t.Errorf("only %d records acknowledged: the test did not exercise the cluster", r.Acked)
	}
	finishTail(t, sub, ends, logs)
	finishReplicaTails(t, replicas, shards, ends, logs)

	if !lost.Running() {
		t.Errorf("%s exited after its data directory was deleted: a lost replica must stop its group, not the broker", lost.ID)
	}
	// Every replica is a voter again, the lost broker's new ones included,
	// and has every record.
	deadline := time.Now().Add(failoverBound)
	for {
		states, err := fresh.ReplicaStatus(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		var behind []string
		for _, st := range states {
			if st.Err != "" || st.Member != "voter" || st.Next <= ends[st.Shard] {
				behind = append(behind, fmt.Sprintf("%+v", st))
			}
		}
		if len(states) == 3*shards && len(behind) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d replica states; not caught-up voters within %v: %v", len(states), failoverBound, behind)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Every replica, the restarted ones and the lost broker's new ones
	// included, holds the same records at the same offsets (read from
	// each broker's own replica).
	for _, b := range c.Brokers() {
		for s := range shards {
			got := readReplicaAt(t, ctx, c, b, stream, s, ends[s])
			if !slices.Equal(got, logs[s]) {
				t.Errorf("%s's replica of %s/%d differs from the shard read through the SDK: %d records vs %d", b.ID, stream, s, len(got), len(logs[s]))
			}
		}
	}
}

// prober finds the leader of shard 0 by publishing to it: an ack's Owner
// is the leader that committed it. Its publishes are part of the history.
type prober struct {
	t      *testing.T
	c      *cluster.Cluster
	stream string
	rec    *history.Recorder
	id     int // its publisher id in the history
	n      int
}

// leader publishes to shard 0 through a broker other than not (tried in
// turn) until one is acknowledged by a leader other than not, within
// failoverBound, and returns that leader ("" if none).
func (p *prober) leader(ctx context.Context, not string) string {
	deadline := time.Now().Add(failoverBound)
	for i := 0; time.Now().Before(deadline); i++ {
		b := p.c.Brokers()[i%len(p.c.Brokers())]
		if b.ID == not || !b.Running() {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		cl, err := client.Connect(cctx, b.Addr, client.WithCAFile(p.c.CAFile()), client.WithClientCertFile(p.c.AdminCert()))
		cancel()
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		p.n++
		ack, err := workload.Record(ctx, cl, p.rec, p.id, p.stream, 0, fmt.Sprintf("probe-%d", p.n), 3*time.Second)
		cl.Close()
		if err == nil && ack.Owner != not {
			return ack.Owner
		}
		time.Sleep(50 * time.Millisecond)
	}
	return ""
}

// brokerTLS is the admin's client TLS for a connection to broker b
// alone, verifying b's node certificate.
func brokerTLS(t *testing.T, c *cluster.Cluster, b *cluster.Broker) *tls.Config {
	t.Helper()
	ca, err := transport.LoadCA(c.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := transport.LoadKeyPair(c.AdminCert())
	if err != nil {
		t.Fatal(err)
	}
	return transport.VerifyPeer(transport.ClientTLS(ca, &cert, "127.0.0.1"), transport.RoleNode, b.ID)
}

// readReplicaAt reads shard of stream from offset 0 to end from broker
// b's own replica (workload.ReadReplica).
func readReplicaAt(t *testing.T, ctx context.Context, c *cluster.Cluster, b *cluster.Broker, stream string, shard int, end uint64) []history.Entry {
	t.Helper()
	out, err := workload.ReadReplica(ctx, b.Addr, brokerTLS(t, c, b), stream, shard, end, 30*time.Second) // a restarted replica may still be catching up
	if err != nil {
		t.Fatalf("reading %s's replica: %v", b.ID, err)
	}
	return out
}

// createReplicated creates stream, of shards shards and replication
// factor 3, through admin, and returns the cluster's first map that has
// it, and the stream, once each shard is placed on three brokers.
func createReplicated(t *testing.T, ctx context.Context, c *cluster.Cluster, admin *client.Client, stream string, shards int) (*shardmap.Map, *shardmap.Stream) {
	t.Helper()
	createStream(t, ctx, admin, shardmap.StreamConfig{Name: stream, Shards: shards, Replicas: 3})
	m, err := c.WaitMap(ctx, func(m *shardmap.Map) bool { _, ok := m.Stream(stream); return ok })
	if err != nil {
		t.Fatal(err)
	}
	st, _ := m.Stream(stream)
	for s := range shards {
		if set := st.Placement.Replicas(s); len(set) != 3 {
			t.Fatalf("%s/%d placed on %v, want 3 replicas", stream, s, set)
		}
	}
	return m, st
}
