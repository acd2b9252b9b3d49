package broker

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// idemPublisher starts one broker with stream (one shard) and connects
// an idempotent SDK publisher of stream to it; ctx bounds the test.
func idemPublisher(t *testing.T, stream string) (b *Broker, pub *client.Publisher, ctx context.Context) {
	t.Helper()
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: stream, Shards: 1})
	b = ip.brokers[0]
	caFile := filepath.Join(ip.dir, "certs", "ca.crt")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	c, err := client.Connect(ctx, b.Addr().String(), client.WithCAFile(caFile), adminCert(caFile), client.WithLogger(quiet()),
		client.WithIdempotence(), client.WithReconnect(5*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	pub, err = c.Publisher(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return b, pub, ctx
}

// countIn returns how often each value is in shard 0 of stream on b, and
// how many are there more than once.
func countIn(t *testing.T, b *Broker, stream string) (map[string]int, int) {
	t.Helper()
	seen, dups := map[string]int{}, 0
	for _, v := range readAll(t, b, stream, 0) {
		if seen[v]++; seen[v] == 2 {
			dups++
		}
	}
	return seen, dups
}

// TestIdempotentFirstRecordRefused: a publisher's first record on a shard
// is refused for good (too many headers) while its second is on the wire.
// The owner did not know the producer, accepted the second as its first
// whatever its sequence, and the SDK, which renumbers what follows a
// refusal under a new producer id, sent it again: it was written twice.
// Now a producer not known starts at sequence 1 (unknown_producer
// otherwise), and the second record is written once.
func TestIdempotentFirstRecordRefused(t *testing.T) {
	b, pub, ctx := idemPublisher(t, "rf")
	many := map[string]string{}
	for i := range DefaultMaxHeaders + 1 {
		many[fmt.Sprint("h", i)] = "x"
	}
	fa, err := pub.PublishAsync(ctx, []byte("k"), []byte("A"), client.WithShard(0), client.WithHeaders(many))
	if err != nil {
		t.Fatal(err)
	}
	fb, err := pub.PublishAsync(ctx, []byte("k"), []byte("B"), client.WithShard(0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fa.Wait(ctx); err == nil {
		t.Fatal("a record with too many headers was acked")
	}
	if _, err := fb.Wait(ctx); err != nil {
		t.Fatalf("the record after it: %v", err)
	}
	if seen, _ := countIn(t, b, "rf"); seen["B"] != 1 || seen["A"] != 0 {
		t.Fatalf("log holds A %d times and B %d times, want 0 and 1", seen["A"], seen["B"])
	}
}

// TestIdempotentUnencodableRecord: a record the SDK cannot encode (over
// its frame limit) gives its sequence back. It once stayed noted as a
// refusal, and at the next lost connection every unresolved record of
// its producer was renumbered, those committed whose ack was lost too,
// and written again (dozens of 2,000).
func TestIdempotentUnencodableRecord(t *testing.T) {
	b, pub, ctx := idemPublisher(t, "lr")
	if _, err := pub.Publish(ctx, []byte("k"), make([]byte, 8<<20), client.WithShard(0)); err == nil {
		t.Fatal("an 8 MiB record was acked")
	}
	const n = 2000
	fs := make([]*client.Future, n)
	for i := range n {
		if i == n/2 {
			dropClientConns(b) // what is in flight now is of unknown outcome
		}
		f, err := pub.PublishAsync(ctx, []byte("k"), []byte(fmt.Sprint(i)), client.WithShard(0))
		if err != nil {
			t.Fatal(err)
		}
		fs[i] = f
	}
	for i, f := range fs {
		if _, err := f.Wait(ctx); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	if seen, dups := countIn(t, b, "lr"); dups > 0 || len(seen) != n {
		t.Fatalf("%d records in the log twice, %d distinct of %d published", dups, len(seen), n)
	}
}

// TestProducerIDBounded: a producer id longer than MaxProducerIDLen is
// refused: the table keeps every id it knows, and ids of up to a record's
// size (1 MiB) let one client make a shard's table hold gigabytes.
func TestProducerIDBounded(t *testing.T) {
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "long", Shards: 1})
	ws := openStream(t, ip.dial(ip.brokers[0]))
	wantCode(t, ws.roundTrip(idem(1, "long", strings.Repeat("p", transport.MaxProducerIDLen+1), 1, "v")), 1, transport.CodeInvalid)
	wantAck(t, ws.roundTrip(idem(2, "long", strings.Repeat("p", transport.MaxProducerIDLen), 1, "v")), 2)
}

// TestProducerStateSkipsWhatDoesNotFit: a producer whose entry does not
// fit what is left of a snapshot's budget is skipped, not the end of it:
// a few long ids, the most recently used, once crowded every other
// producer out, and a replica rejoined by that snapshot wrote their
// retries again once it led.
func TestProducerStateSkipsWhatDoesNotFit(t *testing.T) {
	lim := producerLimits{max: 100, expiry: time.Hour, window: 8}
	leader := newProducerTable("s/0", lim, nil)
	commit := func(id string, off uint64) {
		a := leader.admit(id, 1)
		leader.enqueued(a.p)
		leader.committed(a.p, 1, off, time.Now().UnixNano(), nil)
	}
	commit("legit", 0)
	commit(strings.Repeat("h", 600), 1) // the most recently used, and too long for what is left
	state := leader.snapshotState(400)
	follower := newProducerTable("s/0", lim, nil)
	if err := follower.restoreState(state); err != nil {
		t.Fatal(err)
	}
	if a := follower.admit("legit", 1); a.kind != admitDuplicate {
		t.Fatalf("after the snapshot, legit's committed sequence 1: %v, want admitDuplicate", a.kind)
	}
}

// TestProducerIDsKeptPerPrincipal: a principal publishing under another
// principal's producer id (which subscribers see on its records) is a
// producer of its own: the other's next record is written and acked as
// such, not answered as a duplicate of the impostor's (it was, and never
// written). Subscribers see the id each gave.
func TestProducerIDsKeptPerPrincipal(t *testing.T) {
	ip := startInprocWith(t, nil, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	for _, who := range []string{"alice", "mallory"} {
		for _, a := range []auth.Action{auth.Publish, auth.Subscribe} {
			if err := ip.ctl.Grant(auth.Grant{Principal: who, Action: a, Pattern: "orders"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	ip.waitEpoch(ip.ctl.Map().Epoch)
	b := ip.brokers[0]
	alice, mallory := openStream(t, ip.dialAs(b, "alice")), openStream(t, ip.dialAs(b, "mallory"))
	wantAck(t, alice.roundTrip(idem(1, "orders", "x", 1, "alice-1")), 1)
	wantAck(t, mallory.roundTrip(idem(1, "orders", "x", 1, "mallory-1")), 1)
	wantAck(t, mallory.roundTrip(idem(2, "orders", "x", 2, "mallory-2")), 2)
	if ack := wantAck(t, alice.roundTrip(idem(2, "orders", "x", 2, "alice-2")), 2); ack.Duplicate {
		t.Fatalf("alice's second record answered as a duplicate of mallory's: %+v", ack)
	}
	sub := openStream(t, ip.dialAs(b, "alice"))
	sub.send(&transport.Subscribe{Stream: "orders", Start: transport.StartEarliest, Credit: 10})
	var got []string
	for len(got) < 4 {
		recs, ok := sub.recv().(*transport.Records)
		if !ok {
			t.Fatalf("subscription got %T", recs)
		}
		for _, r := range recs.Records {
			got = append(got, fmt.Sprintf("%s %s/%d", r.Value, r.ProducerID, r.ProducerSeq))
		}
	}
	if want := []string{"alice-1 x/1", "mallory-1 x/1", "mallory-2 x/2", "alice-2 x/2"}; !slices.Equal(got, want) {
		t.Fatalf("the log holds %q, want %q", got, want)
	}
}
