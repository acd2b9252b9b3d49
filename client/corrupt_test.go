package client

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// damage makes the fake owner of id serve offsets from..to as corrupt,
// like a broker whose log has those records damaged on disk.
func (fc *fakeCluster) damage(id shardmap.ShardID, from, to uint64) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if fc.mu.damaged == nil {
		fc.mu.damaged = map[shardmap.ShardID][2]uint64{}
	}
	fc.mu.damaged[id] = [2]uint64{from, to}
}

// damagedAt returns the error a real broker answers a read of id at off
// with, if off is damaged.
func (fc *fakeCluster) damagedAt(id shardmap.ShardID, off uint64) *transport.Error {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	d, ok := fc.mu.damaged[id]
	if !ok || off < d[0] || off > d[1] {
		return nil
	}
	return &transport.Error{Code: transport.CodeCorrupt, From: d[0], To: d[1],
		Message: fmt.Sprintf("%s: records at offsets %d-%d are damaged", id, d[0], d[1])}
}

// TestSubscribeCorrupt: a subscription that reaches damaged records
// delivers every record before them, then ends with a *CorruptError naming
// stream, shard and range, without retrying; resubscribing at To+1 (the
// documented way to skip) delivers the rest.
func TestSubscribeCorrupt(t *testing.T) {
	fc := newFakeCluster(t, 2)
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "s", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	publishN(t, c, "s", 0, 0, 20)
	publishN(t, c, "s", 1, 0, 30)
	fc.damage(shardmap.ShardID{Stream: "s", Shard: 1}, 10, 12)

	sub, err := c.Subscribe(ctx, "s", Earliest())
	if err != nil {
		t.Fatal(err)
	}
	got := map[int][]uint64{}
	var last error
	for rec, err := range sub.Records(ctx) {
		if err != nil {
			last = err
			break
		}
		got[rec.Shard] = append(got[rec.Shard], rec.Offset)
	}
	var cerr *CorruptError
	if !errors.As(last, &cerr) || !errors.Is(last, ErrCorrupt) || !errors.Is(last, transport.ErrCorrupt) {
		t.Fatalf("iterator ended with %v, want a *CorruptError", last)
	}
	if cerr.Stream != "s" || cerr.Shard != 1 || cerr.From != 10 || cerr.To != 12 {
		t.Fatalf("CorruptError %+v, want s/1 offsets 10-12", cerr)
	}
	if !errors.Is(sub.Err(), ErrCorrupt) {
		t.Fatalf("Err() = %v", sub.Err())
	}
	<-sub.Closed()
	if subs := fc.brokers[1].subs.Load(); subs != 1 {
		t.Fatalf("the damaged shard was subscribed %d times; a corrupt error must not be retried", subs)
	}
	if n := len(got[1]); n != 10 || got[1][n-1] != 9 {
		t.Fatalf("shard 1 delivered %v before the damage, want 0-9", got[1])
	}

	// Skip it: resume where the subscription stopped, past the damage.
	next := sub.Next()
	if next[1] != 10 {
		t.Fatalf("Next = %v, want shard 1 at 10", next)
	}
	next[cerr.Shard] = cerr.To + 1
	sub2, err := c.Subscribe(ctx, "s", AtOffsets(next))
	if err != nil {
		t.Fatal(err)
	}
	defer sub2.Stop()
	want := 20 - len(got[0]) + 30 - 13
	for _, r := range collect(t, sub2, want) {
		if r.Shard == 1 && r.Offset <= 12 {
			t.Fatalf("damaged or repeated offset %d delivered", r.Offset)
		}
	}
}

// TestSubscribeSkipCorrupt: with SkipCorrupt the subscription goes on past
// the damaged range by itself and delivers every other record in order.
func TestSubscribeSkipCorrupt(t *testing.T) {
	fc, c, ctx := withStream(t)
	publishN(t, c, "s", 0, 0, 40)
	fc.damage(shardmap.ShardID{Stream: "s", Shard: 0}, 5, 9)
	sub, err := c.Subscribe(ctx, "s", Earliest(), SkipCorrupt(), Credit(4))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	recs := collect(t, sub, 35)
	want := uint64(0)
	for _, r := range recs {
		if want == 5 {
			want = 10
		}
		if r.Offset != want {
			t.Fatalf("got offset %d, want %d", r.Offset, want)
		}
		want++
	}
	if err := sub.Err(); err != nil {
		t.Fatal(err)
	}
	// Nothing more, and no error.
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
