package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/clustertest"
)

// TestGracefulStopHandsOverLeadership: SIGTERM to the leader of an R=3
// shard (a planned restart). The shard's other two replicas are live;
// Kafka's controlled shutdown and Redpanda's maintenance mode move the
// leadership first, so that publishes through the other brokers do not
// stall for an election. Before Close handed the leaderships over, the
// publishes stalled 1.2 to 3 s per stop (an election timeout of silence,
// plus a dial to the departed leader), found by a review of rolling
// restarts.
func TestGracefulStopHandsOverLeadership(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clustertest.Start(t, 3)
	admin := clustertest.Connect(t, c, "broker-0")
	createReplicated(t, ctx, c, admin, "r3", 1)
	// find the leader
	var leader string
	for leader == "" {
		ack, err := admin.Publish(ctx, "r3", nil, []byte("probe"), client.WithShard(0))
		switch {
		case err == nil:
			leader = ack.Owner
		case ctx.Err() != nil:
			t.Fatalf("no ack from r3/0 to find its leader: %v", err)
		default:
			time.Sleep(50 * time.Millisecond) // no leader yet: ask again, not at once
		}
	}
	var via string
	for _, b := range c.Brokers() {
		if b.ID != leader {
			via = b.ID
		}
	}
	cl := clustertest.Connect(t, c, via, client.WithReconnect(20*time.Millisecond, 500*time.Millisecond))
	var mu sync.Mutex
	var acks []time.Time
	var errs []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := cl.Publish(pctx, "r3", nil, []byte("v"), client.WithShard(0))
			pcancel()
			mu.Lock()
			if err == nil {
				acks = append(acks, time.Now())
			} else {
				errs = append(errs, err.Error())
			}
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	})
	time.Sleep(time.Second)
	t0 := time.Now()
	if err := c.Stop(leader); err != nil {
		t.Fatal(err)
	}
	exited := time.Since(t0)
	time.Sleep(5 * time.Second)
	close(stop)
	wg.Wait()
	var gap time.Duration
	var last time.Time
	for _, a := range acks {
		if !last.IsZero() && a.Sub(last) > gap {
			gap = a.Sub(last)
		}
		last = a
	}
	t.Logf("leader %s stopped (SIGTERM, exited after %v); publishing through %s: %d acks, longest gap between acks %v; errors %d %v", leader, exited.Round(time.Millisecond), via, len(acks), gap.Round(time.Millisecond), len(errs), errs)
	if gap > 500*time.Millisecond {
		t.Errorf("graceful stop of the leader of r3/0 (two live replicas left): no ack for %v; a planned stop should hand the leadership over first", gap.Round(time.Millisecond))
	}
}
