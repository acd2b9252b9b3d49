package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/internal/clustertest"
	"github.com/felix-broker/felix/shardmap"
)

// outageBound is the bound a request to a broker must be answered
// within while the control plane is down: the broker's ForwardTimeout
// (10 s by default), the longest a publish waits on routing. The
// assertions below allow it whole; a broker that answers at all
// answers in milliseconds.
const outageBound = 10 * time.Second

// TestCtlOutage: while the control plane is down, the brokers that were
// running go on serving by the map they hold and stay ready (/readyz
// 200). A broker restarted during the outage holds no map: it refuses
// every connection unavailable at once (a client connecting to it, a
// peer forwarding to it), reports not ready, and serves again once the
// control plane is back; a client whose home it was moves on to another
// broker for map reads and publishes, a publish to its shards fails
// unavailable within outageBound, an admin change fails unavailable once
// the SDK's retries end, and a subscription to its shard resumes once it
// serves. Before, the restarted broker left every connection unanswered
// (publishes and requests waited out their callers' deadlines), and
// every broker turned unready a lease after the control plane stopped.
func TestCtlOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := clustertest.Start(t, 3) // lease 1 s
	admin := clustertest.Connect(t, c, "broker-0")
	m := createStream(t, ctx, admin, shardmap.StreamConfig{Name: "orders", Shards: 6})
	toB1, toB0 := keyOwnedBy(t, m, "orders", "broker-1"), keyOwnedBy(t, m, "orders", "broker-0")
	shardB1 := shardOwnedBy(t, m, "orders", "broker-1")
	viaB1 := clustertest.Connect(t, c, "broker-1")
	if _, err := viaB1.Publish(ctx, "orders", toB1, []byte("before")); err != nil {
		t.Fatal(err)
	}

	if err := c.StopCtl(); err != nil {
		t.Fatal(err)
	}
	// Three leases and more: the brokers' leases have all run out.
	time.Sleep(4 * time.Second)
	for _, b := range c.Brokers() {
		if code, body := getAdmin(t, c, b.ID, "/readyz"); code != http.StatusOK {
			t.Errorf("%s with the control plane down for 4 s (lease 1 s): /readyz %d %s, want 200: it serves by the map it holds", b.ID, code, body)
		}
	}
	if _, err := admin.Publish(ctx, "orders", toB1, []byte("during the outage")); err != nil {
		t.Fatalf("publish through broker-0 to broker-1's shard with the control plane down: %v", err)
	}

	// broker-1 restarts during the outage: it has no map.
	if err := c.Kill("broker-1"); err != nil {
		t.Fatal(err)
	}
	if err := c.StartBroker("broker-1"); err != nil {
		t.Fatal(err)
	}
	waitHealthz(t, c, "broker-1")
	code, body := getAdmin(t, c, "broker-1", "/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "no shard map") {
		t.Errorf("broker-1 restarted with the control plane down: /readyz %d %q, want 503 no shard map", code, body)
	}
	if code, _ := getAdmin(t, c, "broker-1", "/readyz/replicas"); code != http.StatusServiceUnavailable {
		t.Errorf("broker-1 restarted with the control plane down: /readyz/replicas %d, want 503", code)
	}

	// within calls op and checks that it ends within bound, with an
	// error matching client.ErrUnavailable if wantErr.
	within := func(what string, bound time.Duration, wantErr bool, op func(ctx context.Context) error) {
		t.Helper()
		octx, cancel := context.WithTimeout(ctx, 3*bound)
		defer cancel()
		start := time.Now()
		err := op(octx)
		took := time.Since(start)
		t.Logf("%s: %v after %v", what, err, took.Round(time.Millisecond))
		switch {
		case !wantErr && err != nil:
			t.Errorf("%s: %v after %v, want success", what, err, took)
		case wantErr && err == nil:
			t.Errorf("%s: succeeded, want unavailable", what)
		case wantErr && !errors.Is(err, client.ErrUnavailable):
			t.Errorf("%s: %v after %v, want an error matching client.ErrUnavailable", what, err, took)
		case took > bound:
			t.Errorf("%s: answered after %v, want within %v", what, took, bound)
		}
	}
	within("connect to broker-1", outageBound, true, func(ctx context.Context) error {
		cl, err := client.Connect(ctx, c.Broker("broker-1").Addr, client.WithCAFile(c.CAFile()), client.WithClientCertFile(c.AdminCert()))
		if err == nil {
			cl.Close()
		}
		return err
	})
	// A client whose home is broker-1 moves on: it reads the map from
	// another broker, and publishes through another.
	within("map read by a client whose home is broker-1", outageBound, false, func(ctx context.Context) error {
		_, err := viaB1.Map(ctx)
		return err
	})
	within("keyed publish by that client to broker-0's shard", outageBound, false, func(ctx context.Context) error {
		_, err := viaB1.Publish(ctx, "orders", toB0, []byte("x"))
		return err
	})
	if viaB1.Addr() == c.Broker("broker-1").Addr {
		t.Errorf("the client's home is still broker-1, which has no map")
	}
	within("keyed publish by that client to broker-1's shard", outageBound, true, func(ctx context.Context) error {
		_, err := viaB1.Publish(ctx, "orders", toB1, []byte("x"))
		return err
	})
	within("publish through broker-0 forwarded to broker-1", outageBound, true, func(ctx context.Context) error {
		_, err := admin.Publish(ctx, "orders", toB1, []byte("x"))
		return err
	})
	// A change goes to the control plane: the SDK sends it again for
	// changeRetryFor (15 s) while the answer says to retry, and a broker
	// out of the control plane's reach for longer than its lease answers
	// at once.
	within("stream.create", 15*time.Second+outageBound, true, func(ctx context.Context) error {
		return viaB1.CreateStream(ctx, shardmap.StreamConfig{Name: "new", Shards: 1})
	})
	// A subscription rides the outage out: it attaches again until
	// broker-1 serves, and then reads from where it was.
	sub, err := viaB1.Subscribe(ctx, "orders", client.Earliest(), client.Shard(shardB1))
	if err != nil {
		t.Fatalf("subscribe to broker-1's shard with broker-1 without a map: %v", err)
	}
	defer sub.Stop()

	if err := c.StartCtl(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitLive(ctx, 3); err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	for rec, err := range sub.Records(sctx) {
		if err != nil {
			t.Fatalf("subscription to broker-1's shard after the control plane is back: %v", err)
		}
		if string(rec.Value) != "before" {
			t.Fatalf("first record of broker-1's shard: %q, want %q", rec.Value, "before")
		}
		break
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := viaB1.Publish(ctx, "orders", toB1, []byte("after"))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish through broker-1 after the control plane is back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, body := getAdmin(t, c, "broker-1", "/readyz"); code != http.StatusOK {
		t.Errorf("broker-1 with the control plane back: /readyz %d %s", code, body)
	}
}

// keyOwnedBy returns a key whose shard of stream node owns in m.
func keyOwnedBy(t *testing.T, m *shardmap.Map, stream, node string) []byte {
	t.Helper()
	st, ok := m.Stream(stream)
	if !ok {
		t.Fatalf("no stream %q", stream)
	}
	for i := range 10000 {
		key := []byte(fmt.Sprintf("key-%d", i))
		if owner, _ := m.Owner(stream, shardmap.ShardFor(key, st.Shards)); owner.ID == node {
			return key
		}
	}
	t.Fatalf("no key of %s is owned by %s", stream, node)
	return nil
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

// getAdmin GETs path on broker id's admin listener.
func getAdmin(t *testing.T, c *cluster.Cluster, id, path string) (int, string) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get("http://" + c.AdminAddr(id) + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body))
}

// waitHealthz waits until broker id's admin listener answers /healthz.
func waitHealthz(t *testing.T, c *cluster.Cluster, id string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := getAdmin(t, c, id, "/healthz")
		if code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: /healthz %d %s 30 s after start", id, code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
