package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// collect takes n records from sub, failing the test on an error.
func collect(t *testing.T, sub *Subscription, n int) []Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []Record
	if n == 0 {
		return nil
	}
	for rec, err := range sub.Records(ctx) {
		if err != nil {
			t.Fatalf("after %d records: %v", len(out), err)
		}
		out = append(out, rec)
		if len(out) == n {
			break
		}
	}
	if len(out) != n {
		t.Fatalf("got %d records, want %d", len(out), n)
	}
	return out
}

func publishN(t *testing.T, c *Client, stream string, shard, from, n int) {
	t.Helper()
	ctx := testCtx(t)
	var futs []*Future
	for i := from; i < from+n; i++ {
		f, err := c.PublishAsync(ctx, stream, nil, []byte(fmt.Sprint(i)), WithShard(shard))
		if err != nil {
			t.Fatal(err)
		}
		futs = append(futs, f)
	}
	for _, f := range futs {
		if _, err := f.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSubscribeResumesAfterBrokerRestart(t *testing.T) {
	fc, c, ctx := withStream(t)
	b := fc.brokers[0]
	publishN(t, c, "s", 0, 0, 50)
	// A small credit makes the broker wait for grants, so records are
	// buffered on both sides when the broker dies.
	sub, err := c.Subscribe(ctx, "s", Earliest(), Credit(8))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	got := collect(t, sub, 20)
	b.restart(t)
	// Publishes sent before the client sees the connection die would fail
	// as outcome-unknown (TestConnectionLostFailsInFlight); wait for it.
	for c.homeConn().current() != nil {
		time.Sleep(time.Millisecond)
	}
	publishN(t, c, "s", 0, 50, 50)
	got = append(got, collect(t, sub, 80)...)
	for i, r := range got {
		if r.Offset != uint64(i) || string(r.Value) != fmt.Sprint(i) || r.Stream != "s" || r.Shard != 0 {
			t.Fatalf("record %d: %+v (gap or duplicate)", i, r)
		}
	}
	if b.subs.Load() < 2 {
		t.Fatalf("subscription did not reattach (%d subscribes)", b.subs.Load())
	}
	if next := sub.Next(); next[0] != 100 {
		t.Fatalf("Next = %v, want shard 0 at 100", next)
	}
	// Nothing more arrives: no duplicate was buffered.
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	for rec, err := range sub.Records(short) {
		if err == nil {
			t.Fatalf("extra record %+v", rec)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
	}
}

func TestSubscribeFollowsNotOwner(t *testing.T) {
	fc := newFakeCluster(t, 2)
	if err := fc.createStream(shardmap.StreamConfig{Name: "r", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	// The client's first map is stale: it says broker-0 owns shard 1.
	m := fc.currentMap()
	st, _ := m.Stream("r")
	stale := &shardmap.Map{Epoch: m.Epoch - 1, Nodes: m.Nodes,
		Streams: []shardmap.Stream{{StreamConfig: st.StreamConfig, Placement: shardmap.NewPlacement("broker-0", "broker-0")}}}
	fc.stale.Store(stale)
	fc.staleGets.Store(1)

	c := connect(t, fc, 0)
	ctx := testCtx(t)
	sub, err := c.Subscribe(ctx, "r", Earliest(), Shard(1))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	publishN(t, c, "r", 1, 0, 5)
	got := collect(t, sub, 5)
	for i, r := range got {
		if r.Offset != uint64(i) || r.Shard != 1 {
			t.Fatalf("record %d: %+v", i, r)
		}
	}
	if fc.brokers[0].subs.Load() == 0 || fc.brokers[1].subs.Load() == 0 {
		t.Fatalf("want a refused subscribe on broker-0 and one on broker-1, got %d and %d",
			fc.brokers[0].subs.Load(), fc.brokers[1].subs.Load())
	}
	if cm := c.cachedMap(); cm.Epoch != m.Epoch {
		t.Fatalf("map not refreshed: epoch %d", cm.Epoch)
	}
}

// TestSubscribeOutOfRangeOnOneReplica: replicas of a shard retain from
// different offsets; a subscription at an offset one replica no longer
// holds goes on at another that does, and ends out of range only when no
// replica holds it.
func TestSubscribeOutOfRangeOnOneReplica(t *testing.T) {
	fc := newFakeCluster(t, 3)
	if err := fc.createStream(shardmap.StreamConfig{Name: "r", Shards: 1, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	publishN(t, c, "r", 0, 0, 5)
	st, _ := fc.currentMap().Stream("r")
	first := st.Placement.Replicas(0)[0]
	for _, b := range fc.brokers {
		if b.id == first {
			b.firstOffset.Store(3) // it compacted further than the others
		}
	}
	sub, err := c.Subscribe(ctx, "r", AtOffset(1))
	if err != nil {
		t.Fatal(err)
	}
	got := collect(t, sub, 4)
	sub.Stop()
	for i, r := range got {
		if r.Offset != uint64(i+1) {
			t.Fatalf("record %d at offset %d, want %d", i, r.Offset, i+1)
		}
	}

	for _, b := range fc.brokers {
		b.firstOffset.Store(3)
	}
	sub, err = c.Subscribe(ctx, "r", AtOffset(1))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	select {
	case <-sub.Closed():
	case <-ctx.Done():
		t.Fatal("the subscription did not end though no replica holds offset 1")
	}
	if err := sub.Err(); !errors.Is(err, transport.ErrOutOfRange) {
		t.Fatalf("no replica holds offset 1: %v, want out of range", err)
	}
}

func TestSubscribeAllShardsMerged(t *testing.T) {
	fc := newFakeCluster(t, 2)
	c := connect(t, fc, 1)
	ctx := testCtx(t)
	const shards, n = 4, 400
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "m", Shards: shards}); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, "m", Earliest(), Credit(16))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	var futs []*Future
	for i := range n {
		f, err := c.PublishAsync(ctx, "m", []byte(fmt.Sprint("key-", i)), []byte(fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		futs = append(futs, f)
	}
	want := map[int]int{}
	for _, f := range futs {
		ack, err := f.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want[ack.Shard]++
	}
	got := collect(t, sub, n)
	next := map[int]uint64{}
	for _, r := range got {
		if r.Offset != next[r.Shard] {
			t.Fatalf("shard %d: offset %d, want %d", r.Shard, r.Offset, next[r.Shard])
		}
		next[r.Shard]++
	}
	for s := range shards {
		if int(next[s]) != want[s] {
			t.Fatalf("shard %d: %d records, want %d", s, next[s], want[s])
		}
	}
	if len(want) < 2 {
		t.Fatalf("keys all hashed to one shard: %v", want)
	}
	if subNext := sub.Next(); len(subNext) != len(want) {
		t.Fatalf("Next = %v", subNext)
	}
}

func TestSubscribeResumeWithAtOffsets(t *testing.T) {
	fc := newFakeCluster(t, 1)
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "s", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	publishN(t, c, "s", 0, 0, 10)
	publishN(t, c, "s", 1, 0, 10)

	sub, err := c.Subscribe(ctx, "s", AtOffset(3), Shard(1))
	if err != nil {
		t.Fatal(err)
	}
	if next := sub.Next(); next[1] != 3 {
		t.Fatalf("Next before delivery = %v", next)
	}
	got := collect(t, sub, 2)
	if got[0].Offset != 3 || got[1].Offset != 4 {
		t.Fatalf("AtOffset(3): %+v", got)
	}
	next := sub.Next()
	sub.Stop()
	if err := sub.Err(); err != nil {
		t.Fatalf("Err after Stop = %v", err)
	}

	sub2, err := c.Subscribe(ctx, "s", AtOffsets(next)) // shard 0 absent: earliest
	if err != nil {
		t.Fatal(err)
	}
	defer sub2.Stop()
	got = collect(t, sub2, 15)
	counts := map[int]int{}
	for _, r := range got {
		counts[r.Shard]++
		if r.Shard == 1 && r.Offset < 5 {
			t.Fatalf("shard 1 resumed at %d, want 5", r.Offset)
		}
	}
	if counts[0] != 10 || counts[1] != 5 {
		t.Fatalf("per shard: %v", counts)
	}

	if _, err := c.Subscribe(ctx, "s", AtOffset(1)); err == nil {
		t.Fatal("AtOffset on two shards without Shard: want an error")
	}
	if _, err := c.Subscribe(ctx, "s", Earliest(), Shard(2)); !errors.Is(err, shardmap.ErrNoShard) {
		t.Fatalf("Shard(2) of 2: %v", err)
	}
	if _, err := c.Subscribe(ctx, "nope", Earliest()); !errors.Is(err, transport.ErrUnknownStream) {
		t.Fatalf("unknown stream: %v", err)
	}
}

func TestSubscribeStopInsideLoop(t *testing.T) {
	_, c, ctx := withStream(t)
	publishN(t, c, "s", 0, 0, 20)
	sub, err := c.Subscribe(ctx, "s", Earliest())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, err := range sub.Records(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		n++
		if n == 3 {
			sub.Stop()
		}
	}
	if n != 3 {
		t.Fatalf("got %d records, want the iterator to end at Stop after 3", n)
	}
	select {
	case <-sub.Closed():
	default:
		t.Fatal("Closed not closed after Stop")
	}
	if next := sub.Next(); next[0] != 3 {
		t.Fatalf("Next = %v", next)
	}
}

func TestSubscribeTerminalError(t *testing.T) {
	fc, c, ctx := withStream(t)
	publishN(t, c, "s", 0, 0, 3)
	// Offset 1000 is past the log; the fake answers nothing for it, so use
	// a shard the broker does not have to get a terminal error instead:
	// the client's map claims 2 shards, the broker knows 1.
	m := fc.currentMap()
	st, _ := m.Stream("s")
	wide := &shardmap.Map{Epoch: m.Epoch + 10, Nodes: m.Nodes,
		Streams: []shardmap.Stream{{StreamConfig: shardmap.StreamConfig{Name: "s", Shards: 2}, Placement: shardmap.NewPlacement(st.Placement.Owner(0), st.Placement.Owner(0))}}}
	c.storeMap(wide)
	sub, err := c.Subscribe(ctx, "s", Earliest(), Shard(1))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	var last error
	for _, err := range sub.Records(ctx) {
		last = err
	}
	if !errors.Is(last, transport.ErrUnknownStream) || !errors.Is(sub.Err(), transport.ErrUnknownStream) {
		t.Fatalf("want the iterator to end with ErrUnknownStream, got %v (Err %v)", last, sub.Err())
	}
	<-sub.Closed()
}

// TestSubscriptionStopWhileBrokerDoesNotRead: the iterator never writes to
// the network, so a broker that stops reading (its receive window full of
// credit frames) blocks neither the application's loop nor Stop.
func TestSubscriptionStopWhileBrokerDoesNotRead(t *testing.T) {
	// A 1 KiB receive window: a few hundred credit frames fill it.
	fc := newFakeClusterWith(t, 1, transport.Config{InitialStreamWindow: 1 << 10, MaxStreamWindow: 1 << 10})
	fc.brokers[0].stallSubs.Store(true)
	if err := fc.createStream(StreamConfig{Name: "s", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	const n = 3000
	for range n {
		fc.append(shardmap.ShardID{Stream: "s", Shard: 0}, &transport.Publish{Value: []byte("x")})
	}
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	// Credit(2): a Credit frame (a few bytes) per record delivered, unless
	// the credit writer coalesces them; the loop below waits for each to
	// be taken, so each is a frame of its own, until the window is full.
	sub, err := c.Subscribe(ctx, "s", Earliest(), Credit(2))
	if err != nil {
		t.Fatal(err)
	}
	sh := sub.shards[0]
	unsent := func() uint32 {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return sh.mu.ungranted
	}
	type result struct{ records, blockedAt int }
	got := make(chan result, 1)
	go func() { // the application
		var r result
		for _, err := range sub.Records(ctx) {
			if err != nil {
				break
			}
			r.records++
			deadline := time.Now().Add(500 * time.Millisecond)
			for unsent() != 0 && time.Now().Before(deadline) {
				time.Sleep(100 * time.Microsecond)
			}
			if unsent() != 0 { // the credit writer is stuck in a write
				r.blockedAt = r.records
				break
			}
			if r.records == n {
				break
			}
		}
		got <- r
	}()
	select {
	case r := <-got:
		if r.blockedAt == 0 {
			t.Fatalf("the broker's window never filled (%d records delivered): this tests nothing", r.records)
		}
		t.Logf("credit writes blocked after %d records", r.blockedAt)
	case <-time.After(30 * time.Second):
		t.Fatal("the application's loop blocked (on a credit write?)")
	}
	// The application goes on while the credit writer is blocked.
	more := 0
	for _, err := range sub.Records(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		if more++; more == 100 {
			break
		}
	}
	stopped := make(chan struct{})
	start := time.Now()
	go func() {
		sub.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
		t.Logf("Stop returned in %v", time.Since(start))
	case <-time.After(2 * time.Second):
		t.Fatal("Stop blocked behind a credit write the broker does not read")
	}
}

// TestCreditKeptOverReattaches: a subscriber whose buffer is full when
// its broker restarts reattaches with no credit, so the SDK never holds
// more than Credit records of a shard (it asked for one each time: one
// record more per reattach, and past the broker's MaxCredit once granted
// back).
func TestCreditKeptOverReattaches(t *testing.T) {
	fc, c, ctx := withStream(t)
	b := fc.brokers[0]
	const credit = 8
	publishN(t, c, "s", 0, 0, credit)
	sub, err := c.Subscribe(ctx, "s", Earliest(), Credit(credit))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	sh := sub.shards[0]
	buffered := func() int64 { sh.mu.Lock(); defer sh.mu.Unlock(); return sh.mu.buffered }
	for deadline := time.Now().Add(5 * time.Second); buffered() < credit; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d records buffered, want %d", buffered(), credit)
		}
	}
	total := credit
	for range 2 {
		subs := b.subs.Load()
		b.restart(t)
		for deadline := time.Now().Add(5 * time.Second); b.subs.Load() == subs || c.homeConn().current() == nil; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the subscription did not reattach")
			}
		}
		publishN(t, c, "s", 0, total, 5)
		total += 5
		time.Sleep(100 * time.Millisecond) // what the broker sends, if it may
		if got := buffered(); got > credit {
			t.Fatalf("the SDK holds %d undelivered records of one shard, more than its credit of %d", got, credit)
		}
	}
	// Every record comes, once, as credit is granted back.
	for i, r := range collect(t, sub, total) {
		if r.Offset != uint64(i) {
			t.Fatalf("record %d at offset %d (gap or duplicate)", i, r.Offset)
		}
	}
}

// TestSubscriptionEndsOnRecordsTooLargeToRead: a shard whose records are
// larger than the client reads (its MaxFrame under the brokers' record
// limit) ends the subscription with frame_too_large, saying what to
// raise: every reattachment met the same records, and it went on
// reattaching, silently, for good.
func TestSubscriptionEndsOnRecordsTooLargeToRead(t *testing.T) {
	fc, c, ctx := withStream(t)
	if _, err := c.Publish(ctx, "s", nil, bytes.Repeat([]byte("x"), 64<<10)); err != nil {
		t.Fatal(err)
	}
	small := connect(t, fc, 0, WithTransport(transport.Config{MaxFrame: 16 << 10}))
	sub, err := small.Subscribe(ctx, "s", Earliest())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	for _, err := range sub.Records(ctx) {
		if !errors.Is(err, transport.ErrFrameTooLarge) || !strings.Contains(err.Error(), "MaxFrame") {
			t.Fatalf("subscription ended with %v, want frame_too_large naming MaxFrame", err)
		}
		return
	}
	t.Fatal("the subscription ended without an error")
}

// TestSubscriptionRevokedWhileReattaching: a grant revoked while a
// subscription reattaches (its broker restarted) ends it with
// ErrUnauthorized, as a revoke ends a live one: the principal's map no
// longer shows the stream, and the broker says why (it ended with
// ErrUnknownStream, as if the stream had been deleted).
func TestSubscriptionRevokedWhileReattaching(t *testing.T) {
	fc, c, ctx := withStream(t)
	b := fc.brokers[0]
	publishN(t, c, "s", 0, 0, 3)
	sub, err := c.Subscribe(ctx, "s", Earliest())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	collect(t, sub, 3)
	fc.revoke("s")
	b.restart(t)
	for _, err := range sub.Records(ctx) {
		if !errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrUnknownStream) {
			t.Fatalf("the subscription ended with %v, want ErrUnauthorized", err)
		}
		return
	}
	t.Fatal("the subscription ended without an error")
}
