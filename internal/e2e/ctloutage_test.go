package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/clustertest"
	"github.com/felix-broker/felix/shardmap"
)

// outageRefusalBound is how soon a publish to a broker restarted during a
// control plane outage must fail: the broker's Join fails its round of
// ctl addresses after the ctl handshake timeout (1 s with the harness's
// 1 s lease), and a connection made before is held until then. Generous
// for a loaded machine; the wait it replaces was the caller's deadline
// (30 s for a client), for as long as the outage lasted.
const outageRefusalBound = 6 * time.Second

// TestCtlOutageRestartedBroker: with the control plane down, broker-1 is
// killed and started again. It has no shard map (it reaches no control
// plane), and refuses its connections unavailable once its Join has
// failed a round: a publish through it, and one through broker-0
// forwarded to it, fail within outageRefusalBound as an ErrUnavailable
// that says nothing was written (not ErrConnectionLost, not "may or may
// not have been written"). Publishes through the other brokers to their
// shards go on. Once the control plane is back, everything works again.
// Before, every publish to broker-1 waited out its caller's deadline.
func TestCtlOutageRestartedBroker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := clustertest.Start(t, 3) // lease 1 s
	admin := clustertest.Connect(t, c, "broker-0")
	m := createStream(t, ctx, admin, shardmap.StreamConfig{Name: "orders", Shards: 6})
	shard := map[string]int{}
	for _, b := range c.Brokers() {
		shard[b.ID] = shardOwnedBy(t, m, "orders", b.ID)
	}
	viaB1 := clustertest.Connect(t, c, "broker-1")
	viaB2 := clustertest.Connect(t, c, "broker-2")
	if _, err := viaB1.Publish(ctx, "orders", nil, []byte("before"), client.WithShard(shard["broker-1"])); err != nil {
		t.Fatal(err)
	}

	if err := c.StopCtl(); err != nil {
		t.Fatal(err)
	}
	if err := c.Kill("broker-1"); err != nil {
		t.Fatal(err)
	}
	if err := c.StartBroker("broker-1"); err != nil {
		t.Fatal(err)
	}

	// refused publishes on cl to shard s and checks it fails typed
	// unavailable, nothing written, within outageRefusalBound.
	refused := func(what string, cl *client.Client, s int) {
		t.Helper()
		pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
		defer pcancel()
		start := time.Now()
		_, err := cl.Publish(pctx, "orders", nil, []byte("during"), client.WithShard(s))
		took := time.Since(start)
		t.Logf("%s: %v after %v", what, err, took.Round(time.Millisecond))
		switch {
		case err == nil:
			t.Errorf("%s: succeeded, want unavailable", what)
		case !errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrConnectionLost) || strings.Contains(err.Error(), "may or may not"):
			t.Errorf("%s: %v after %v, want ErrUnavailable, nothing written", what, err, took)
		case took > outageRefusalBound:
			t.Errorf("%s: failed after %v, want within %v", what, took, outageRefusalBound)
		}
	}
	// viaB1's connection to the killed process is found dead by the
	// first publish on it (a stateless reset from the new process): that
	// record's outcome is unknown, as for any broker killed under a
	// publisher. The next dials the new process.
	pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
	_, err := viaB1.Publish(pctx, "orders", nil, []byte("on the killed process's connection"), client.WithShard(shard["broker-1"]))
	pcancel()
	t.Logf("first publish through broker-1 after its kill: %v", err)
	refused("publish through broker-1 to its shard", viaB1, shard["broker-1"])
	refused("publish through broker-1 to its shard, again", viaB1, shard["broker-1"])
	refused("publish through broker-0 forwarded to broker-1", admin, shard["broker-1"])
	refused("publish through broker-0 forwarded to broker-1, again", admin, shard["broker-1"])
	for _, p := range []struct {
		via *client.Client
		to  string
	}{{admin, "broker-2"}, {viaB2, "broker-0"}, {admin, "broker-0"}} {
		pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := p.via.Publish(pctx, "orders", nil, []byte("during"), client.WithShard(shard[p.to]))
		pcancel()
		if err != nil {
			t.Errorf("publish through %s to %s's shard with the control plane down: %v", p.via.Addr(), p.to, err)
		}
	}

	if err := c.StartCtl(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitLive(ctx, 3); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		what string
		via  *client.Client
	}{{"through broker-1", viaB1}, {"through broker-0", admin}, {"through broker-2", viaB2}} {
		deadline := time.Now().Add(30 * time.Second)
		for {
			pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := p.via.Publish(pctx, "orders", nil, []byte("after"), client.WithShard(shard["broker-1"]))
			pcancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("publish %s to broker-1's shard after the control plane is back: %v", p.what, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// shardOwnedBy returns a shard of stream node owns in m.
func shardOwnedBy(t *testing.T, m *shardmap.Map, stream, node string) int {
	t.Helper()
	st, _ := m.Stream(stream)
	for s := range st.Shards {
		if owner, _ := m.Owner(stream, s); owner.ID == node {
			return s
		}
	}
	t.Fatalf("%s owns no shard of %s", node, stream)
	return -1
}
