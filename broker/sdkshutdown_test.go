package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/shardmap"
)

// TestSDKGracefulShutdownKeepsAcks: a broker that shuts down
// gracefully refuses new publishes and acks every record it took in
// (TestGracefulShutdownAcksWhatItCommits). A plain SDK publisher that keeps
// publishing meanwhile must get those acks: a record committed and acked
// by the broker must not be failed as "outcome unknown" (547 of 5,166
// were, before the SDK let a session whose write side died go on reading).
func TestSDKGracefulShutdownKeepsAcks(t *testing.T) {
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	b := ip.brokers[0]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := ip.sdk(t, client.WithReconnect(time.Hour, time.Hour)) // no redial: the run ends with the broker
	pub, err := c.Publisher(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	var mu sync.Mutex
	futs := map[string]*client.Future{}
	stop := make(chan struct{})
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			v := fmt.Sprint(i)
			f, err := pub.PublishAsync(ctx, nil, []byte(v), client.WithShard(0))
			if err != nil {
				return
			}
			mu.Lock()
			futs[v] = f
			mu.Unlock()
		}
	}()
	for {
		mu.Lock()
		n := len(futs)
		mu.Unlock()
		if n >= 2000 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	close(stop)
	mu.Lock()
	defer mu.Unlock()
	lost := map[string]bool{}
	acked := 0
	for v, f := range futs {
		_, err := f.Wait(ctx)
		switch {
		case err == nil:
			acked++
		case errors.Is(err, client.ErrConnectionLost):
			if len(lost) == 0 {
				t.Logf("%s: %v", v, err)
			}
			lost[v] = true
		}
	}
	b = ip.startBroker(0)
	ip.brokers[0] = b
	lostButWritten := 0
	for _, v := range readAll(t, b, "orders", 0) {
		if lost[v] {
			lostButWritten++
		}
	}
	t.Logf("%d records: %d acked, %d outcome unknown, of which %d committed", len(futs), acked, len(lost), lostButWritten)
	if lostButWritten > 0 {
		t.Fatalf("%d records the broker committed during its graceful shutdown (and acked) were failed as outcome unknown", lostButWritten)
	}
}

// TestSDKResendsWhatAClosingHomeRefused: plain publishers, one
// pipelining with PublishAsync and one calling Publish, publish through
// a home broker that closes gracefully, to shards owned by the other
// brokers. The home refuses what it reads once its drain begins
// (shutting_down, nothing written) and tells the streams to go away; the
// SDK sends those records, and those behind them, again through its new
// home, in order. Every record is acked once, in each publisher's order:
// none fails, none is of unknown outcome. Before, PublishAsync's refused
// records failed shutting_down and the records the home never read
// failed ErrConnectionLost.
func TestSDKResendsWhatAClosingHomeRefused(t *testing.T) {
	const shards = 6
	ip := startInproc(t, 3, shardmap.StreamConfig{Name: "orders", Shards: shards})
	home := ip.brokers[0]
	var elsewhere []int // the shards the home does not own
	for s := range shards {
		if ip.owner("orders", s) != home {
			elsewhere = append(elsewhere, s)
		}
	}
	if len(elsewhere) == 0 {
		t.Skip("the home owns every shard")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := ip.sdkAt(t, home)

	type sent struct {
		value string
		shard int
		f     *client.Future
	}
	var mu sync.Mutex
	var async, sync_ []sent
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // pipelining, PublishAsync
		pub, err := c.Publisher(ctx, "orders")
		if err != nil {
			t.Error(err)
			return
		}
		defer pub.Close()
		for i := 0; ; i++ {
			select {
			case <-stop:
				if err := pub.Flush(ctx); err != nil {
					t.Error(err)
				}
				return
			default:
			}
			v, s := fmt.Sprintf("a%d", i), elsewhere[i%len(elsewhere)]
			f, err := pub.PublishAsync(ctx, nil, []byte(v), client.WithShard(s))
			if err != nil {
				t.Errorf("PublishAsync %s: %v", v, err)
				return
			}
			mu.Lock()
			async = append(async, sent{v, s, f})
			mu.Unlock()
		}
	})
	wg.Go(func() { // one at a time, Publish
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			v, s := fmt.Sprintf("s%d", i), elsewhere[i%len(elsewhere)]
			ack, err := c.Publish(ctx, "orders", nil, []byte(v), client.WithShard(s))
			if err != nil {
				t.Errorf("Publish %s: %v", v, err)
				return
			}
			mu.Lock()
			sync_ = append(sync_, sent{value: v, shard: ack.Shard})
			mu.Unlock()
		}
	})
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(async)
	}
	for count() < 3000 {
		time.Sleep(time.Millisecond)
	}
	if err := home.Close(); err != nil {
		t.Fatal(err)
	}
	for n := count(); count() < n+3000; {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if t.Failed() {
		return
	}

	// Every record acked, once, where its ack says, and each
	// publisher's records of a shard in the order published.
	at := map[string]client.Ack{}
	unknown, failed := 0, 0
	for _, r := range async {
		ack, err := r.f.Wait(ctx)
		switch {
		case err == nil:
			at[r.value] = ack
		case errors.Is(err, client.ErrConnectionLost):
			if unknown == 0 {
				t.Logf("%s: %v", r.value, err)
			}
			unknown++
		default:
			if failed == 0 {
				t.Logf("%s: %v", r.value, err)
			}
			failed++
		}
	}
	t.Logf("PublishAsync: %d published, %d acked, %d unknown outcome, %d failed; Publish: %d acked; home now %s",
		len(async), len(at), unknown, failed, len(sync_), c.Addr())
	if unknown+failed > 0 {
		t.Fatalf("%d PublishAsync records of unknown outcome and %d failed, of %d", unknown, failed, len(async))
	}
	last := map[int]uint64{}
	for _, r := range async {
		a := at[r.value]
		if prev, ok := last[a.Shard]; ok && a.Offset <= prev {
			t.Fatalf("%s acked at %d/%d, after a record published before it at offset %d", r.value, a.Shard, a.Offset, prev)
		}
		last[a.Shard] = a.Offset
	}
	seen := map[string]int{}
	for _, s := range elsewhere {
		for _, v := range readAll(t, ip.owner("orders", s), "orders", s) {
			seen[v]++
		}
	}
	for _, r := range async {
		if seen[r.value] != 1 {
			t.Fatalf("%s is %d times in the logs", r.value, seen[r.value])
		}
	}
	for _, r := range sync_ {
		if seen[r.value] != 1 {
			t.Fatalf("%s is %d times in the logs", r.value, seen[r.value])
		}
	}
}
