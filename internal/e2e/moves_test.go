package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
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

// catchUpBound is how long a moved replica may take to join its shard's
// group and become a voter: a few admission rounds (broker/rejoin.go asks
// every 5 ticks of 100 ms), the log of a short test sent to it, and one
// joint configuration change, on a loaded 2-core machine.
const catchUpBound = 30 * time.Second

// TestReplicaMovedAfterMachineLoss runs a stream of replication factor 3
// on four real broker processes, so that one broker holds no replica of
// shard 0, with publishers through every broker (one idempotent) and a
// subscriber attached throughout. The leader of shard 0 is killed -9 and
// its data directory deleted (a machine lost for good); once the control
// plane sees it down, its replica is moved (client.MoveReplica, the
// control plane choosing the target: the only broker without a replica).
// It checks that the moved replica joins the group and becomes a caught-up
// voter within catchUpBound; that it counts in the quorum: with one of
// the two original replicas left also killed, shard 0 still acknowledges
// publishes; the history (no acked record lost or duplicated, offsets
// dense, order kept, linearizable) and the subscriber's view; that every
// replica of the new replica sets is a voter holding the same records;
// and that the lost broker, restarted empty, hosts no replica of shard 0
// (nor its directory) while its replica of shard 1, if it had one,
// rejoins with every record.
func TestReplicaMovedAfterMachineLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("the replica move test takes about half a minute")
	}
	const stream, shards, publishers = "mv", 2, 4
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := clustertest.Start(t, 4)
	admin := clustertest.Connect(t, c, "broker-0")
	// The stream is created once all four are members: each shard is
	// placed on three of them.
	m, st := createReplicated(t, ctx, c, admin, stream, shards)
	original, set1 := slices.Clone(st.Placement.Replicas(0)), slices.Clone(st.Placement.Replicas(1))
	var target string
	for _, b := range c.Brokers() {
		if !slices.Contains(original, b.ID) {
			target = b.ID
		}
	}
	t.Logf("%s/0 placed on %v, %s/1 on %v; %s holds no replica of %s/0", stream, original, stream, set1, target, stream)

	// A publisher through each broker. The SDK publishes through the
	// broker it is connected to only, so the one through the lost broker
	// publishes nothing (outcome unknown) until it is back, and the
	// idempotent one, which must end with each record acked exactly once,
	// goes through the target, which is never killed.
	var rec history.Recorder
	stop := make(chan struct{})
	var wg sync.WaitGroup
	idempotentPublisher := slices.IndexFunc(c.Brokers(), func(b *cluster.Broker) bool { return b.ID == target })
	for i := range publishers {
		via := c.Brokers()[i%len(c.Brokers())].ID
		opts := []client.Opt{client.WithReconnect(20*time.Millisecond, 500*time.Millisecond), client.WithDialTimeout(time.Second)}
		if i == idempotentPublisher {
			opts = append(opts, client.WithIdempotence(), client.WithRetryTimeout(time.Minute))
		}
		cl := clustertest.Connect(t, c, via, opts...)
		wg.Go(func() { workload.Publish(ctx, stop, cl, stream, i, i == idempotentPublisher, &rec) })
	}
	sub := tail(t, ctx, c, stream, shards)
	probes := &prober{t: t, c: c, stream: stream, rec: &rec, id: publishers} // publishers+1 is the read-back

	// The machine of shard 0's leader is lost, once shard 0 has a log for
	// the moved replica to catch up on: killed -9, its data gone.
	started := time.Now()
	for deadline := started.Add(30 * time.Second); ackedOf(&rec, 0, time.Time{}) < 200; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d records of %s/0 acknowledged 30 s after the publishers started", ackedOf(&rec, 0, time.Time{}), stream)
		}
	}
	t.Logf("%d records of %s/0 acknowledged %v after the publishers started", ackedOf(&rec, 0, time.Time{}), stream, time.Since(started).Round(time.Millisecond))
	lost := probes.leader(ctx, "")
	if lost == "" {
		t.Fatalf("no leader of %s/0 acknowledged a publish within %v", stream, failoverBound)
	}
	if !slices.Contains(original, lost) {
		t.Fatalf("%s acknowledged a publish of %s/0 as its leader, but holds no replica of it (replicas %v)", lost, stream, original)
	}
	// While it lives, its replica does not move: it would leave the group
	// before the new one has caught up.
	if mv, err := admin.MoveReplica(ctx, stream, 0, lost, ""); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("moving the replica of %s/0 off %s, which is live: got %+v, %v; want an error matching client.ErrInvalid", stream, lost, mv, err)
	}
	if err := c.Kill(lost); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(c.Broker(lost).DataDir); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if _, err := c.WaitMap(ctx, func(m *shardmap.Map) bool { n, ok := m.Node(lost); return ok && !n.Live }); err != nil {
		t.Fatalf("waiting for the control plane to see %s down: %v", lost, err)
	}
	t.Logf("killed %s, the leader of %s/0, and deleted its data directory; down in the map %v later",
		lost, stream, time.Since(killed).Round(time.Millisecond))

	// Its replica moves to the only broker without one.
	ops := clustertest.Connect(t, c, target, client.WithReconnect(20*time.Millisecond, 500*time.Millisecond))
	moved := time.Now()
	// The SDK first asks the other replicas: until they have elected a
	// leader among them (an election timeout after the kill) it says to
	// wait, as it would to an operator.
	var mv client.MovedReplica
	var err error
	for deadline := time.Now().Add(failoverBound); ; time.Sleep(200 * time.Millisecond) {
		mv, err = ops.MoveReplica(ctx, stream, 0, lost, "")
		if !errors.Is(err, client.ErrReplicasNotReady) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("moving %s's replica of %s/0: %v", lost, stream, err)
	}
	if mv.To != target || mv.From != lost || mv.Shard != 0 {
		t.Fatalf("moved %+v, want %s/0 from %s to %s, the only live broker without a replica of it", mv, stream, lost, target)
	}
	if want := slices.Replace(slices.Clone(original), slices.Index(original, lost), slices.Index(original, lost)+1, target); !slices.Equal(mv.Replicas, want) {
		t.Fatalf("after the move %s/0's replicas are %v: want %v, %s in %s's place", stream, mv.Replicas, want, target, lost)
	}
	// In the map, the target holds the lost broker's raft slot, as a
	// replica that joined.
	slots := slices.Clone(original)
	slices.Sort(slots)
	slots[slices.Index(slots, lost)] = target
	if m, err := c.WaitMap(ctx, func(m *shardmap.Map) bool { return m.Epoch >= mv.Epoch }); err != nil {
		t.Fatal(err)
	} else if st, _ := m.Stream(stream); !slices.Equal(st.Placement.Slots(0), slots) || !st.Placement.Joined(0, target) {
		t.Fatalf("after the move %s/0's raft slots are %v (%s joined: %v), want %v, %s joined", stream, st.Placement.Slots(0), target, st.Placement.Joined(0, target), slots, target)
	}
	// How far shard 0's leader had committed when the move was made: the
	// moved replica has caught up once it is a voter with as much.
	var leaderNext uint64
	for _, s := range replicaStates(t, ctx, ops, stream) {
		if s.Shard == 0 && s.Node != target && s.Err == "" {
			leaderNext = max(leaderNext, s.Next)
		}
	}
	var seen []string // the moved replica's member states, in order
	for deadline := time.Now().Add(catchUpBound); ; {
		var at client.ReplicaState
		for _, s := range replicaStates(t, ctx, ops, stream) {
			if s.Shard == 0 && s.Node == target {
				at = s
			}
		}
		if m := at.Member; m != "" && (len(seen) == 0 || seen[len(seen)-1] != m) {
			seen = append(seen, m)
		}
		if at.Err == "" && at.Member == "voter" && at.Next >= leaderNext {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's moved replica of %s/0 is not a caught-up voter %v after the move: %+v (members seen %v; the leader was at offset %d at the move)",
				target, stream, catchUpBound, at, seen, leaderNext)
		}
		time.Sleep(50 * time.Millisecond)
	}
	catchUp := time.Since(moved)
	t.Logf("moved %s/0 from %s to %s (map epoch %d, replicas %v); a voter at offset >= %d %v later (member states seen: %v)",
		stream, lost, target, mv.Epoch, mv.Replicas, leaderNext, catchUp.Round(time.Millisecond), seen)

	// The moved replica counts in the quorum: with the lost broker and one
	// more original replica down, shard 0 commits only with it. The one
	// killed is not shard 0's leader, and, where the choice is free, not
	// a replica of shard 1 as well (which would leave shard 1, if the lost
	// broker held one of its replicas too, without a majority meanwhile).
	time.Sleep(time.Second)
	leader := probes.leader(ctx, "")
	remaining := slices.DeleteFunc(slices.Clone(original), func(n string) bool { return n == lost })
	slices.SortStableFunc(remaining, func(a, b string) int {
		cost := func(n string) int {
			switch {
			case n == leader:
				return 2
			case slices.Contains(set1, lost) && slices.Contains(set1, n):
				return 1
			}
			return 0
		}
		return cost(a) - cost(b)
	})
	victim := remaining[0]
	if err := c.Kill(victim); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	next := probes.leader(ctx, victim)
	if next == "" {
		t.Fatalf("no publish of %s/0 acknowledged within %v of killing %s, with %s lost: the moved replica on %s does not count in the quorum",
			stream, failoverBound, victim, lost, target)
	}
	if next == lost {
		t.Fatalf("%s/0 acknowledged by %s, which is dead and no longer a replica", stream, lost)
	}
	t.Logf("killed %s too (%s led %s/0): %s acknowledged %s/0 publishes %v later, committed with %s's moved replica",
		victim, leader, stream, next, stream, time.Since(down).Round(time.Millisecond), target)
	// Not a lucky one: shard 0 keeps committing.
	const quorumProbes = 20
	for n := range quorumProbes {
		if _, err := workload.Record(ctx, ops, &rec, probes.id, stream, 0, fmt.Sprintf("quorum-%d", n), 5*time.Second); err != nil {
			t.Fatalf("publish %d of %d to %s/0 with %s and %s down: %v", n+1, quorumProbes, stream, lost, victim, err)
		}
	}
	t.Logf("%d more publishes of %s/0 acknowledged with only %s and %s up; %d of the publishers' too",
		quorumProbes, stream, next, target, ackedOf(&rec, 0, down))
	if err := c.Restart(ctx, victim); err != nil {
		t.Fatalf("restarting %s: %v", victim, err)
	}

	time.Sleep(time.Second)
	close(stop)
	wg.Wait()

	fresh := clustertest.Connect(t, c, target, client.WithReconnect(20*time.Millisecond, 500*time.Millisecond))
	ends, logs := readBackToEnd(t, ctx, fresh, stream, shards, publishers+1, &rec)
	r := history.Check(rec.Publishes(), logs, time.Minute)
	idem := 0
	for _, p := range rec.Publishes() {
		if p.Publisher == idempotentPublisher {
			idem++
			if p.Outcome != history.Acked {
				t.Errorf("idempotent publisher %d: %s ended %v, want acked exactly once", p.Publisher, p.Value, p.Outcome)
			}
		}
	}
	t.Logf("%d publishers (one idempotent) through 4 brokers, R=3, one replica moved: %s; shards end at %v", publishers, r, ends)
	if idem == 0 {
		t.Errorf("the idempotent publisher published nothing")
	}
	if !r.OK() {
		t.Errorf("history check failed: lost %v; duplicated %v; misplaced %v; phantom %v; gaps %v; reordered %v",
			r.Lost, r.Duplicated, r.Misplaced, r.Phantom, r.Gaps, r.Reordered)
	}
	if r.Acked < 50 {
		t.Errorf("only %d records acknowledged: the test did not exercise the cluster", r.Acked)
	}
	finishTail(t, sub, ends, logs)

	// Every replica of the new replica sets, the lost broker's replica of
	// shard 1 aside (it is down), is a caught-up voter with the same
	// records at the same offsets.
	m = c.Ctl().Map()
	st, _ = m.Stream(stream)
	sets := make([][]string, shards)
	for s := range shards {
		sets[s] = slices.Clone(st.Placement.Replicas(s))
	}
	if want := slices.Concat(remaining, []string{target}); !sameSet(sets[0], want) {
		t.Fatalf("%s/0's replicas in the map are %v, want %v", stream, sets[0], want)
	}
	waitVoters(t, ctx, fresh, stream, sets, ends, lost)
	for s, set := range sets {
		for _, n := range set {
			if n != lost {
				checkReplica(t, ctx, c, c.Broker(n), stream, s, ends[s], logs[s])
			}
		}
	}

	// The lost broker comes back empty. It holds no replica of shard 0
	// any more: it must not open one (nor its directory); its replica of
	// shard 1, if any, rejoins under a new raft id with every record.
	if err := c.Restart(ctx, lost); err != nil {
		t.Fatalf("restarting %s with an empty data directory: %v", lost, err)
	}
	waitVoters(t, ctx, fresh, stream, sets, ends, "")
	if slices.Contains(sets[1], lost) {
		checkReplica(t, ctx, c, c.Broker(lost), stream, 1, ends[1], logs[1])
		t.Logf("%s's replica of %s/1 rejoined as a voter with all %d records", lost, stream, len(logs[1]))
	}
	dir := filepath.Join(c.Broker(lost).DataDir, "streams", stream, "0")
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s, restarted after its replica of %s/0 moved to %s, has %s (%v): it must not open a replica of a shard it no longer holds",
				lost, stream, target, dir, err)
		}
		own, err := replicaStatesAt(ctx, c, c.Broker(lost), stream)
		if err != nil {
			t.Fatalf("asking %s about its replicas: %v", lost, err)
		}
		shardsOf := make([]int, 0, len(own))
		for _, s := range own {
			shardsOf = append(shardsOf, s.Shard)
		}
		if slices.Contains(shardsOf, 0) || slices.Contains(sets[1], lost) != slices.Contains(shardsOf, 1) {
			t.Fatalf("%s, restarted after its replica of %s/0 moved to %s, hosts replicas of shards %v of %s, want those of %v",
				lost, stream, target, shardsOf, stream, st.Placement.ReplicatedBy(lost))
		}
		var nodes []string
		for _, s := range replicaStates(t, ctx, fresh, stream) {
			if s.Shard == 0 {
				nodes = append(nodes, s.Node)
			}
		}
		if !sameSet(nodes, sets[0]) {
			t.Fatalf("replica status of %s/0 lists %v, want its replicas %v", stream, nodes, sets[0])
		}
	}
	if !c.Broker(lost).Running() {
		t.Errorf("%s exited after restarting with an empty data directory", lost)
	}
}

// ackedOf counts the records of shard that rec says were acknowledged
// to publishes called after since.
func ackedOf(rec *history.Recorder, shard int, since time.Time) int {
	n := 0
	for _, p := range rec.Publishes() {
		if p.Outcome == history.Acked && p.Shard == shard && p.Call.After(since) {
			n++
		}
	}
	return n
}

// replicaStates returns cl.ReplicaStatus of stream, failing the test on
// an error.
func replicaStates(t *testing.T, ctx context.Context, cl *client.Client, stream string) []client.ReplicaState {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	states, err := cl.ReplicaStatus(sctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	return states
}

// waitVoters waits, within catchUpBound, until the replica status of
// stream lists exactly the replicas sets gives each shard, each a voter
// that has committed the shard up to ends[shard] (included), but for the
// replicas of down, which must be reported down.
func waitVoters(t *testing.T, ctx context.Context, cl *client.Client, stream string, sets [][]string, ends []uint64, down string) {
	t.Helper()
	deadline := time.Now().Add(catchUpBound)
	for {
		states := replicaStates(t, ctx, cl, stream)
		var wrong []string
		nodes := make([][]string, len(sets))
		for _, s := range states {
			if s.Shard < 0 || s.Shard >= len(sets) {
				wrong = append(wrong, fmt.Sprintf("a shard the stream does not have: %+v", s))
				continue
			}
			nodes[s.Shard] = append(nodes[s.Shard], s.Node)
			if s.Node == down {
				continue
			}
			if s.Err != "" || s.Member != "voter" || s.Next <= ends[s.Shard] {
				wrong = append(wrong, fmt.Sprintf("%+v", s))
			}
		}
		for s, set := range sets {
			if !sameSet(nodes[s], set) {
				wrong = append(wrong, fmt.Sprintf("shard %d reported by %v, not its replicas %v", s, nodes[s], set))
			}
		}
		if len(wrong) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas of %s not caught-up voters within %v (ends %v): %v", stream, catchUpBound, ends, wrong)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkReplica checks that broker b's own replica of shard of stream holds
// want, the shard as read through the SDK, up to end.
func checkReplica(t *testing.T, ctx context.Context, c *cluster.Cluster, b *cluster.Broker, stream string, shard int, end uint64, want []history.Entry) {
	t.Helper()
	if got := readReplicaAt(t, ctx, c, b, stream, shard, end); !slices.Equal(got, want) {
		t.Errorf("%s's replica of %s/%d differs from the shard read through the SDK: %d records vs %d", b.ID, stream, shard, len(got), len(want))
	}
}

// sameSet reports whether a and b hold the same nodes, in any order.
func sameSet(a, b []string) bool {
	return len(a) == len(b) && !slices.ContainsFunc(a, func(n string) bool { return !slices.Contains(b, n) })
}

// replicaStatesAt asks broker b alone, on a connection to it, about the
// replicas of stream it hosts (replica.status): the SDK's ReplicaStatus
// asks only the brokers the map names as replicas.
func replicaStatesAt(ctx context.Context, c *cluster.Cluster, b *cluster.Broker, stream string) ([]transport.ReplicaState, error) {
	ca, err := transport.LoadCA(c.CAFile())
	if err != nil {
		return nil, err
	}
	cert, err := transport.LoadKeyPair(c.AdminCert())
	if err != nil {
		return nil, err
	}
	tlsConf := transport.VerifyPeer(transport.ClientTLS(ca, &cert, "127.0.0.1"), transport.RoleNode, b.ID)
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := transport.Dial(dctx, b.Addr, tlsConf, transport.Config{})
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", b.Addr, err)
	}
	defer conn.CloseWithError(0, "done")
	s, err := conn.OpenStreamSync(dctx)
	if err != nil {
		return nil, fmt.Errorf("open a stream to %s: %w", b.Addr, err)
	}
	defer s.CancelRead(0)
	stopOnDone := context.AfterFunc(dctx, func() { s.CancelRead(0); s.CancelWrite(0) })
	defer stopOnDone()
	if err := transport.NewWriter(s).Write(&transport.Request{Op: "replica.status", Stream: shardmap.StreamConfig{Name: stream}}); err != nil {
		return nil, fmt.Errorf("ask %s: %w", b.Addr, err)
	}
	_ = s.Close()
	r := transport.NewReader(s, 0)
	for {
		f, err := r.Read()
		if err != nil {
			return nil, fmt.Errorf("read %s's answer: %w", b.Addr, err)
		}
		switch f := f.(type) {
		case *transport.Response:
			return f.Replicas, nil
		case *transport.Error:
			return nil, f
		case *transport.MapUpdate:
		default:
			return nil, fmt.Errorf("%s answered replica.status with a %T", b.Addr, f)
		}
	}
}
