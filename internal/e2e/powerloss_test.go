//go:build linux

package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/internal/clustertest"
	"github.com/felix-broker/felix/internal/history"
	"github.com/felix-broker/felix/internal/lazyfs"
	"github.com/felix-broker/felix/internal/workload"
	"github.com/felix-broker/felix/shardmap"
)

// The power-loss test's size: small enough for CI by default; a soak is
//
//	go test ./internal/e2e -run TestPowerLoss -timeout 2h -args -felix.power.cycles=100
var powerCycles = flag.Int("felix.power.cycles", 4, "power cuts in TestPowerLoss")

// powerSegment is the brokers' segment size in TestPowerLoss
// (FELIX_SEGMENT_SIZE): small, so that the logs start new segment files,
// whose names only a directory fsync makes durable, many times a cycle.
const powerSegment = 8 << 10

// The most an fsync takes on the brokers' lazyfs disks
// (lazyfs.SetSyncDelay: uniformly random up to it), about a disk's
// flush; and on a fast and a slow one (powerNemesis.skew): a replicated
// shard's leader on a fast disk has synced and committed what its
// followers on slow ones are still syncing, so that a follower that
// answered before its own fdatasync returned would have its answer
// counted for records that a cut then takes from both followers.
const (
	powerSyncDelay = 2 * time.Millisecond
	fastSyncDelay  = 500 * time.Microsecond
	slowSyncDelay  = 8 * time.Millisecond
)

// lazyDisk mounts a lazyfs (package lazyfs) at dir over a backing
// directory in the test's temp dir, unmounted when the test ends: what
// is written there and not fsynced is lost at its Crash. It skips the
// test where FUSE cannot be used.
func lazyDisk(t *testing.T, dir string) *lazyfs.FS {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	fsys := lazyfs.MountForTest(t, dir)
	fsys.SetSyncDelay(powerSyncDelay)
	return fsys
}

// powerStream is a stream of TestPowerLoss and what its clients were
// told.
type powerStream struct {
	cfg  shardmap.StreamConfig
	rec  history.Recorder
	logs [][]history.Entry // read back after the previous cut
}

// TestPowerLoss cuts the power of every broker at once, cycle after
// cycle: the brokers' data directories are on lazyfs mounts, which lose
// everything not fsynced (data, and names whose directory was not
// fsynced) when they crash; the control plane stays up, as a power cut
// of the broker machines only would leave it. Publishers through every
// broker write to a stream of replication factor 1 and one of 3 until,
// at a random moment, the power goes (powerNemesis.cut): every disk is
// cut, every broker killed -9, every disk crashed, and the brokers
// restarted on the same directories, a replicated shard's leader last,
// its disk having been the fast one (powerNemesis.skew). Each cycle then
// checks that every acknowledged record, of this cycle and the earlier
// ones, is at its acknowledged offset with its payload (history.Check:
// nothing lost, duplicated or misplaced, offsets dense, acks
// linearizable), that no offset read back before a cut holds another
// record after it, and that publishing continues after the restart.
func TestPowerLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("the power-loss test takes about half a minute")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*powerCycles)*40*time.Second+time.Minute)
	defer cancel()
	var disks []*lazyfs.FS
	c := clustertest.Start(t, 3, func(o *cluster.Options) {
		for i := range o.Brokers {
			disks = append(disks, lazyDisk(t, filepath.Join(o.Dir, cluster.BrokerID(i))))
		}
		o.BrokerEnv = append(o.BrokerEnv, "FELIX_SEGMENT_SIZE="+strconv.Itoa(powerSegment))
	})
	admin := clustertest.Connect(t, c, "broker-0")
	streams := []*powerStream{
		{cfg: shardmap.StreamConfig{Name: "pl1", Shards: 3}},
		{cfg: shardmap.StreamConfig{Name: "pl3", Shards: 2, Replicas: 3}},
	}
	createStream(t, ctx, admin, streams[0].cfg)
	createReplicated(t, ctx, c, admin, streams[1].cfg.Name, streams[1].cfg.Shards)

	reconnect := []client.Opt{client.WithReconnect(20*time.Millisecond, 500*time.Millisecond), client.WithDialTimeout(time.Second)}
	var clients []*client.Client
	for _, b := range c.Brokers() {
		clients = append(clients, clustertest.Connect(t, c, b.ID, reconnect...))
	}
	n := &powerNemesis{t: t, c: c, disks: disks, clients: clients, stream: streams[1].cfg}
	const marker = 1 << 20 // publisher ids of the read-backs: marker+cycle
	for cycle := range *powerCycles {
		// Publishers through every broker to each stream, with ids of
		// their own this cycle (their values name them).
		began := time.Now()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i, cl := range clients {
			for _, st := range streams {
				id := cycle*len(clients) + i
				wg.Go(func() { workload.Publish(ctx, stop, cl, st.cfg.Name, id, false, &st.rec) })
			}
		}
		time.Sleep(300 * time.Millisecond)
		n.skew(ctx)
		time.Sleep(time.Duration(200+rand.IntN(1000)) * time.Millisecond)
		cut := time.Since(began)
		n.cut(ctx)
		restarted := time.Now()
		// Publishing continues: each stream acknowledges records again
		// (a replicated one once its groups have elected leaders).
		continued := map[*powerStream]bool{}
		for _, st := range streams {
			continued[st] = ackedSince(&st.rec, restarted, failoverBound)
			if !continued[st] {
				t.Errorf("cycle %d, %s: nothing acknowledged within %v of the restart: publishing did not continue", cycle, st.cfg.Name, failoverBound)
			}
		}
		time.Sleep(500 * time.Millisecond)
		close(stop)
		wg.Wait()

		fresh := clustertest.Connect(t, c, "broker-0", reconnect...)
		for _, st := range streams {
			if continued[st] {
				checkPowerCycle(t, ctx, fresh, st, cycle, marker, began, restarted, cut)
			}
		}
		if t.Failed() {
			return
		}
	}
}

// powerNemesis cuts the power of every broker of c at once: it kills -9
// them, crashes their disks and starts them again. Before a cut it makes
// the disk of a leader of stream (replicated) fast and the others slow
// (skew), and after it starts that leader last, once its peers have
// elected another (cut).
type powerNemesis struct {
	t       *testing.T
	c       *cluster.Cluster
	disks   []*lazyfs.FS // of c's brokers, in order
	clients []*client.Client
	stream  shardmap.StreamConfig
	target  int // the broker skew chose, -1 for none
	shard   int // a shard it leads
}

// skew finds the leader of a random shard of the replicated stream (as
// its replicas report it; waiting up to failoverBound for one), and makes
// its disk fast and the others slow.
func (n *powerNemesis) skew(ctx context.Context) {
	n.target, n.shard = -1, rand.IntN(n.stream.Shards)
	leader := ""
	for deadline := time.Now().Add(failoverBound); leader == "" && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		leader = n.leader(ctx, -1)
	}
	for i, b := range n.c.Brokers() {
		if b.ID == leader {
			n.target = i
		}
	}
	if n.target < 0 {
		n.t.Logf("no leader of %s/%d within %v: the disks stay even", n.stream.Name, n.shard, failoverBound)
		return
	}
	for i, d := range n.disks {
		if i == n.target {
			d.SetSyncDelay(fastSyncDelay)
		} else {
			d.SetSyncDelay(slowSyncDelay)
		}
	}
}

// leader returns the leader of the shard skew chose as its running
// replicas say (ReplicaStatus), asked through the client of a broker
// other than the not-th; "" if none says.
func (n *powerNemesis) leader(ctx context.Context, not int) string {
	via := n.clients[(not+1)%len(n.clients)] // -1: the first
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	states, _ := via.ReplicaStatus(sctx, n.stream.Name)
	for _, st := range states {
		if st.Shard == n.shard && st.Err == "" && st.Leader != "" {
			return st.Leader
		}
	}
	return ""
}

// cut cuts the power of every disk (lazyfs.FS.Cut) and kills -9 every
// broker at once, crashes every disk, and starts the brokers again, waiting until each is live: in a random order a random
// moment apart (machines do not boot alike), and the leader skew chose
// last, once the others have elected another leader of its shard (or
// failoverBound passed), so that what it alone had on disk when it
// acknowledged does not count. The disks are even again after it.
func (n *powerNemesis) cut(ctx context.Context) {
	t, c := n.t, n.c
	t.Helper()
	for _, d := range n.disks {
		d.Cut()
	}
	var wg sync.WaitGroup
	for _, b := range c.Brokers() {
		wg.Go(func() {
			if err := c.Kill(b.ID); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for _, d := range n.disks {
		if err := d.Crash(); err != nil {
			t.Fatal(err)
		}
		d.SetSyncDelay(powerSyncDelay)
	}
	restart := func(id string) {
		if err := c.Restart(ctx, id); err != nil {
			t.Errorf("restarting %s after the power cut: %v", id, err)
		}
	}
	for _, i := range rand.Perm(len(c.Brokers())) {
		if i != n.target {
			id := c.Brokers()[i].ID
			wg.Go(func() { restart(id) })
			time.Sleep(time.Duration(rand.IntN(500)) * time.Millisecond)
		}
	}
	wg.Wait()
	if n.target >= 0 {
		last := c.Brokers()[n.target].ID
		for deadline := time.Now().Add(failoverBound); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if l := n.leader(ctx, n.target); l != "" && l != last {
				break
			}
		}
		restart(last)
	}
	if t.Failed() {
		t.FailNow()
	}
}

// checkPowerCycle reads st back after cycle's cut (as publisher
// marker+cycle) and checks its whole history, reporting the cycle's
// counts.
func checkPowerCycle(t *testing.T, ctx context.Context, cl *client.Client, st *powerStream, cycle, marker int, began, restarted time.Time, cut time.Duration) {
	t.Helper()
	_, logs := readBack(t, ctx, cl, st.cfg.Name, st.cfg.Shards, marker+cycle, &st.rec)
	pubs := st.rec.Publishes()
	r := history.Check(pubs, logs, time.Minute)
	acked, after, lost := 0, 0, 0
	for _, p := range pubs {
		if p.Call.Before(began) || p.Publisher >= marker || p.Outcome != history.Acked {
			continue
		}
		acked++
		if p.Call.After(restarted) {
			after++
		}
	}
	for _, p := range r.Lost {
		if !p.Call.Before(began) {
			lost++
		}
	}
	t.Logf("cycle %d, %s (R=%d): power cut %v after the publishers started; this cycle %d acked (%d after the restart), %d of them lost; the whole history: %s",
		cycle, st.cfg.Name, max(1, st.cfg.Replicas), cut.Round(time.Millisecond), acked, after, lost, r)
	if !r.OK() {
		t.Errorf("cycle %d, %s: history check failed: lost %d, the first %v; duplicated %v; misplaced %v; phantom %v; gaps %v; reordered %v",
			cycle, st.cfg.Name, len(r.Lost), r.Lost[:min(len(r.Lost), 5)], r.Duplicated, r.Misplaced, r.Phantom, r.Gaps, r.Reordered)
	}
	// What was read back before this cut is still there, record for
	// record: no offset holds two different records. (The first
	// difference of each shard.)
	for s, before := range st.logs {
		for _, e := range before {
			if e.Offset < uint64(len(logs[s])) && logs[s][e.Offset].Value == e.Value {
				continue
			}
			now := fmt.Sprintf("nothing (the shard ends at %d)", len(logs[s]))
			if e.Offset < uint64(len(logs[s])) {
				now = fmt.Sprintf("%q", logs[s][e.Offset].Value)
			}
			t.Errorf("cycle %d: %s/%d: offset %d held %q before the cut, %s after", cycle, st.cfg.Name, s, e.Offset, e.Value, now)
			break
		}
	}
	if acked == 0 {
		t.Errorf("cycle %d, %s: nothing acknowledged: the cycle did not exercise the cluster", cycle, st.cfg.Name)
	}
	st.logs = logs
}

// ackedSince waits up to wait until rec holds a record acknowledged
// after since, and reports whether it does.
func ackedSince(rec *history.Recorder, since time.Time, wait time.Duration) bool {
	deadline := time.Now().Add(wait)
	for {
		for _, p := range rec.Publishes() {
			if p.Outcome == history.Acked && p.Call.After(since) {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}
