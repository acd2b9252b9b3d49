package e2e

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/clustertest"
	"github.com/felix-broker/felix/shardmap"
)

// TestSeedStory is the story of seed/cross-broker-publishing.txt against a
// control plane and three broker processes.
func TestSeedStory(t *testing.T) {
	ctx := testCtx(t)
	c := clustertest.Start(t, 3)
	clients := map[string]*client.Client{}
	for _, b := range c.Brokers() {
		clients[b.ID] = clustertest.Connect(t, c, b.ID)
	}
	any := clients["broker-0"]
	if err := any.CreateStream(ctx, shardmap.StreamConfig{Name: "orders", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	m, err := any.Map(ctx)
	if err != nil {
		t.Fatal(err)
	}
	owner, err := m.Owner("orders", 0)
	if err != nil {
		t.Fatal(err)
	}
	var nonOwner string
	for _, b := range c.Brokers() {
		if b.ID != owner.ID {
			nonOwner = b.ID
			break
		}
	}

	// A subscriber attached through a broker that does not own the shard:
	// the SDK follows the redirect to the owner.
	sub, err := clients[nonOwner].Subscribe(ctx, "orders", client.Earliest())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	next, stop := iterPull(ctx, sub)
	defer stop()

	ack, err := clients[nonOwner].Publish(ctx, "orders", nil, []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	if !ack.Forwarded || ack.Via != nonOwner || ack.Owner != owner.ID {
		t.Fatalf("hello: ack %+v, want via %s forwarded to %s", ack, nonOwner, owner.ID)
	}
	ack, err = clients[owner.ID].Publish(ctx, "orders", nil, []byte("direct"))
	if err != nil {
		t.Fatal(err)
	}
	if ack.Forwarded || ack.Via != owner.ID || ack.Owner != owner.ID {
		t.Fatalf("direct: ack %+v, want written locally by %s", ack, owner.ID)
	}
	for _, want := range []string{"hello", "direct"} {
		if got := next(t); got != want {
			t.Fatalf("subscriber got %q, want %q", got, want)
		}
	}

	// Six sent one at a time, through different brokers: in order.
	ids := []string{"broker-0", "broker-1", "broker-2"}
	for i := range 6 {
		v := fmt.Sprintf("seq-%03d", i)
		if _, err := clients[ids[i%3]].Publish(ctx, "orders", nil, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 6 {
		if got, want := next(t), fmt.Sprintf("seq-%03d", i); got != want {
			t.Fatalf("one-at-a-time record %d arrived as %q, want %q", i, got, want)
		}
	}

	// Twenty-four sent twelve at a time through three brokers: all of them,
	// exactly once, in whatever order the owner committed them.
	var wg sync.WaitGroup
	errs := make(chan error, 24)
	for batch := range 2 {
		for j := range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				v := fmt.Sprintf("par-%03d", batch*12+j)
				if _, err := clients[ids[j%3]].Publish(ctx, "orders", nil, []byte(v)); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var got []string
	for range 24 {
		got = append(got, next(t))
	}
	slices.Sort(got)
	for i, v := range got {
		if want := fmt.Sprintf("par-%03d", i); v != want {
			t.Fatalf("the 24 concurrent records, sorted: %v; missing or duplicated %s", got, want)
		}
	}
}
