package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// publishBacklog publishes n records of size bytes of value, each with
// headers, to shard 0 of stream on b, pipelined, and waits for their acks.
func publishBacklog(t *testing.T, ip *inproc, b *Broker, stream string, n, size int, headers map[string]string) {
	t.Helper()
	pub := openStream(t, ip.dial(b))
	w := transport.NewWriter(pub.s)
	for i := range n {
		if err := w.Buffer(&transport.Publish{Seq: uint64(i), Stream: stream, Shard: 0, Value: make([]byte, size), Headers: headers}); err != nil {
			t.Fatal(err)
		}
		if i%64 == 63 || i == n-1 {
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range n {
		wantAck(t, pub.recv(), uint64(i))
	}
}

// TestRecordsFramesFitTheFrameLimit: with SubscriptionBytes at the frame
// limit (4 MiB), 512 records of 8 KiB are that many bytes of values, and
// their encoding more: the broker sends them in frames within the limit,
// every record once, in order. It used to fail the frame's encoding and
// close the stream with no frame at all, so a subscriber got neither a
// record nor an error, and met the same frame again when it reattached.
// SubscriptionBytes is now at most what leaves room for the framing of
// 512 records; records with many headers (whose framing is more) are cut
// from a frame that would go over, and sent in the next.
func TestRecordsFramesFitTheFrameLimit(t *testing.T) {
	headers := map[string]string{}
	for i := range DefaultMaxHeaders {
		headers[string(rune('0'+i))] = ""
	}
	for _, tc := range []struct {
		name    string
		size    int
		headers map[string]string
	}{
		{"small records", 8 << 10, nil},
		// 512 of them are within SubscriptionBytes, and their framing
		// (with 2 bytes per header) takes them over the limit.
		{"many headers", 8<<10 - 128, headers},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ip := startInprocWith(t, func(c *Config) { c.SubscriptionBytes = transport.DefaultMaxFrame }, 1,
				shardmap.StreamConfig{Name: "orders", Shards: 1})
			b := ip.brokers[0]
			const n = 520
			publishBacklog(t, ip, b, "orders", n, tc.size, tc.headers)

			sub := openStream(t, ip.dial(b)) // reads frames of up to DefaultMaxFrame, as the SDK
			sub.send(&transport.Subscribe{Stream: "orders", Shard: 0, Start: transport.StartEarliest, Credit: 1000})
			frames := 0
			for next := uint64(0); next < n; {
				f, err := sub.r.Read()
				if err != nil {
					t.Fatalf("after %d records in %d frames the subscription ended: %v", next, frames, err)
				}
				recs, ok := f.(*transport.Records)
				if !ok {
					t.Fatalf("after %d records: got %T %+v, want records", next, f, f)
				}
				frames++
				for _, r := range recs.Records {
					if r.Offset != next || len(r.Value) != tc.size || len(r.Headers) != len(tc.headers) {
						t.Fatalf("record at offset %d (%d bytes, %d headers), want offset %d", r.Offset, len(r.Value), len(r.Headers), next)
					}
					next++
				}
			}
			t.Logf("%d records of %d bytes in %d frames", n, tc.size, frames)
		})
	}
}

// TestRecordsFramesFitTheFrameLimitSDK: the same, through the SDK.
func TestRecordsFramesFitTheFrameLimitSDK(t *testing.T) {
	ip := startInprocWith(t, func(c *Config) { c.SubscriptionBytes = transport.DefaultMaxFrame }, 1,
		shardmap.StreamConfig{Name: "orders", Shards: 1})
	const n, size = 520, 8 << 10
	publishBacklog(t, ip, ip.brokers[0], "orders", n, size, nil)
	c := ip.sdk(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub, err := c.Subscribe(ctx, "orders", client.Earliest())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	next := uint64(0)
	for r, err := range sub.Records(rctx) {
		if err != nil {
			t.Fatalf("after %d records of a backlog of %d: %v", next, n, err)
		}
		if r.Offset != next {
			t.Fatalf("record at offset %d, want %d", r.Offset, next)
		}
		if next++; next == n {
			return
		}
	}
	t.Fatalf("the subscription ended after %d records of %d", next, n)
}

// TestRecordOverTheFrameLimitEndsTheSubscription: a record stored while
// MaxPayload was larger than the broker's frame limit is now cannot be
// sent. The subscription gets every record before it, then
// payload_too_large naming its offset (From and To), and the SDK ends
// the subscription with that error rather than reattach to meet it
// again. Subscribing past it goes on.
func TestRecordOverTheFrameLimitEndsTheSubscription(t *testing.T) {
	const large = 5 << 20 // over DefaultMaxFrame, the least frame limit of a broker
	ip := startInprocWith(t, func(c *Config) { c.MaxPayload = 6 << 20 }, 1,
		shardmap.StreamConfig{Name: "orders", Shards: 1})
	b := ip.brokers[0]
	pub := openStream(t, ip.dial(b))
	pub.w.SetMaxFrame(8 << 20)
	for i, size := range []int{10, large, 10} {
		pub.send(&transport.Publish{Seq: uint64(i), Stream: "orders", Shard: 0, Value: make([]byte, size)})
		wantAck(t, pub.recv(), uint64(i))
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	ip.tweak = nil // MaxPayload back to 1 MiB: the frame limit is 4 MiB
	b = ip.startBroker(0)
	ip.brokers[0] = b

	sub := openStream(t, ip.dial(b))
	sub.send(&transport.Subscribe{Stream: "orders", Start: transport.StartEarliest, Credit: 10})
	if recs, ok := sub.recv().(*transport.Records); !ok || len(recs.Records) != 1 || recs.Records[0].Offset != 0 {
		t.Fatalf("first frame %+v, want the record at offset 0", recs)
	}
	e := wantError(t, sub.recv(), transport.ErrPayloadTooLarge)
	if e.From != 1 || e.To != 1 {
		t.Fatalf("error %+v, want From and To 1 (the record's offset)", e)
	}
	t.Log(e)
	sub.recvEnd()

	sub = openStream(t, ip.dial(b))
	sub.send(&transport.Subscribe{Stream: "orders", Start: transport.StartOffset, Offset: 2, Credit: 10})
	if recs, ok := sub.recv().(*transport.Records); !ok || len(recs.Records) != 1 || recs.Records[0].Offset != 2 {
		t.Fatalf("subscribed at 2: %+v, want the record at offset 2", recs)
	}

	c := ip.sdk(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.Subscribe(ctx, "orders", client.Earliest())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	var got []uint64
	for r, err := range s.Records(ctx) {
		if err != nil {
			var berr *client.BrokerError
			if !errors.Is(err, client.ErrPayloadTooLarge) || !errors.As(err, &berr) || berr.From != 1 {
				t.Fatalf("the SDK's subscription ended with %v, want payload_too_large at offset 1", err)
			}
			break
		}
		got = append(got, r.Offset)
	}
	if len(got) != 1 || got[0] != 0 {
		t.Fatalf("the SDK delivered offsets %v, want [0]", got)
	}
	if s.Err() == nil {
		t.Fatal("the SDK's subscription has no error")
	}
}

// TestHalfClosedSubscriberGetsItsCredit: a subscriber that closes its
// send side (it will grant no more credit) is still sent the records its
// credit covers, replayed and live, and then the stream ends cleanly.
// The broker used to take the end of the subscriber's side for the
// subscriber gone, and end the subscription at once.
func TestHalfClosedSubscriberGetsItsCredit(t *testing.T) {
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	b := ip.brokers[0]
	pub := openStream(t, ip.dial(b))
	for i := range 5 {
		wantAck(t, pub.roundTrip(publish(uint64(i), "orders", fmt.Sprint(i))), uint64(i))
	}
	sub := openStream(t, ip.dial(b))
	sub.send(&transport.Subscribe{Stream: "orders", Start: transport.StartEarliest, Credit: 10})
	sub.s.Close() // FIN: no Credit frame will follow
	next := uint64(0)
	read := func(until uint64) {
		t.Helper()
		for next < until {
			f, err := sub.r.Read()
			if err != nil {
				t.Fatalf("half-closed with credit 10, the subscription ended after %d records: %v", next, err)
			}
			recs, ok := f.(*transport.Records)
			if !ok {
				t.Fatalf("got %T %+v, want records", f, f)
			}
			for _, r := range recs.Records {
				if r.Offset != next {
					t.Fatalf("record at offset %d, want %d", r.Offset, next)
				}
				next++
			}
		}
	}
	read(5)
	for i := 5; i < 12; i++ {
		wantAck(t, pub.roundTrip(publish(uint64(i), "orders", fmt.Sprint(i))), uint64(i))
	}
	read(10)
	if next != 10 {
		t.Fatalf("credit 10, got %d records", next)
	}
	if f, err := sub.r.Read(); !errors.Is(err, io.EOF) {
		t.Fatalf("credit spent and none to come: got %T %+v, %v, want the stream's clean end", f, f, err)
	}
}

// TestHalfClosedSubscriberGone: a half-closed subscriber whose
// connection closes while the broker waits for records to send it is
// gone: its subscription ends then, not at the next record.
func TestHalfClosedSubscriberGone(t *testing.T) {
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	b := ip.brokers[0]
	conn := ip.dial(b)
	sub := openStream(t, conn)
	sub.send(&transport.Subscribe{Stream: "orders", Start: transport.StartLatest, Credit: 10})
	sub.s.Close()
	subscribed := func() bool { return len(b.subs.lag()) > 0 }
	waitUntil(t, "the subscription to start", subscribed)
	conn.CloseWithError(0, "")
	waitUntil(t, "the subscription of a closed connection to end", func() bool { return !subscribed() })
}

// TestSubscriberLeavesLeaderlessReplica: a subscription waiting at a
// follower's end whose group loses its other two replicas (the follower
// then knows no leader, as one cut off from its group does while the
// others may commit without it) is ended unavailable after two of its
// once-a-second checks find no leader, so the SDK tries another replica.
func TestSubscriberLeavesLeaderlessReplica(t *testing.T) {
	ip := startInprocWith(t, fastRaft, 3, shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	leader := waitOwnerLeads(t, ip, ip.brokers, id)
	if _, ok := publishVia(t, ip, leader, "r3", 0, 1, "v0").(*transport.Ack); !ok {
		t.Fatal("the first record was not acked")
	}
	follower := ip.brokers[slices.IndexFunc(ip.brokers, func(b *Broker) bool { return b != leader })]
	ws := openStream(t, ip.dial(follower))
	ws.send(&transport.Subscribe{Stream: "r3", Shard: 0, Start: transport.StartEarliest, Credit: 100})
	if r, ok := ws.recv().(*transport.Records); !ok || len(r.Records) != 1 {
		t.Fatalf("the follower served %T %+v, want the first record", r, r)
	}
	for _, b := range slices.Clone(ip.brokers) {
		if b != follower {
			ip.closeBroker(t, b)
		}
	}
	f := ws.recv()
	if e, ok := f.(*transport.Error); !ok || e.Code != transport.CodeUnavailable {
		t.Fatalf("the subscription at a replica with no leader: %T %+v, want unavailable", f, f)
	}
	t.Logf("ended: %v", f)
}

// TestIdleSubscriptionHoldsItsPositionOnly: a subscription that was sent
// a frame of about 190 KiB and then granted no more credit kept the
// frame's encoding buffer (transport.Writer keeps up to 256 KiB) and its
// credit reader a 16 KiB read buffer, none of it charged to
// SubscriptionBytesPerPrincipal: 273 KB each. Idle, it holds its
// position, its stream and its two goroutines: about 18 KB with the
// client's side of the stream (the package doc's "Limits").
func TestIdleSubscriptionHoldsItsPositionOnly(t *testing.T) {
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	b := ip.brokers[0]
	const recs, size = 64, 3 << 10
	publishBacklog(t, ip, b, "orders", recs, size, nil)
	conn := ip.dial(b)
	const subs = 64
	before := heapInUse()
	var keep []*quic.Stream
	for range subs {
		ws := openStream(t, conn)
		ws.send(&transport.Subscribe{Stream: "orders", Shard: 0, Start: transport.StartEarliest, Credit: recs})
		got := 0
		for got < recs {
			f := ws.recv()
			r, ok := f.(*transport.Records)
			if !ok {
				t.Fatalf("got %T %+v", f, f)
			}
			got += len(r.Records)
		}
		keep = append(keep, ws.s) // the client side keeps the stream only
	}
	time.Sleep(500 * time.Millisecond) // acks in, the subscriptions idle at the end
	after := heapInUse()
	per := (int64(after) - int64(before)) / subs
	t.Logf("%d idle subscriptions: heap %d -> %d, %d bytes each (client side included); goroutines %d",
		subs, before, after, per, runtime.NumGoroutine())
	if per > 32<<10 {
		t.Errorf("an idle subscription holds about %d bytes of heap, over 32 KiB: more than its position, stream and goroutines", per)
	}
	runtime.KeepAlive(keep)
}

// TestSubscriptionOfDeletedStreamEndsUnknownStream: a subscription
// waiting at the end of a shard whose stream is deleted ends with
// unknown_stream (transport.ErrUnknownStream: "no such stream"), as a
// new subscription to it is refused; it got shutting_down, the code of
// a broker going away, from a broker that stays.
func TestSubscriptionOfDeletedStreamEndsUnknownStream(t *testing.T) {
	for _, replicas := range []int{1, 3} {
		t.Run(fmt.Sprint("replicas=", replicas), func(t *testing.T) {
			ip := startInproc(t, 3, shardmap.StreamConfig{Name: "orders", Shards: 1, Replicas: replicas})
			b := ip.owner("orders", 0)
			ws := openStream(t, ip.dial(b))
			ws.send(&transport.Subscribe{Stream: "orders", Shard: 0, Start: transport.StartEarliest, Credit: 10,
				Created: b.Map().Streams[0].Created})
			waitUntil(t, "the subscription to start", func() bool { return len(b.subs.lag()) > 0 })
			if err := ip.ctl.DeleteStream("orders"); err != nil {
				t.Fatal(err)
			}
			f := ws.recv()
			werr, ok := f.(*transport.Error)
			if !ok || werr.Code != transport.CodeUnknownStream {
				t.Fatalf("the stream was deleted under the subscription: got %T %+v, want unknown_stream", f, f)
			}
		})
	}
}

// TestSubscriptionGoroutinesEnd: subscriptions blocked writing to a
// subscriber that does not read, or waiting for records, or for credit,
// end when the subscriber's connection goes; and the broker's Close ends
// those of a connection still open.
func TestSubscriptionGoroutinesEnd(t *testing.T) {
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	b := ip.brokers[0]
	publishBacklog(t, ip, b, "orders", 512, 8<<10, nil)
	base := runtime.NumGoroutine()
	open := func(conn *quic.Conn) {
		for i := range 30 {
			ws := openStream(t, conn)
			start, credit := transport.StartEarliest, uint32(65536) // blocked in Flush
			switch i % 3 {
			case 1:
				start = transport.StartLatest // waiting for records
			case 2:
				credit = 0 // waiting for credit
			}
			ws.send(&transport.Subscribe{Stream: "orders", Shard: 0, Start: start, Credit: credit})
		}
	}
	conn := ip.dial(b)
	open(conn)
	waitUntil(t, "the subscriptions to start", func() bool { return nSubs(b) >= 30 })
	t.Logf("goroutines: %d before, %d with 30 subscriptions", base, runtime.NumGoroutine())
	conn.CloseWithError(0, "")
	waitUntil(t, "the subscriptions of a closed connection to end", func() bool { return nSubs(b) == 0 })
	conn = ip.dial(b)
	open(conn)
	waitUntil(t, "the subscriptions to start", func() bool { return nSubs(b) >= 30 })
	done := make(chan struct{})
	go func() { b.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not return with subscriptions open")
	}
}

func nSubs(b *Broker) int {
	b.subs.mu.Lock()
	defer b.subs.mu.Unlock()
	return len(b.subs.subs)
}
