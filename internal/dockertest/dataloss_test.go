package dockertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	hist "github.com/felix-broker/felix/internal/history"
	"github.com/felix-broker/felix/internal/tidseg"
	"github.com/felix-broker/felix/internal/workload"
)

// TestReplicatedDataLoss loses a machine: while publishers and
// subscribers run through every broker on a stream of replication factor
// 3, a broker that does not lead shard 0 is killed, its container
// removed with its data directory, and a new one started in its place
// (the same node id and address, an empty data directory), while each
// shard keeps its majority on the other two.
//
// It checks: no acked record is lost and none is written twice (the
// history check of workloadRun.finish, and the two intact replicas hold
// the same records at the same offsets); the other two brokers keep
// committing every shard; the broker with the lost directory does not
// crash; no subscriber sees a wrong record; and the emptied broker
// rejoins: each of its replicas joins its group under a new raft id
// (broker/rejoin.go), is caught up from the leader, and then serves every
// acked record of its shard at the same offsets as the others. (Once it
// is a voter again it may lead and ack: the history check covers those
// acks like any other.)
func TestReplicatedDataLoss(t *testing.T) {
	c := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const stream, shards = "lost", 3
	r := c.startWorkload(ctx, t, stream, shards)
	time.Sleep(time.Second)

	lost, leader := r.killFollower(ctx, t, c)
	if err := c.Replace(ctx, lost); err != nil {
		t.Fatalf("starting %s again with an empty data directory: %v", lost.Name, err)
	}
	replaced := time.Now()
	t.Logf("killed %s (a follower of %s/0, led by %s), removed its container and data, started a new one in its place", lost.Name, stream, leader)
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatalf("after replacing %s: %v", lost.Name, err)
	}
	// Every shard keeps committing, through every broker, the emptied
	// one included (it forwards to the leaders).
	for s := range shards {
		for i, b := range c.Brokers {
			if _, err := r.leaderVia(ctx, i, s); err != nil {
				t.Errorf("%s/%d through %s after the loss: %v", stream, s, b.Name, err)
			}
		}
	}
	time.Sleep(3 * time.Second) // more load on the shards with one replica emptied

	running, code, err := c.Running(ctx, lost)
	if err != nil {
		t.Fatal(err)
	}
	if !running {
		t.Errorf("%s exited (code %s) after its data directory was lost: a lost replica must stop its group, not the broker", lost.Name, code)
	}
	rep, logs := r.finish(ctx, t, lost)
	t.Logf("%s", rep)

	after := make([]int, shards)
	for _, p := range r.rec.Publishes() {
		if p.Outcome != hist.Acked || !p.Return.After(replaced) {
			continue
		}
		after[p.Shard]++
	}
	for s, n := range after {
		if n == 0 {
			t.Errorf("nothing acked on %s/%d after %s lost its data", stream, s, lost.Name)
		}
	}
	t.Logf("acked per shard after the loss: %v", after)

	// The emptied broker's replicas rejoin and catch up: each serves
	// every record of its shard, the same as the intact replicas. While
	// one is joining it refuses subscribers (unavailable).
	c.waitReplicasHold(ctx, t, lost, stream, logs, replaced, "the loss")
}

// waitReplicasHold waits, within rejoinWithin, until n's new replica of
// every shard of stream serves all of that shard's records as logs holds
// them, failing at the first wrong record; since and after say what the
// catch-up time is measured from.
func (c *Cluster) waitReplicasHold(ctx context.Context, t *testing.T, n *Node, stream string, logs [][]hist.Entry, since time.Time, after string) {
	t.Helper()
	shards := len(logs)
	for s := range shards {
		deadline := time.Now().Add(rejoinWithin)
		for {
			got, err := workload.ReadReplica(ctx, n.Addr, c.brokerTLS(n), stream, s, uint64(len(logs[s])-1), 5*time.Second)
			if errs := workload.Compare(n.Name, perShard(shards, s, got), logs); len(errs) > 0 {
				t.Fatalf("%s's new replica of %s/%d served a wrong record: %v", n.Name, stream, s, errs)
			}
			if err == nil && len(got) == len(logs[s]) {
				t.Logf("%s's new replica of %s/%d holds all %d records, %v after %s", n.Name, stream, s, len(got), time.Since(since).Round(time.Second), after)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's new replica of %s/%d did not catch up within %v: %d of %d records, %v", n.Name, stream, s, rejoinWithin, len(got), len(logs[s]), err)
			}
			time.Sleep(time.Second)
		}
	}
}

// rejoinWithin bounds the time a replica lost with its data takes to join
// its group again and catch up, in TestReplicatedDataLoss (a few seconds
// of records; measured well under it).
const rejoinWithin = 60 * time.Second

// leaderVia publishes to shard through broker i's client until one is
// acked, within replicatedFailover, and returns the leader that acked it.
func (r *workloadRun) leaderVia(ctx context.Context, i, shard int) (string, error) {
	deadline := time.Now().Add(replicatedFailover)
	var last error
	for time.Now().Before(deadline) {
		ack, err := r.probe(ctx, i, shard)
		if err == nil {
			return ack.Owner, nil
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	return "", fmt.Errorf("nothing acked within %v: %w", replicatedFailover, last)
}

// perShard places entries read from one shard at index shard of shards.
func perShard(shards, shard int, entries []hist.Entry) [][]hist.Entry {
	out := make([][]hist.Entry, shards)
	out[shard] = entries
	return out
}

// TestReplicatedBitFlip damages a broker's disk as Jepsen's bitflip
// nemesis does: while publishers and subscribers run on a stream of
// replication factor 3, a broker that does not lead shard 0 is killed,
// one bit is flipped in the middle of the oldest log segment of each of
// its replicas (docker cp out and in), and it is started again. Each
// replica fails its checksums when it opens; the broker must set it aside
// and have a new replica join in its place (never serve, vote or ack
// from damaged data). Then: the history check of workloadRun.finish (no
// acked record lost or duplicated, linearizable; the two intact replicas
// agree), and each new replica on the damaged broker serves every record
// of its shard at the same offsets as the others.
func TestReplicatedBitFlip(t *testing.T) {
	c := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const stream, shards = "flip", 3
	r := c.startWorkload(ctx, t, stream, shards)
	time.Sleep(3 * time.Second) // records on every replica

	victim, _ := r.killFollower(ctx, t, c)
	for s := range shards {
		seg, at, err := c.flipSegmentBit(ctx, t, victim, fmt.Sprintf("/data/streams/%s/%d", stream, s))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("flipped a bit of %s's replica of %s/%d: byte %d of segment %s", victim.Name, stream, s, at, seg)
	}
	if err := c.Restart(ctx, victim); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatalf("after restarting %s: %v", victim.Name, err)
	}
	time.Sleep(3 * time.Second) // more load while the damaged replicas are replaced

	rep, logs := r.finish(ctx, t, victim)
	t.Logf("%s", rep)
	c.waitReplicasHold(ctx, t, victim, stream, logs, restarted, "the restart")
	if n := strings.Count(c.Logs(victim, 2000), "replica's storage is damaged"); n < shards {
		t.Errorf("%s logged %d damaged replicas, want one per shard (%d)", victim.Name, n, shards)
	}
}

// errNothingToFlip: the replica holds no segment with data yet.
var errNothingToFlip = errors.New("no segment with data")

// flipSegmentBit flips one bit in the middle of the oldest tidwall
// segment with data in dir of n's stopped container, and returns the
// segment's name and the byte's position.
func (c *Cluster) flipSegmentBit(ctx context.Context, t *testing.T, n *Node, dir string) (string, int, error) {
	tmp := t.TempDir()
	if _, err := docker(ctx, "cp", n.Container+":"+dir, tmp); err != nil {
		return "", 0, err
	}
	local := filepath.Join(tmp, filepath.Base(dir))
	ents, err := os.ReadDir(local)
	if err != nil {
		return "", 0, err
	}
	var seg, path string
	var b []byte
	for _, e := range ents { // sorted by name: the oldest segment first
		if name := e.Name(); len(name) == 20 && strings.Trim(name, "0123456789") == "" {
			if b, err = os.ReadFile(filepath.Join(local, name)); err != nil {
				return "", 0, err
			}
			if len(b) >= 2 {
				seg, path = name, filepath.Join(local, name)
				break
			}
		}
	}
	if seg == "" {
		return "", 0, fmt.Errorf("%w: in %s of %s", errNothingToFlip, dir, n.Name)
	}
	end, _ := tidseg.EntriesEnd(b)
	at := end / 2 // in an entry, not in the zeros preallocated after them
	b[at] ^= 0x04
	if err := os.WriteFile(path, b, 0o640); err != nil {
		return "", 0, err
	}
	if _, err := docker(ctx, "cp", path, n.Container+":"+dir+"/"+seg); err != nil {
		return "", 0, err
	}
	return seg, at, nil
}

// killFollower kills -9 a broker of c that does not lead shard 0 and
// returns it, with shard 0's leader.
func (r *workloadRun) killFollower(ctx context.Context, t *testing.T, c *Cluster) (*Node, string) {
	t.Helper()
	leader, err := r.leader(ctx, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range c.Brokers {
		if b.Name == leader {
			continue
		}
		if err := c.Kill(ctx, b); err != nil {
			t.Fatal(err)
		}
		return b, leader
	}
	t.Fatalf("no broker other than the leader %s", leader)
	return nil, ""
}
