package broker

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// fakeDisks is the free space each broker's data directory reports
// (Knobs.FreeBytes), plenty unless set.
type fakeDisks struct {
	mu   sync.Mutex
	free map[string]int64 // by data directory
}

func (d *fakeDisks) read(dir string) (int64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if f, ok := d.free[dir]; ok {
		return f, nil
	}
	return 1 << 40, nil
}

// set sets b's free space and has b read it at once (as its next check
// would, within diskCheckEvery).
func (d *fakeDisks) set(b *Broker, free int64) {
	d.mu.Lock()
	d.free[b.cfg.DataDir] = free
	d.mu.Unlock()
	b.checkDisk()
}

// startWithFakeDisks starts three brokers (fastRaft, MinFreeBytes 64 MiB,
// then tweak if not nil) whose free space disks gives.
func startWithFakeDisks(t *testing.T, tweak func(*Config), streams ...shardmap.StreamConfig) (*inproc, *fakeDisks) {
	t.Helper()
	disks := &fakeDisks{free: map[string]int64{}}
	ip := startInprocWith(t, func(c *Config) {
		fastRaft(c)
		c.MinFreeBytes = 64 << 20
		c.Knobs.FreeBytes = disks.read
		if tweak != nil {
			tweak(c)
		}
	}, 3, streams...)
	return ip, disks
}

// TestDiskNearlyFullRefuses: a broker whose data directory has less than
// MinFreeBytes free refuses the records of the shards it writes with
// limit_exceeded, directly and through a forwarder, for replication
// factor 1 (owner) and 3 (leader); a follower whose disk is nearly full
// leaves its leader's entries unwritten, the group commits without it,
// and it catches up once its disk has room; with both followers nearly
// full a record waits until one has room; once space is back the shard takes records again at the offset
// after the last acked one (nothing refused was written).
func TestDiskNearlyFullRefuses(t *testing.T) {
	ip, disks := startWithFakeDisks(t, nil, shardmap.StreamConfig{Name: "one", Shards: 1}, shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3})
	r3 := shardmap.ShardID{Stream: "r3", Shard: 0}
	seq := uint64(0)
	publish := func(b *Broker, stream string) transport.Frame {
		t.Helper()
		seq++
		return publishVia(t, ip, b, stream, 0, seq, "v")
	}
	wantAck := func(f transport.Frame, offset uint64) {
		t.Helper()
		if a, ok := f.(*transport.Ack); !ok || a.Offset != offset {
			t.Fatalf("answer %T %+v, want an ack at offset %d", f, f, offset)
		}
	}
	wantRefused := func(f transport.Frame) {
		t.Helper()
		if e, ok := f.(*transport.Error); !ok || e.Code != transport.CodeLimitExceeded {
			t.Fatalf("answer %T %+v, want limit_exceeded", f, f)
		}
	}

	owner, other := ip.owner("one", 0), ip.nonOwner("one", 0)
	wantAck(publish(owner, "one"), 0)
	// The shard's preferred leader (its owner) leads, so that no
	// hand-back of the leadership moves it during the test.
	leader := waitOwnerLeads(t, ip, ip.brokers, r3)
	wantAck(publish(leader, "r3"), 0)

	// A follower's disk nearly full: it leaves the leader's entries
	// unwritten, the group commits with the other follower, and once
	// the disk has room the follower catches up.
	var follower *Broker
	for _, b := range ip.brokers {
		if b != leader {
			follower = b
			break
		}
	}
	disks.set(follower, 1<<20)
	wantAck(publish(leader, "r3"), 1)
	wantAck(publish(follower, "r3"), 2) // forwarded to the leader
	if got := groupOf(follower, r3).sl.NextOffset(); got > 1 {
		t.Fatalf("the nearly full follower holds offsets up to %d, want at most 1", got)
	}
	if follower.raft.diskRefusals.Load() == 0 {
		t.Fatal("the nearly full follower left no entry unwritten")
	}
	disks.set(follower, 1<<40)
	deadline := time.Now().Add(waitFor)
	for groupOf(follower, r3).sl.NextOffset() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the follower holds offsets up to %d %v after its disk had room again, want 3", groupOf(follower, r3).sl.NextOffset(), waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Both followers nearly full: the group commits nothing, and a record
	// the leader took waits, unanswered, until one has room again.
	for _, b := range ip.brokers {
		if b != leader {
			disks.set(b, 1<<20)
		}
	}
	seq++
	ws := openStream(t, ip.dial(leader))
	ws.send(&transport.Publish{Seq: seq, Stream: "r3", Value: []byte("waits")})
	answered := make(chan transport.Frame, 1)
	go func() {
		f, err := ws.r.Read()
		if err != nil {
			f = &transport.Error{Code: transport.CodeInternal, Message: err.Error()}
		}
		answered <- f
	}()
	select {
	case f := <-answered:
		t.Fatalf("answered %T %+v while no follower could write it", f, f)
	case <-time.After(500 * time.Millisecond):
	}
	disks.set(follower, 1<<40)
	select {
	case f := <-answered:
		wantAck(f, 3)
	case <-time.After(waitFor):
		var st []string
		for _, b := range ip.brokers {
			g := groupOf(b, r3).group
			st = append(st, fmt.Sprintf("%s: quiet %v next %d low %v refusals %d", b.NodeID(), g.Quiesced(), g.NextOffset(), b.disk.low.Load(), b.raft.diskRefusals.Load()))
		}
		t.Fatalf("no answer %v after a follower had room again: %v", waitFor, st)
	}
	ws.s.Close()
	for _, b := range ip.brokers {
		disks.set(b, 1<<40)
	}

	disks.set(owner, 1<<20)
	disks.set(leader, 1<<20)
	wantRefused(publish(owner, "one"))
	wantRefused(publish(other, "one")) // forwarded: the owner refuses, the forwarder relays
	wantRefused(publish(leader, "r3"))
	for _, b := range ip.brokers {
		if b != leader {
			wantRefused(publish(b, "r3")) // forwarded to the leader
		}
	}

	disks.set(owner, 1<<40)
	disks.set(leader, 1<<40)
	wantAck(publish(other, "one"), 1)
	wantAck(publish(leader, "r3"), 4)
}

// fullFollowers starts three brokers (fastRaft, then tweak) with the
// one-shard stream r3 of replication factor 3, waits for its owner to
// lead it, and puts both followers' disks below the line, so that the
// group can commit nothing. roomFor(i) gives the i-th follower room again.
func fullFollowers(t *testing.T, tweak func(*Config)) (ip *inproc, leader *Broker, roomFor func(i int)) {
	ip, disks := startWithFakeDisks(t, tweak, shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	leader = waitOwnerLeads(t, ip, ip.brokers, id)
	// The followers' disks fill once the leader serves: once they have
	// written the entry that begins its term. Filled before, they never
	// write it, and every publish waits for it instead of for its own.
	for deadline := time.Now().Add(waitFor); groupOf(leader, id).group.LeaderTerm() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s leads %s but has not applied an entry of its term", leader.NodeID(), id)
		}
	}
	var followers []*Broker
	for _, b := range ip.brokers {
		if b != leader {
			followers = append(followers, b)
			disks.set(b, 1<<20)
		}
	}
	return ip, leader, func(i int) { disks.set(followers[i], 1<<40) }
}

// TestCloseFailsRecordsAGroupCannotCommit: a leader whose followers both
// leave its entries unwritten (their disks nearly full) holds a record
// it took in; closing the broker still returns, within ForwardTimeout and
// a little, and the record's publisher is told, never acked.
func TestCloseFailsRecordsAGroupCannotCommit(t *testing.T) {
	ip, leader, _ := fullFollowers(t, func(c *Config) { c.ForwardTimeout = 300 * time.Millisecond })
	ws := openStream(t, ip.dial(leader))
	ws.send(&transport.Publish{Seq: 1, Stream: "r3", Value: []byte("stuck")})
	answered := make(chan transport.Frame, 1)
	go func() {
		f, err := ws.r.Read()
		if err != nil {
			f = nil // the connection closed first: the publisher sees that
		}
		answered <- f
	}()
	select {
	case f := <-answered:
		t.Fatalf("answered %T %+v while no follower could write it", f, f)
	case <-time.After(300 * time.Millisecond):
	}
	closed := make(chan error, 1)
	go func() { closed <- leader.Close() }()
	select {
	case <-closed:
	case <-time.After(waitFor):
		t.Fatalf("Close has not returned %v after it began, with a record its group cannot commit", waitFor)
	}
	if f := <-answered; f != nil {
		if _, acked := f.(*transport.Ack); acked {
			t.Fatalf("acked %+v though no follower wrote it", f)
		}
	}
}

// TestCommitTimeoutAnswersThenCommits: a record its group cannot commit
// (both followers below the disk line) is answered timeout after
// CommitTimeout, not left waiting; its entry keeps its chance, and once
// a follower has room it is committed once. An idempotent record's retry
// meanwhile shares its fate, waiting no longer than CommitTimeout for it
// (it waited as long as the followers had no room, unanswered), and is
// acked at the same offset once committed: written once.
func TestCommitTimeoutAnswersThenCommits(t *testing.T) {
	ip, leader, roomFor := fullFollowers(t, func(c *Config) { c.CommitTimeout = 400 * time.Millisecond })
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	ws := openStream(t, ip.dial(leader))
	ws.send(&transport.Publish{Seq: 1, Stream: "r3", Value: []byte("plain")})
	ws.send(&transport.Publish{Seq: 2, Stream: "r3", Value: []byte("idem"), ProducerID: "p1", ProducerSeq: 1})
	for range 2 {
		f := ws.recv()
		if e, ok := f.(*transport.Error); !ok || e.Code != transport.CodeTimeout {
			t.Fatalf("a record no majority can write: %T %+v, want a timeout error", f, f)
		}
	}
	// The publisher retries the idempotent one: it is still in flight,
	// and the retry is answered timeout in its turn.
	ws.send(&transport.Publish{Seq: 3, Stream: "r3", Value: []byte("idem"), ProducerID: "p1", ProducerSeq: 1})
	if e, ok := ws.recv().(*transport.Error); !ok || e.Code != transport.CodeTimeout || e.Seq != 3 {
		t.Fatalf("the retry of a record in flight that no majority can write: %T %+v, want a timeout error", e, e)
	}
	roomFor(0)
	// Retried until acked, as the SDK does: a retry sent before the
	// entry commits may time out too.
	var ack *transport.Ack
	for seq := uint64(4); ack == nil; seq++ {
		ws.send(&transport.Publish{Seq: seq, Stream: "r3", Value: []byte("idem"), ProducerID: "p1", ProducerSeq: 1})
		switch f := ws.recv().(type) {
		case *transport.Ack:
			ack = f
		case *transport.Error:
			if f.Code != transport.CodeTimeout || seq > 20 {
				t.Fatalf("the idempotent retry once a follower has room: %+v, want its ack", f)
			}
		}
	}
	// Read where the ack came from: the leader now, which applied the
	// record before it acked it. The group may have elected another
	// while no majority could write (a loaded run), and then the first
	// leader, a follower, applies it a little later.
	var got []string
	for _, r := range readReplica(t, groupOf(leaderOf(t, ip.brokers, id), id)) {
		got = append(got, string(r.Value))
	}
	if !slices.Equal(got, []string{"plain", "idem"}) {
		t.Fatalf("the shard holds %q, want [plain idem]: each record once, in the order sent", got)
	}
	if ack.Offset != 1 {
		t.Fatalf("the retry was acked at offset %d, want 1, where its first send was written", ack.Offset)
	}
}

// TestIdempotentRetryAnsweredWhileDiskNearlyFull: the retry of an
// idempotent record written before its broker's disk went under
// MinFreeBytes is answered with the original's ack (it needs no space),
// at replication factor 1 and 3; a new sequence is refused, and once
// there is room it is written next. The disk was checked first: the retry
// was refused limit_exceeded, "not written", and the client moved the
// records after it to a new producer id, writing them twice.
func TestIdempotentRetryAnsweredWhileDiskNearlyFull(t *testing.T) {
	ip, disks := startWithFakeDisks(t, nil, shardmap.StreamConfig{Name: "one", Shards: 1}, shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3})
	for _, c := range []struct {
		stream string
		b      *Broker
	}{
		{"one", ip.owner("one", 0)},
		{"r3", waitOwnerLeads(t, ip, ip.brokers, shardmap.ShardID{Stream: "r3", Shard: 0})},
	} {
		ws := openStream(t, ip.dial(c.b))
		send := func(seq, pseq uint64) transport.Frame {
			t.Helper()
			ws.send(&transport.Publish{Seq: seq, Stream: c.stream, Value: []byte(fmt.Sprint("p1-", pseq)), ProducerID: "p1", ProducerSeq: pseq})
			return ws.recv()
		}
		first, ok := send(1, 1).(*transport.Ack)
		if !ok {
			t.Fatalf("%s: the first record was not acked", c.stream)
		}
		disks.set(c.b, 1<<20)
		if a, ok := send(2, 1).(*transport.Ack); !ok || !a.Duplicate || a.Offset != first.Offset {
			t.Fatalf("%s: the retry of a written record with the disk nearly full: %T %+v, want the original's ack at %d", c.stream, a, a, first.Offset)
		}
		if e, ok := send(3, 2).(*transport.Error); !ok || e.Code != transport.CodeLimitExceeded {
			t.Fatalf("%s: a new record with the disk nearly full: %T %+v, want limit_exceeded", c.stream, e, e)
		}
		disks.set(c.b, 1<<40)
		if a, ok := send(4, 2).(*transport.Ack); !ok || a.Duplicate || a.Offset != first.Offset+1 {
			t.Fatalf("%s: the refused sequence sent again with room: %T %+v, want written at %d", c.stream, a, a, first.Offset+1)
		}
	}
}

// TestSubscriberLeavesReplicaThatDropsEntries: an SDK subscription reads
// from the shard's owner, a follower once the leadership has moved; the
// owner's disk then goes under MinFreeBytes, so it leaves its leader's
// entries unwritten (the group commits with the other two). The
// subscription, waiting at the owner's end, is ended unavailable within
// about a second, and the SDK reads the records committed meanwhile from
// another replica: each once, in order. It waited at the owner as long as
// the disk stayed full, receiving nothing and no error.
func TestSubscriberLeavesReplicaThatDropsEntries(t *testing.T) {
	ip, disks := startWithFakeDisks(t, nil, shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	owner := waitOwnerLeads(t, ip, ip.brokers, id)
	c := ip.sdk(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := c.Publish(ctx, "r3", nil, []byte("v0")); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, "r3", client.Earliest())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	got := make(chan uint64, 16)
	go func() {
		for rec, err := range sub.Records(ctx) {
			if err != nil {
				return
			}
			got <- rec.Offset
		}
	}()
	if o := <-got; o != 0 {
		t.Fatalf("first record at offset %d, want 0", o)
	}
	other := ip.brokers[slices.IndexFunc(ip.brokers, func(b *Broker) bool { return b != owner })]
	groupOf(owner, id).group.TransferLeadership(groupOf(other, id).group.ID())
	for leaderOf(t, ip.brokers, id) == owner {
		time.Sleep(10 * time.Millisecond)
	}
	disks.set(owner, 1<<20)
	for range 5 {
		if _, err := c.Publish(ctx, "r3", nil, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	for want := uint64(1); want <= 5; want++ {
		select {
		case o := <-got:
			if o != want {
				t.Fatalf("subscriber got offset %d, want %d", o, want)
			}
		case <-ctx.Done():
			t.Fatalf("subscriber got nothing past offset %d (the owner's replica holds %d records, the leader's %d)",
				want-1, groupOf(owner, id).sl.NextOffset(), groupOf(leaderOf(t, ip.brokers, id), id).sl.NextOffset())
		}
	}
}
