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
// gracefully stops reading publishes and acks every record it took in
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
