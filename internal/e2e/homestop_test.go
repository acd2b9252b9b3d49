package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/clustertest"
)

// TestHomeBrokerGracefullyStopped: a client's home broker is stopped
// gracefully (it says shutting_down, "publish through another broker") and
// stays down 12 s, as a pod being rescheduled does. The R=3 stream has a
// live majority and leader on the two other brokers throughout.
func TestHomeBrokerGracefullyStopped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clustertest.Start(t, 3)
	admin := clustertest.Connect(t, c, "broker-0")
	createReplicated(t, ctx, c, admin, "r3", 1)
	cl := clustertest.Connect(t, c, "broker-2", client.WithReconnect(20*time.Millisecond, 500*time.Millisecond), client.WithDialTimeout(time.Second))
	if _, err := cl.Publish(ctx, "r3", nil, []byte("before"), client.WithShard(0)); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	if err := c.Stop("broker-2"); err != nil {
		t.Fatal(err)
	}
	var firstOK time.Duration
	fails := 0
	for time.Since(stopped) < 12*time.Second {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := cl.Publish(pctx, "r3", nil, []byte("during"), client.WithShard(0))
		pcancel()
		if err == nil {
			firstOK = time.Since(stopped)
			break
		}
		fails++
		if fails == 1 || fails%5 == 0 {
			t.Logf("+%v: %v", time.Since(stopped).Round(time.Millisecond), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("first success %v after SIGTERM, %d failed publishes before it; home now %s", firstOK.Round(time.Millisecond), fails, cl.Addr())
	if firstOK == 0 || firstOK > 3*time.Second {
		t.Errorf("R=3 stream with its leader and majority live: a client homed on the broker stopped gracefully failed %d publishes; first success %v after SIGTERM (0 = none within 12 s)", fails, firstOK.Round(time.Millisecond))
	}
}
