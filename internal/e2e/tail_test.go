package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/clustertest"
	"github.com/felix-broker/felix/shardmap"
)

// TestTailSubscribersUnderPublishLoad: four publishers at full speed into
// one shard of a real broker process and eight subscribers following its
// tail, on a machine they saturate, for a bounded time. Every subscriber
// must see every offset, in order, without an error.
func TestTailSubscribersUnderPublishLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("saturates the machine for several seconds")
	}
	ctx := testCtx(t)
	c := clustertest.Start(t, 1)
	b := c.Brokers()[0].ID
	admin := clustertest.Connect(t, c, b)
	createStream(t, ctx, admin, shardmap.StreamConfig{Name: "tail", Shards: 1})

	const subscribers, publishers = 8, 4
	type tail struct {
		next uint64
		err  error
	}
	tails := make([]tail, subscribers)
	var subWG sync.WaitGroup
	subCtx, stopSubs := context.WithCancel(ctx)
	defer stopSubs()
	var mu sync.Mutex
	for i := range subscribers {
		cl := clustertest.Connect(t, c, b)
		sub, err := cl.Subscribe(subCtx, "tail", client.Latest())
		if err != nil {
			t.Fatal(err)
		}
		subWG.Go(func() {
			defer sub.Stop()
			first := true
			for rec, err := range sub.Records(subCtx) {
				mu.Lock()
				if err != nil {
					if subCtx.Err() == nil {
						tails[i].err = err
					}
					mu.Unlock()
					return
				}
				if !first && rec.Offset != tails[i].next {
					tails[i].err = fmt.Errorf("got offset %d, want %d", rec.Offset, tails[i].next)
					mu.Unlock()
					return
				}
				first = false
				tails[i].next = rec.Offset + 1
				mu.Unlock()
			}
		})
	}

	var pubWG sync.WaitGroup
	pubCtx, stopPubs := context.WithTimeout(ctx, 6*time.Second)
	defer stopPubs()
	value := make([]byte, 256)
	for range publishers {
		cl := clustertest.Connect(t, c, b, client.WithMaxInFlight(1024))
		pubWG.Go(func() {
			for pubCtx.Err() == nil {
				if _, err := cl.PublishAsync(pubCtx, "tail", nil, value); err != nil {
					return
				}
			}
		})
	}
	pubWG.Wait()
	// Let the subscribers catch up to the end, then stop them.
	ack, err := admin.Publish(ctx, "tail", nil, []byte("end"))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		done := true
		for _, tl := range tails {
			done = done && (tl.err != nil || tl.next > ack.Offset)
		}
		mu.Unlock()
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopSubs()
	subWG.Wait()
	t.Logf("%d records published at full speed by %d publishers; %d tail subscribers", ack.Offset+1, publishers, subscribers)
	for i, tl := range tails {
		if tl.err != nil {
			t.Errorf("subscriber %d: %v", i, tl.err)
		} else if tl.next <= ack.Offset {
			t.Errorf("subscriber %d stopped at offset %d, the end is %d", i, tl.next, ack.Offset)
		}
	}
}
