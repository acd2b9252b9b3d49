package dockertest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
)

var kills = flag.Int("felix.docker.kills", 1, "ctl leader kills in TestCtlLeaderKill (10 or more for failover figures: median and max)")

// failoverBound is the longest a ctl failover may take before the test
// fails: the dead leader's election session lease (CtlTTL, 3s), which a
// new etcd leader extends by its election timeout (1s) when the killed
// ctl's etcd member led etcd too, after etcd's own election (1 to 2s),
// then the takeover (a few etcd round trips); with room for a loaded
// machine.
const failoverBound = 15 * time.Second

// TestCtlLeaderKill kills -9 the container of the ctl leader while
// publishers write through every broker, and checks that another ctl
// leads within failoverBound, that no publish fails or stalls meanwhile
// (the data path does not depend on ctl), and that a stream created after
// the failover is placed on the brokers and takes records through each of
// them. With -felix.docker.kills=N it does so N times, starting the
// killed ctl again (it rejoins as a follower) before the next kill, and
// reports the failover times.
func TestCtlLeaderKill(t *testing.T) {
	c := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*kills)*time.Minute+2*time.Minute)
	defer cancel()

	admin, err := c.Client(ctx, c.Brokers[0])
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	const stream = "events"
	if err := admin.CreateStream(ctx, client.StreamConfig{Name: stream, Shards: 6}); err != nil {
		t.Fatal(err)
	}

	pubs := make([]*publisher, len(c.Brokers))
	var wg sync.WaitGroup
	pctx, stopPublishing := context.WithCancel(ctx)
	defer stopPublishing()
	for i, b := range c.Brokers {
		cl, err := c.Client(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		pubs[i] = &publisher{via: b.Name}
		wg.Add(1)
		go func() { defer wg.Done(); pubs[i].run(pctx, cl, stream) }()
	}
	defer func() { stopPublishing(); wg.Wait() }()
	time.Sleep(time.Second) // publishing under way before the first kill

	var elected, committed []time.Duration
	for k := range *kills {
		leader, err := c.leader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		if err := c.Kill(ctx, leader); err != nil {
			t.Fatal(err)
		}
		next, took, err := c.newLeader(ctx, leader, killed)
		if err != nil {
			t.Fatalf("kill %d of %s: %v", k+1, leader.Name, err)
		}
		elected = append(elected, took)

		// A stream created after the failover is placed and usable. The
		// create waits for the new leader to commit it (the broker relays
		// it to its ctl, which forwards it to the leader).
		name := "after-" + strconv.Itoa(k)
		if err := createRetrying(ctx, admin, client.StreamConfig{Name: name, Shards: 3}); err != nil {
			t.Fatalf("kill %d: creating %s after the failover: %v", k+1, name, err)
		}
		committed = append(committed, time.Since(killed))
		t.Logf("kill %d: %s killed; %s leads after %v; stream %s created %v after the kill",
			k+1, leader.Name, next.Name, took.Round(time.Millisecond), name, committed[k].Round(time.Millisecond))
		c.checkUsable(ctx, t, name)

		if k < *kills-1 {
			if err := c.Restart(ctx, leader); err != nil {
				t.Fatal(err)
			}
			if err := c.WaitHealthy(ctx); err != nil {
				t.Fatalf("after restarting %s: %v", leader.Name, err)
			}
		}
	}
	stopPublishing()
	wg.Wait()

	acked, refused := 0, 0
	var maxGap time.Duration
	for _, p := range pubs {
		acked += p.acked
		refused += len(p.errs)
		maxGap = max(maxGap, p.maxGap)
		for _, e := range p.errs {
			t.Errorf("publish through %s refused at %s: %v", p.via, e.at.Format("15:04:05.000"), e.err)
		}
		if p.acked == 0 {
			t.Errorf("nothing acked through %s", p.via)
		}
	}
	t.Logf("ctl failover over %d kills: new leader after median %v, max %v; first change committed after median %v, max %v; "+
		"publishes acked %d, refused %d, longest wait for an ack %v",
		len(elected), median(elected), slices.Max(elected), median(committed), slices.Max(committed), acked, refused, maxGap.Round(time.Millisecond))
	if maxGap > failoverBound/3 {
		t.Errorf("publishing stalled for %v during the failovers", maxGap)
	}
}

// leader returns the ctl the control plane says leads.
func (c *Cluster) leader(ctx context.Context) (*Node, error) {
	var last error
	for i := 0; ; i++ {
		members, err := c.ControlPlane(ctx, c.Brokers[i%len(c.Brokers)])
		if err == nil {
			for _, m := range members {
				if m.Role == "leader" {
					if n := c.Ctl(m.Name); n != nil {
						return n, nil
					}
				}
			}
			err = fmt.Errorf("no leader among %+v", members)
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("finding the ctl leader: %w (last: %v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// newLeader waits until a ctl other than old leads, asking every broker
// in turn, and returns it and how long after killed it was first seen.
func (c *Cluster) newLeader(ctx context.Context, old *Node, killed time.Time) (*Node, time.Duration, error) {
	var last error
	for i := 0; time.Since(killed) < failoverBound; i++ {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		members, err := c.ControlPlane(actx, c.Brokers[i%len(c.Brokers)])
		cancel()
		if err == nil {
			for _, m := range members {
				if m.Role == "leader" && m.Name != old.Name {
					if n := c.Ctl(m.Name); n != nil {
						return n, time.Since(killed), nil
					}
				}
			}
			err = fmt.Errorf("control plane %+v", members)
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil, 0, fmt.Errorf("no new ctl leader within %v of killing %s (last: %v)", failoverBound, old.Name, last)
}

// createRetrying creates a stream, retrying while the control plane
// answers unavailable (the broker's ctl is the dead one, or no leader is
// elected yet) or the request times out.
func createRetrying(ctx context.Context, cl *client.Client, cfg client.StreamConfig) error {
	deadline := time.Now().Add(failoverBound)
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := cl.CreateStream(rctx, cfg)
		cancel()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, client.ErrStreamExists):
			return nil // an attempt that timed out made it
		case time.Now().After(deadline) || ctx.Err() != nil:
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkUsable checks that every shard of stream has a live broker owner
// and takes a record through every broker.
func (c *Cluster) checkUsable(ctx context.Context, t *testing.T, stream string) {
	t.Helper()
	for _, b := range c.Brokers {
		cl, err := c.Client(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		m, err := cl.Map(ctx)
		if err != nil {
			cl.Close()
			t.Fatal(err)
		}
		st, ok := m.Stream(stream)
		if !ok {
			cl.Close()
			t.Fatalf("%s's map (epoch %d) lacks stream %s", b.Name, m.Epoch, stream)
		}
		for shard, owner := range st.Placement.All() {
			if n, ok := m.Node(owner); !ok || !n.Live {
				t.Errorf("%s/%d placed on %q, not a live broker (epoch %d)", stream, shard, owner, m.Epoch)
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			ack, err := cl.Publish(pctx, stream, nil, []byte("after the failover"), client.WithShard(shard))
			cancel()
			if err != nil {
				t.Errorf("publish to %s/%d through %s: %v", stream, shard, b.Name, err)
			} else if ack.Owner != owner {
				t.Errorf("%s/%d acked by %s, placed on %s", stream, shard, ack.Owner, owner)
			}
		}
		cl.Close()
	}
}

// publisher publishes one record at a time through one broker until its
// context ends, keyed over every shard, and keeps count.
type publisher struct {
	via    string
	acked  int
	maxGap time.Duration // longest wait for an ack
	errs   []pubErr
}

type pubErr struct {
	at  time.Time
	err error
}

func (p *publisher) run(ctx context.Context, cl *client.Client, stream string) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		start := time.Now()
		pctx, cancel := context.WithTimeout(ctx, failoverBound)
		_, err := cl.Publish(pctx, stream, []byte("k"+strconv.Itoa(i%64)), []byte(p.via))
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			p.errs = append(p.errs, pubErr{at: time.Now(), err: err})
		} else {
			p.acked++
			p.maxGap = max(p.maxGap, time.Since(start))
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2].Round(time.Millisecond)
}
