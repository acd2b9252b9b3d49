package dockertest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// The size of TestReplicatedNemesis. Failover figures over 20 leader
// kills:
//
//	go test ./internal/dockertest/ -run TestReplicatedNemesis -timeout 1h -args -felix.docker.cycles=20 -felix.docker.faults=kill
var (
	nemesisCycles = flag.Int("felix.docker.cycles", 6, "nemesis cycles in TestReplicatedNemesis")
	nemesisShards = flag.Int("felix.docker.shards", 8, "shards of TestReplicatedNemesis's stream (each broker hosts a replica of every one; with more than the broker's park threshold of busy logs, 4, their fdatasyncs can park)")
	nemesisFaults = flag.String("felix.docker.faults", "kill,pause,partition,isolate",
		"the faults TestReplicatedNemesis's nemesis picks from, in turn: kill (kill -9 a shard's raft leader, then restart it), pause (SIGSTOP one broker), partition (cut one broker off the network), isolate (cut a shard's leader off from its peers only, publishing to it meanwhile), bitflip (kill -9 one broker, flip a bit in the oldest segment of each of its replicas, restart it)")
)

// faultHold is how long a paused or cut-off broker stays so: longer than
// raft's election timeout (1 to 2s) and the brokers' lease (3s), so that
// its peers elect other leaders and the control plane sees it dead.
const faultHold = 4 * time.Second

// TestReplicatedNemesis runs a stream of replication factor 3 (several
// shards, a raft group each, on the three broker containers) with a
// publisher and a subscriber through every broker, while a nemesis, for
// -felix.docker.cycles cycles, in turn kills -9 the broker leading a
// shard (found by an ack's Owner) and restarts it, freezes one broker
// (docker pause, as SIGSTOP) for faultHold, cuts one off the network for
// faultHold, or cuts a shard's leader off from its peers only, its
// clients still reaching it, and publishes to it meanwhile (a leader
// that acked what it alone wrote would lose those records; no other
// fault lets a client reach such a leader) (with
// -felix.docker.faults=...,bitflip also: kills one
// broker, flips a bit in each of its replicas and restarts it), waiting
// for the cluster to heal after each. Then it
// reads every shard back and checks (workloadRun.finish): no acked
// record lost, none duplicated, offsets dense, each publisher's order
// kept, acks linearizable (porcupine); the subscribers saw only
// committed records, in offset order; every replica holds the same
// records at the same offsets. It reports each leader kill's failover
// time: from the kill to the first ack on that shard by another leader.
func TestReplicatedNemesis(t *testing.T) {
	faults := strings.Split(*nemesisFaults, ",")
	for _, f := range faults {
		if !slices.Contains([]string{"kill", "pause", "partition", "isolate", "bitflip"}, f) {
			t.Fatalf("-felix.docker.faults: unknown fault %q", f)
		}
	}
	c := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*nemesisCycles)*time.Minute+3*time.Minute)
	defer cancel()
	const stream = "nemesis"
	shards := *nemesisShards
	r := c.startWorkload(ctx, t, stream, shards)
	time.Sleep(time.Second) // publishing under way before the first fault

	seed := time.Now().UnixNano()
	rnd := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("nemesis: %d cycles of %v, seed %d", *nemesisCycles, faults, seed)
	var failovers []time.Duration
	for cycle := range *nemesisCycles {
		fault := faults[cycle%len(faults)]
		var what string
		switch fault {
		case "kill":
			shard := rnd.IntN(shards)
			took, desc, err := r.killLeader(ctx, shard)
			if err != nil {
				t.Fatalf("cycle %d: %v", cycle, err)
			}
			failovers = append(failovers, took)
			what = desc
		case "pause":
			n := c.Brokers[rnd.IntN(len(c.Brokers))]
			if err := c.Pause(ctx, n); err != nil {
				t.Fatal(err)
			}
			time.Sleep(faultHold)
			if err := c.Unpause(ctx, n); err != nil {
				t.Fatal(err)
			}
			what = fmt.Sprintf("paused %s for %v", n.Name, faultHold)
		case "bitflip":
			n := c.Brokers[rnd.IntN(len(c.Brokers))]
			if err := c.Kill(ctx, n); err != nil {
				t.Fatal(err)
			}
			flipped := 0
			for s := range shards {
				_, _, err := c.flipSegmentBit(ctx, t, n, fmt.Sprintf("/data/streams/%s/%d", stream, s))
				switch {
				case err == nil:
					flipped++
				case !errors.Is(err, errNothingToFlip): // a replica without data yet is left alone
					t.Fatal(err)
				}
			}
			if err := c.Restart(ctx, n); err != nil {
				t.Fatal(err)
			}
			// Its replicas rejoin as new ones: the next fault waits until
			// they are voters again (losing two replicas of a shard at
			// once is beyond what a majority of three survives).
			if err := r.waitVoters(ctx, n.Name); err != nil {
				t.Fatalf("cycle %d: %v", cycle, err)
			}
			what = fmt.Sprintf("killed %s, flipped a bit in %d of its %d replicas, restarted it; its replicas are voters", n.Name, flipped, shards)
		case "partition":
			n := c.Brokers[rnd.IntN(len(c.Brokers))]
			if err := c.Disconnect(ctx, n); err != nil {
				t.Fatal(err)
			}
			time.Sleep(faultHold)
			if err := c.Connect(ctx, n); err != nil {
				t.Fatal(err)
			}
			what = fmt.Sprintf("cut %s off for %v", n.Name, faultHold)
		case "isolate":
			desc, err := r.isolateLeader(ctx, rnd.IntN(shards))
			if err != nil {
				t.Fatalf("cycle %d: %v", cycle, err)
			}
			what = desc
		}
		healed := time.Now()
		if err := c.WaitHealthy(ctx); err != nil {
			t.Fatalf("cycle %d (%s): the cluster did not heal: %v", cycle, what, err)
		}
		t.Logf("cycle %d: %s; healthy again %v after", cycle, what, time.Since(healed).Round(time.Millisecond))
		time.Sleep(time.Second)
	}
	rep, logs := r.finish(ctx, t)
	records := 0
	for _, l := range logs {
		records += len(l)
	}
	t.Logf("%d nemesis cycles; %d records in %d shards; %s", *nemesisCycles, records, shards, rep)
	if len(failovers) > 0 {
		t.Logf("%d leader kills; from kill -9 to the first ack by a new leader: median %v, max %v",
			len(failovers), median(failovers), slices.Max(failovers).Round(time.Millisecond))
	}
	if rep.Acked < 100 {
		t.Errorf("only %d records acknowledged: the test did not exercise the cluster", rep.Acked)
	}
	// The faults must have met parked fdatasyncs too, not only blocking
	// ones: a broker parks while four or more of its logs are busy. The
	// counters restart with their broker, so they undercount.
	var parked float64
	for _, b := range c.Brokers {
		n, err := c.Metric(ctx, b, "felix_wal_fsyncs_parked_total")
		if err != nil {
			t.Fatal(err)
		}
		parked += n
	}
	t.Logf("fdatasyncs parked since each broker's last start: %.0f", parked)
	if shards > 4 && parked == 0 {
		t.Errorf("no fdatasync parked over %d shards: the nemesis did not exercise the parked path", shards)
	}
}

// killLeader kills -9 the broker leading shard, waits until another
// leader acks a publish to it, restarts the killed broker, and returns
// the failover time (from the kill to the first ack on shard by another
// leader, publishers' or probes') and what it did.
func (r *workloadRun) killLeader(ctx context.Context, shard int) (time.Duration, string, error) {
	leader, err := r.leader(ctx, shard, "")
	if err != nil {
		return 0, "", err
	}
	n := r.c.Broker(leader)
	if n == nil {
		return 0, "", fmt.Errorf("%s/%d acked by %q, not a broker of the cluster", r.stream, shard, leader)
	}
	if err := r.c.Kill(ctx, n); err != nil {
		return 0, "", err
	}
	killed := time.Now()
	next, err := r.leader(ctx, shard, leader)
	if err != nil {
		return 0, "", fmt.Errorf("after killing %s: %w", leader, err)
	}
	took, _ := r.firstAckAfter(killed, shard, leader) // the probe's ack at least
	time.Sleep(500 * time.Millisecond)
	if err := r.c.Restart(ctx, n); err != nil {
		return 0, "", err
	}
	return took, fmt.Sprintf("killed %s, leader of %s/%d; %s acked %v later; restarted", leader, r.stream, shard, next, took.Round(time.Millisecond)), nil
}

// isolateLeader cuts the broker leading shard off from its peers for
// faultHold (Cluster.IsolatePeers), its clients still reaching it, and
// meanwhile publishes to shard through it, one record at a time: records
// it must not ack, holding no majority (those it acked would be lost: the
// next leader never had them). The records are in the history, as the
// probes are. Then it heals the cut and says what it did.
func (r *workloadRun) isolateLeader(ctx context.Context, shard int) (string, error) {
	leader, err := r.leader(ctx, shard, "")
	if err != nil {
		return "", err
	}
	i := slices.IndexFunc(r.c.Brokers, func(n *Node) bool { return n.Name == leader })
	if i < 0 {
		return "", fmt.Errorf("%s/%d acked by %q, not a broker of the cluster", r.stream, shard, leader)
	}
	n := r.c.Brokers[i]
	if err := r.c.IsolatePeers(ctx, n); err != nil {
		return "", err
	}
	acked, sent := 0, 0
	for until := time.Now().Add(faultHold); time.Now().Before(until); {
		if _, err := r.probe(ctx, i, shard); err == nil {
			acked++
		}
		sent++
	}
	if err := r.c.HealPeers(ctx, n); err != nil {
		return "", err
	}
	if home := r.probers[i].Addr(); home != n.Addr {
		return "", fmt.Errorf("the probes meant to go through %s went to %s", n.Name, home)
	}
	if acked > 0 {
		// Cut off from every peer it can neither commit nor forward: an
		// ack is one no majority holds.
		return "", fmt.Errorf("%s, leader of %s/%d cut off from its peers, acked %d of %d records published through it", leader, r.stream, shard, acked, sent)
	}
	return fmt.Sprintf("cut %s, leader of %s/%d, off from its peers for %v; of %d records published through it meanwhile, it acked %d", leader, r.stream, shard, faultHold, sent, acked), nil
}

// waitVoters waits until every replica of the stream on node is a voter
// without an error, within rejoinWithin.
func (r *workloadRun) waitVoters(ctx context.Context, node string) error {
	deadline := time.Now().Add(rejoinWithin)
	for {
		sts, err := r.clients[0].ReplicaStatus(ctx, r.stream)
		voters := 0
		for _, st := range sts {
			if st.Node == node && st.Err == "" && st.Member == "voter" {
				voters++
			}
		}
		if err == nil && voters == r.shards {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s's replicas of %s are not all voters within %v: %+v, %v", node, r.stream, rejoinWithin, sts, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
