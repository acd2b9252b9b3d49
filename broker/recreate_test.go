package broker

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// recreate deletes stream and creates it again as cfg, and waits for
// every broker to have the map.
func (ip *inproc) recreate(t *testing.T, cfg shardmap.StreamConfig) {
	t.Helper()
	if err := ip.ctl.DeleteStream(cfg.Name); err != nil {
		t.Fatal(err)
	}
	if err := ip.ctl.CreateStream(cfg); err != nil {
		t.Fatal(err)
	}
	ip.waitEpoch(ip.ctl.Map().Epoch)
}

// A client whose map holds the stream as it was before it was deleted and
// created again with more shards picks a keyed idempotent record's shard
// by the old count: the broker refuses it (the record is of a stream that
// is no more), and the next goes where the new count puts its key. It was
// acked in the shard of the old count, apart from the key's other records.
func TestKeyedShardNotPickedByARecreatedStream(t *testing.T) {
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "re", Shards: 2})
	c := ip.sdk(t, client.WithIdempotence())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := c.Publish(ctx, "re", []byte("warm"), []byte("x")); err != nil {
		t.Fatal(err)
	}
	ip.recreate(t, shardmap.StreamConfig{Name: "re", Shards: 8})
	var key []byte
	for i := 0; ; i++ {
		key = []byte(fmt.Sprint("k", i))
		if shardmap.ShardFor(key, 8) != shardmap.ShardFor(key, 2) {
			break
		}
	}
	want := shardmap.ShardFor(key, 8)
	ack, err := c.Publish(ctx, "re", key, []byte("v"))
	switch {
	case errors.Is(err, client.ErrUnknownStream):
		t.Logf("first publish after the stream was created again: %v", err)
	case err != nil:
		t.Fatal(err)
	case ack.Shard != want:
		t.Fatalf("key %q acked in shard %d of the stream created again with 8 shards; want xxhash(key) mod 8 = %d (mod 2, the old count, is %d)",
			key, ack.Shard, want, shardmap.ShardFor(key, 2))
	}
	ack, err = c.Publish(ctx, "re", key, []byte("v"))
	if err != nil || ack.Shard != want {
		t.Fatalf("publish after the refusal: shard %d, %v; want shard %d", ack.Shard, err, want)
	}
}

// Keyless publishers pick their shard from the client's map. After the
// stream was deleted and created again, a broker places their records by
// its own map (any shard is right for a keyless record) and says so in
// the ack, and the client fetches the map before it picks again. Every
// publish failed, for good, with "no shard N" once the stream had fewer
// shards; later, the first publish of each failed ErrUnknownStream. Two
// brokers: records of the other's shards are placed, then forwarded.
func TestKeylessPublishersFollowARecreatedStream(t *testing.T) {
	ip := startInproc(t, 2, shardmap.StreamConfig{Name: "re", Shards: 1})
	c := ip.sdk(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var pubs []*client.Publisher
	for range 16 {
		p, err := c.Publisher(ctx, "re")
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if _, err := p.Publish(ctx, nil, []byte("warm")); err != nil {
			t.Fatal(err)
		}
		pubs = append(pubs, p)
	}
	forwarded := 0
	publishAll := func(shards int) map[int]bool {
		t.Helper()
		used := map[int]bool{}
		for i, p := range pubs {
			ack, err := p.Publish(ctx, nil, []byte("v"))
			if err != nil {
				t.Fatalf("publisher %d, publish to the stream created again with %d shards: %v", i, shards, err)
			}
			if ack.Shard >= shards {
				t.Fatalf("publisher %d: acked in shard %d of a stream of %d", i, ack.Shard, shards)
			}
			used[ack.Shard] = true
			if ack.Forwarded {
				forwarded++
			}
		}
		return used
	}
	// Grown: placed by the broker at first (the old pick, shard 0, is
	// within the new count), then picked by the client from the new
	// map, so the sixteen publishers spread over the eight shards (all
	// on one has odds of 8^-15).
	ip.recreate(t, shardmap.StreamConfig{Name: "re", Shards: 8})
	publishAll(8)
	if used := publishAll(8); len(used) < 2 {
		t.Fatalf("after the stream grew from 1 shard to 8, 16 keyless publishers used shards %v: the client did not fetch the new map", used)
	}
	// Shrunk: records picked for shards the stream no longer has.
	ip.recreate(t, shardmap.StreamConfig{Name: "re", Shards: 1})
	publishAll(1)
	publishAll(1)
	if forwarded == 0 {
		t.Fatal("no record was forwarded: the test does not cover the forward path")
	}
}

// An idempotent publisher's record is refused, not placed again, when the
// shard it picked was of a stream since created again: its sequences are
// per shard. The next one is picked from the new map.
func TestIdempotentKeylessRefusedByARecreatedStream(t *testing.T) {
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "re", Shards: 8})
	c := ip.sdk(t, client.WithIdempotence())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := c.Publish(ctx, "re", nil, []byte("warm")); err != nil {
		t.Fatal(err)
	}
	ip.recreate(t, shardmap.StreamConfig{Name: "re", Shards: 1})
	if _, err := c.Publish(ctx, "re", nil, []byte("v")); err != nil && !errors.Is(err, client.ErrUnknownStream) {
		t.Fatalf("first publish after the stream was created again: %v, want nil or ErrUnknownStream", err)
	}
	if ack, err := c.Publish(ctx, "re", nil, []byte("v")); err != nil || ack.Shard != 0 {
		t.Fatalf("publish after the refusal: shard %d, %v", ack.Shard, err)
	}
}

// A subscription detached while its stream was deleted and created again
// (its owner was down) ends when it reattaches: the new stream's offsets
// are not the old one's. It read on from its old offset, skipping the new
// stream's first records without a word.
func TestSubscriptionEndsWithItsStream(t *testing.T) {
	cfg := shardmap.StreamConfig{Name: "inc", Shards: 1}
	ip := startInproc(t, 2, cfg)
	owner, home := ip.owner("inc", 0), ip.nonOwner("inc", 0)
	ownerIdx := ip.brokerIndex(owner.NodeID())
	caFile := filepath.Join(ip.dir, "certs", "ca.crt")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.Connect(ctx, home.Addr().String(), client.WithCAFile(caFile), adminCert(caFile), client.WithLogger(quiet()),
		client.WithReconnect(5*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sub, err := c.Subscribe(ctx, "inc", client.Earliest())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	for i := range 10 {
		if _, err := c.Publish(ctx, "inc", nil, []byte(fmt.Sprint("old-", i))); err != nil {
			t.Fatal(err)
		}
	}
	recs := make(chan string, 100)
	var end error
	go func() {
		defer close(recs)
		for r, err := range sub.Records(ctx) {
			if err != nil {
				end = err
				return
			}
			recs <- fmt.Sprintf("%s@%d", r.Value, r.Offset)
		}
	}()
	for range 10 {
		<-recs
	}
	ip.closeBroker(t, owner)
	ip.recreate(t, cfg)
	ip.brokers = append(ip.brokers, ip.startBroker(ownerIdx))
	ip.waitEpoch(ip.ctl.Map().Epoch)
	for i := range 13 {
		for {
			if _, err := c.Publish(ctx, "inc", nil, []byte(fmt.Sprint("new-", i))); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	select {
	case got, ok := <-recs:
		if ok {
			t.Fatalf("after the stream was deleted and created again, the subscription read %q; want it to end as of an unknown stream", got)
		}
		if !errors.Is(end, client.ErrUnknownStream) {
			t.Fatalf("the subscription ended with %v; want ErrUnknownStream", end)
		}
		t.Log(end)
	case <-time.After(10 * time.Second):
		t.Fatal("the subscription neither ended nor read the new stream")
	}
}

// A client that names an incarnation of a stream no map will hold (an
// epoch far ahead) holds its own stream, and nothing else, for at most
// ForwardTimeout: the broker gives up catching up to it, answers
// unavailable, and the next record on the stream is served; a
// subscription naming it is refused likewise.
func TestIncarnationFromTheFutureIsBounded(t *testing.T) {
	ip := startInprocWith(t, func(c *Config) { c.ForwardTimeout = 300 * time.Millisecond }, 1,
		shardmap.StreamConfig{Name: "orders", Shards: 1})
	b := ip.brokers[0]
	ws := openStream(t, ip.dial(b))
	ws.send(&transport.Publish{Seq: 1, Stream: "orders", Shard: 0, Value: []byte("x"), Created: 1 << 60})
	if e, ok := ws.recv().(*transport.Error); !ok || e.Code != transport.CodeUnavailable {
		t.Fatalf("a record of an incarnation from the future: %+v; want unavailable", e)
	}
	wantAck(t, publishShard(ws, 2, "orders", 0, "next"), 2)
	sub := openStream(t, ip.dial(b))
	sub.send(&transport.Subscribe{Stream: "orders", Shard: 0, Credit: 8, Created: 1 << 60})
	if e, ok := sub.recv().(*transport.Error); !ok || e.Code != transport.CodeUnknownStream {
		t.Fatalf("a subscription to an incarnation from the future: %+v; want unknown_stream", e)
	}
}

// A subscription to a stream of another cluster (one built again, whose
// epochs start over: the incarnation may match) is refused as of an
// unknown stream; one naming this broker's cluster is served.
func TestSubscriptionOfAnotherClusterRefused(t *testing.T) {
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	b := ip.brokers[0]
	m := b.member.Map()
	st, _ := m.Stream("orders")
	if m.Cluster == "" {
		t.Fatal("the map names no cluster")
	}
	sub := openStream(t, ip.dial(b))
	sub.send(&transport.Subscribe{Stream: "orders", Shard: 0, Credit: 8, Created: st.Created, Epoch: m.Epoch, Cluster: "another"})
	if e, ok := sub.recv().(*transport.Error); !ok || e.Code != transport.CodeUnknownStream {
		t.Fatalf("a subscription to another cluster's stream: %+v; want unknown_stream", e)
	}
	ws := openStream(t, ip.dial(b))
	wantAck(t, publishShard(ws, 1, "orders", 0, "x"), 1)
	ok := openStream(t, ip.dial(b))
	ok.send(&transport.Subscribe{Stream: "orders", Shard: 0, Credit: 8, Created: st.Created, Epoch: m.Epoch, Cluster: m.Cluster})
	if r, isRecs := ok.recv().(*transport.Records); !isRecs || len(r.Records) != 1 {
		t.Fatalf("a subscription naming this cluster: %+v; want the record", r)
	}
}
