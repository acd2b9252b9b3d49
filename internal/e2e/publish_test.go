package e2e

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/internal/clustertest"
	"github.com/felix-broker/felix/shardmap"
)

// createStream creates a stream and returns the map that has it.
func createStream(t *testing.T, ctx context.Context, c *client.Client, cfg shardmap.StreamConfig) *shardmap.Map {
	t.Helper()
	if err := c.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	m, err := c.Map(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// ownerAndOther returns the owner of shard 0 of stream and another broker.
func ownerAndOther(t *testing.T, c *cluster.Cluster, m *shardmap.Map, stream string) (string, string) {
	t.Helper()
	n, err := m.Owner(stream, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range c.Brokers() {
		if b.ID != n.ID {
			return n.ID, b.ID
		}
	}
	return n.ID, ""
}

// TestPipelinedPublishesCommitInSendOrder: 10,000 records pipelined on one
// publisher are committed in the order sent, directly and through a hop.
func TestPipelinedPublishesCommitInSendOrder(t *testing.T) {
	ctx := testCtx(t)
	c := clustertest.Start(t, 2)
	admin := clustertest.Connect(t, c, "broker-0")
	m := createStream(t, ctx, admin, shardmap.StreamConfig{Name: "orders", Shards: 1})
	owner, other := ownerAndOther(t, c, m, "orders")
	for _, via := range []string{owner, other} {
		t.Run("via "+via, func(t *testing.T) {
			cl := clustertest.Connect(t, c, via, client.WithMaxInFlight(2048))
			p, err := cl.Publisher(ctx, "orders")
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			const n = 10000
			futures := make([]*client.Future, n)
			for i := range n {
				if futures[i], err = p.PublishAsync(ctx, nil, []byte(fmt.Sprint(i))); err != nil {
					t.Fatal(err)
				}
			}
			var last uint64
			for i, f := range futures {
				ack, err := f.Wait(ctx)
				if err != nil {
					t.Fatalf("record %d: %v", i, err)
				}
				if i > 0 && ack.Offset != last+1 {
					t.Fatalf("record %d committed at offset %d right after offset %d: not in send order", i, ack.Offset, last)
				}
				if ack.Forwarded != (via != owner) {
					t.Fatalf("record %d: ack %+v via %s", i, ack, via)
				}
				last = ack.Offset
			}
		})
	}
}

// TestConcurrentPublishersDeliveredExactlyOnce: 8 publishers on a 4-shard
// stream, through all brokers; every record acked and delivered once.
func TestConcurrentPublishersDeliveredExactlyOnce(t *testing.T) {
	ctx := testCtx(t)
	c := clustertest.Start(t, 3)
	admin := clustertest.Connect(t, c, "broker-0")
	createStream(t, ctx, admin, shardmap.StreamConfig{Name: "events", Shards: 4})
	sub, err := clustertest.Connect(t, c, "broker-1").Subscribe(ctx, "events", client.Earliest())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()

	const publishers, each = 8, 500
	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	for p := range publishers {
		cl := clustertest.Connect(t, c, cluster.BrokerID(p%3))
		wg.Add(1)
		go func() {
			defer wg.Done()
			pub, err := cl.Publisher(ctx, "events")
			if err != nil {
				errs <- err
				return
			}
			defer pub.Close()
			var fs []*client.Future
			for i := range each {
				key := fmt.Sprintf("p%d-%d", p, i)
				f, err := pub.PublishAsync(ctx, []byte(key), []byte(key))
				if err != nil {
					errs <- err
					return
				}
				fs = append(fs, f)
			}
			for _, f := range fs {
				if _, err := f.Wait(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	seen := map[string]int{}
	lastOffset := map[int]int64{}
	for rec, err := range sub.Records(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		if prev, ok := lastOffset[rec.Shard]; ok && int64(rec.Offset) != prev+1 {
			t.Fatalf("shard %d: offset %d after %d", rec.Shard, rec.Offset, prev)
		}
		lastOffset[rec.Shard] = int64(rec.Offset)
		seen[string(rec.Value)]++
		if len(seen) == publishers*each {
			break
		}
	}
	for v, n := range seen {
		if n != 1 {
			t.Fatalf("%s delivered %d times", v, n)
		}
	}
	if len(seen) != publishers*each {
		t.Fatalf("delivered %d distinct records, want %d", len(seen), publishers*each)
	}
}

// TestSubscribeFromTheMiddle starts a one-shard subscription at an offset.
func TestSubscribeFromTheMiddle(t *testing.T) {
	ctx := testCtx(t)
	c := clustertest.Start(t, 1)
	cl := clustertest.Connect(t, c, "broker-0")
	createStream(t, ctx, cl, shardmap.StreamConfig{Name: "orders", Shards: 1})
	for i := range 100 {
		if _, err := cl.Publish(ctx, "orders", nil, []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := cl.Subscribe(ctx, "orders", client.AtOffset(60), client.Shard(0))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	want := uint64(60)
	for rec, err := range sub.Records(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		if rec.Offset != want || string(rec.Value) != fmt.Sprint(want) {
			t.Fatalf("got offset %d %q, want %d", rec.Offset, rec.Value, want)
		}
		if want++; want == 100 {
			break
		}
	}
}

// TestSlowSubscriberDoesNotSlowOthers: a subscriber that stops consuming
// holds back neither the publisher nor a fast subscriber.
func TestSlowSubscriberDoesNotSlowOthers(t *testing.T) {
	ctx := testCtx(t)
	c := clustertest.Start(t, 1)
	cl := clustertest.Connect(t, c, "broker-0")
	createStream(t, ctx, cl, shardmap.StreamConfig{Name: "orders", Shards: 1})

	slow, err := clustertest.Connect(t, c, "broker-0").Subscribe(ctx, "orders", client.Earliest(), client.Credit(16))
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Stop()
	slowNext, stopSlow := iterPull(ctx, slow)
	defer stopSlow()
	if _, err := cl.Publish(ctx, "orders", nil, []byte("first")); err != nil {
		t.Fatal(err)
	}
	slowNext(t) // takes one record, then never another

	fast, err := clustertest.Connect(t, c, "broker-0").Subscribe(ctx, "orders", client.Earliest())
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Stop()

	const n = 20000
	pub, err := cl.Publisher(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var fs []*client.Future
	for i := range n {
		f, err := pub.PublishAsync(ctx, nil, make([]byte, 128))
		if err != nil {
			t.Fatalf("publish %d with a stalled subscriber: %v", i, err)
		}
		fs = append(fs, f)
	}
	for _, f := range fs {
		if _, err := f.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	got := 0
	for _, err := range fast.Records(ctx) {
		if err != nil {
			t.Fatalf("fast subscriber after %d records: %v", got, err)
		}
		if got++; got == n+1 {
			break
		}
	}
	if next := slow.Next()[0]; next > 1 {
		t.Fatalf("the stalled subscriber was delivered up to offset %d", next)
	}
}

// TestBrokerKillLosesNoAckedRecord: kill -9 the owner while a publisher
// pipelines into it; every acked record is read back after restart, every
// other record failed with an error saying its outcome is unknown, and a
// subscriber that stayed attached resumes with no gap and no duplicate.
func TestBrokerKillLosesNoAckedRecord(t *testing.T) {
	for _, forwarded := range []bool{false, true} {
		t.Run(fmt.Sprintf("forwarded=%v", forwarded), func(t *testing.T) {
			ctx := testCtx(t)
			c := clustertest.Start(t, 2)
			admin := clustertest.Connect(t, c, "broker-0")
			m := createStream(t, ctx, admin, shardmap.StreamConfig{Name: "orders", Shards: 1})
			owner, other := ownerAndOther(t, c, m, "orders")
			via := owner
			if forwarded {
				via = other
			}
			cl := clustertest.Connect(t, c, via)
			sub, err := clustertest.Connect(t, c, other).Subscribe(ctx, "orders", client.Earliest())
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Stop()

			pub, err := cl.Publisher(ctx, "orders")
			if err != nil {
				t.Fatal(err)
			}
			type sent struct {
				value string
				f     *client.Future
			}
			var all []sent
			killed := false
			for i := 0; i < 20000; i++ {
				v := fmt.Sprintf("r%05d", i)
				f, err := pub.PublishAsync(ctx, nil, []byte(v))
				if err != nil {
					break // the connection is gone: nothing more goes out
				}
				all = append(all, sent{v, f})
				if i == 3000 {
					if err := c.Kill(owner); err != nil {
						t.Fatal(err)
					}
					killed = true
				}
			}
			if !killed {
				t.Fatal("publisher stopped before the kill")
			}
			acked := map[uint64]string{} // by offset: two acks at one offset fail here
			failed := 0
			for _, s := range all {
				ack, err := s.f.Wait(ctx)
				if err != nil {
					failed++
					var perr *client.PublishError
					if !errors.As(err, &perr) {
						t.Fatalf("%s failed with %v, want a PublishError", s.value, err)
					}
					continue
				}
				if v, ok := acked[ack.Offset]; ok {
					t.Fatalf("%s and %s were both acked at offset %d", v, s.value, ack.Offset)
				}
				acked[ack.Offset] = s.value
			}
			pub.Close()
			if len(acked) == 0 || failed == 0 {
				t.Fatalf("%d acked, %d failed: the kill did not land mid-stream", len(acked), failed)
			}
			if err := c.Restart(ctx, owner); err != nil {
				t.Fatal(err)
			}

			// The subscriber attached before the kill saw every record once,
			// in offset order, through the restart.
			want := uint64(0)
			for rec, err := range sub.Records(ctx) {
				if err != nil {
					t.Fatal(err)
				}
				if rec.Offset != want {
					t.Fatalf("subscriber: offset %d, want %d (gap or duplicate across the restart)", rec.Offset, want)
				}
				if v, ok := acked[rec.Offset]; ok && v != string(rec.Value) {
					t.Fatalf("offset %d holds %q, but %q was acked there", rec.Offset, rec.Value, v)
				}
				delete(acked, rec.Offset)
				want++
				if len(acked) == 0 {
					break
				}
			}
			if len(acked) != 0 {
				t.Fatalf("%d acked records missing after restart", len(acked))
			}
		})
	}
}

// TestBrokerRestartRejoinsAndCtlRestartKeepsStreams: a restarted broker
// re-registers and gets the map; a restarted control plane keeps the
// streams, and the brokers come back to it on their own.
func TestBrokerRestartRejoinsAndCtlRestartKeepsStreams(t *testing.T) {
	ctx := testCtx(t)
	c := clustertest.Start(t, 3)
	admin := clustertest.Connect(t, c, "broker-0")
	before := createStream(t, ctx, admin, shardmap.StreamConfig{Name: "orders", Shards: 6})

	if err := c.Stop("broker-2"); err != nil {
		t.Fatal(err)
	}
	down, err := c.WaitMap(ctx, func(m *shardmap.Map) bool {
		n, _ := m.Node("broker-2")
		return !n.Live
	})
	if err != nil {
		t.Fatal(err)
	}
	if moves := shardmap.Diff(before, down); len(moves) != 0 {
		t.Fatalf("a broker going down moved shards: %v", moves)
	}
	if err := c.Restart(ctx, "broker-2"); err != nil {
		t.Fatal(err)
	}
	m, err := clustertest.Connect(t, c, "broker-2").Map(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Stream("orders"); !ok || m.Epoch <= down.Epoch {
		t.Fatalf("restarted broker holds epoch %d (down at %d), streams %v", m.Epoch, down.Epoch, m.Streams)
	}

	if err := c.RestartCtl(); err != nil {
		t.Fatal(err)
	}
	after, err := c.WaitLive(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if after.Epoch <= m.Epoch {
		t.Fatalf("epoch went from %d to %d across a control plane restart", m.Epoch, after.Epoch)
	}
	if moves := shardmap.Diff(before, after); len(moves) != 0 {
		t.Fatalf("control plane restart moved shards: %v", moves)
	}
	if _, err := admin.Publish(ctx, "orders", []byte("k"), []byte("after ctl restart")); err != nil {
		t.Fatal(err)
	}
}
