package broker

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// replicaValues returns the values of every committed record of b's
// replica of id.
func replicaValues(t *testing.T, b *Broker, id shardmap.ShardID) []string {
	t.Helper()
	var out []string
	for _, r := range readReplica(t, groupOf(b, id)) {
		out = append(out, string(r.Value))
	}
	return out
}

// waitReplicas waits until every replica of id among brokers has
// committed and applied n records.
func waitReplicas(t *testing.T, brokers []*Broker, id shardmap.ShardID, n uint64) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for _, b := range brokers {
		for e := groupOf(b, id); e == nil || e.sl.NextOffset() < n; e = groupOf(b, id) {
			if time.Now().After(deadline) {
				t.Fatalf("%s's replica of %s did not reach %d records within %v", b.NodeID(), id, n, waitFor)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// committedSeq returns what b's producer table of id holds as the admin
// principal's producer's last committed sequence, 0 if it does not know
// it.
func committedSeq(b *Broker, id shardmap.ShardID, producer string) uint64 {
	producer = scopeProducer(transport.DevAdminName, producer)
	e := groupOf(b, id)
	if e == nil {
		return 0
	}
	e.producers.mu.Lock()
	defer e.producers.mu.Unlock()
	if p := e.producers.mu.byID[producer]; p != nil {
		return p.committed
	}
	return 0
}

// TestReplicatedIdempotentPublish: on a stream of replication factor 3,
// idempotent publish behaves as on the owner of an R=1 shard (see
// TestIdempotentPublish), through the leader and through a follower that
// forwards to it: a repeated sequence gets the original ack and is
// written once, also when it is sent again before the first has
// committed; a gap and a sequence before anything known get
// out_of_order_sequence, one older than the acks remembered
// duplicate_sequence. Every replica holds the records once, with their
// producer ids, and has learnt the producers as the records applied.
func TestReplicatedIdempotentPublish(t *testing.T) {
	ip := startInprocWith(t, func(c *Config) { fastRaft(c); c.ProducerWindow = 3 }, 3,
		shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	leader := waitOwnerLeads(t, ip, ip.brokers, id) // the acks name it: no hand-over may come later
	follower := ip.brokers[slices.IndexFunc(ip.brokers, func(b *Broker) bool { return b != leader })]
	viaF := openStream(t, ip.dial(follower))
	viaL := openStream(t, ip.dial(leader))

	var offsets []uint64
	for i := uint64(1); i <= 5; i++ {
		a := wantAck(t, viaF.roundTrip(idem(i, "r3", "p1", i, "v")), i)
		if a.Duplicate || a.Owner != leader.NodeID() || !a.Forwarded {
			t.Fatalf("first publish of sequence %d: %+v, want an ack by the leader %s, forwarded", i, a, leader.NodeID())
		}
		offsets = append(offsets, a.Offset)
	}
	for _, s := range []uint64{5, 4, 3} {
		a := wantAck(t, viaL.roundTrip(idem(10+s, "r3", "p1", s, "again")), 10+s)
		if !a.Duplicate || a.Offset != offsets[s-1] || a.Owner != leader.NodeID() {
			t.Fatalf("retry of sequence %d at the leader: %+v, want the original ack at offset %d marked duplicate", s, a, offsets[s-1])
		}
	}
	if a := wantAck(t, viaF.roundTrip(idem(20, "r3", "p1", 4, "again")), 20); !a.Duplicate || a.Offset != offsets[3] || !a.Forwarded {
		t.Fatalf("retry of sequence 4 through a follower: %+v", a)
	}
	wantCode(t, viaL.roundTrip(idem(21, "r3", "p1", 2, "old")), 21, transport.CodeDuplicateSequence)
	e := wantCode(t, viaF.roundTrip(idem(22, "r3", "p1", 7, "gap")), 22, transport.CodeOutOfOrderSequence)
	if !errors.Is(e, transport.ErrOutOfOrderSequence) {
		t.Fatalf("%v does not match ErrOutOfOrderSequence", e)
	}
	if e.From != 6 {
		t.Fatalf("out_of_order_sequence names %d as the sequence expected next, want 6", e.From)
	}
	if a := wantAck(t, viaL.roundTrip(idem(23, "r3", "p1", 6, "six")), 23); a.Duplicate || a.Offset != offsets[4]+1 {
		t.Fatalf("sequence 6: %+v", a)
	}
	// Sent twice in a row: the second copy shares the first's outcome
	// (waiting for it if it is still in flight).
	viaL.send(idem(24, "r3", "p1", 7, "seven"))
	viaL.send(idem(25, "r3", "p1", 7, "seven"))
	bySeq := map[uint64]*transport.Ack{}
	for range 2 { // in either order
		f := viaL.recv()
		a, ok := f.(*transport.Ack)
		if !ok {
			t.Fatalf("sequence 7 sent twice: %T %+v", f, f)
		}
		bySeq[a.Seq] = a
	}
	a1, a2 := bySeq[24], bySeq[25]
	if a1 == nil || a2 == nil {
		t.Fatalf("sequence 7 sent twice: acks %v", bySeq)
	}
	if a1.Duplicate || !a2.Duplicate || a1.Offset != a2.Offset || a1.Offset != offsets[4]+2 {
		t.Fatalf("sequence 7 sent twice: %+v and %+v, want one ack at offset %d and the same marked duplicate", a1, a2, offsets[4]+2)
	}
	wantCode(t, viaF.roundTrip(idem(30, "r3", "p2", 100, "p2-forgotten")), 30, transport.CodeUnknownProducer)
	wantAck(t, viaF.roundTrip(idem(26, "r3", "p2", 1, "p2")), 26)
	wantCode(t, viaF.roundTrip(idem(27, "r3", "p2", 100, "p2-gap")), 27, transport.CodeOutOfOrderSequence)
	wantAck(t, viaL.roundTrip(idem(28, "r3", "p1", 0, "zero")), 28)
	wantAck(t, viaL.roundTrip(idem(29, "r3", "p1", 0, "zero")), 29)

	want := []string{"v", "v", "v", "v", "v", "six", "seven", "p2", "zero", "zero"}
	waitReplicas(t, ip.brokers, id, uint64(len(want)))
	for _, b := range ip.brokers {
		if got := replicaValues(t, b, id); !slices.Equal(got, want) {
			t.Fatalf("%s's replica holds %q, want %q", b.NodeID(), got, want)
		}
		recs := readReplica(t, groupOf(b, id))
		if r := recs[5]; r.ProducerID != scopeProducer(transport.DevAdminName, "p1") || r.ProducerSeq != 6 {
			t.Fatalf("%s: record 5 carries producer %q sequence %d, want p1 6", b.NodeID(), r.ProducerID, r.ProducerSeq)
		}
		if s := committedSeq(b, id, "p1"); s != 7 {
			t.Fatalf("%s's producer table has p1 at %d, want 7", b.NodeID(), s)
		}
		if s := committedSeq(b, id, "p2"); s != 1 {
			t.Fatalf("%s's producer table has p2 at %d, want 1", b.NodeID(), s)
		}
	}
}

// TestReplicatedIdempotentFailover: a retry, after the leader is closed
// and another elected, of records the old leader acked gets their
// original acks from the new leader (which learnt them as a follower, as
// they applied), and nothing is written twice; the next sequence is
// written at the next offset.
func TestReplicatedIdempotentFailover(t *testing.T) {
	ip := startInprocWith(t, fastRaft, 3, shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	// The owner, once it leads: closed, it leaves no owner for the new
	// leader to hand over to while the acks are checked against it.
	old := waitOwnerLeads(t, ip, ip.brokers, id)
	ws := openStream(t, ip.dial(old))
	var acks []*transport.Ack
	for i, v := range []string{"one", "two", "three"} {
		acks = append(acks, wantAck(t, ws.roundTrip(idem(uint64(i+1), "r3", "p", uint64(i+1), v)), uint64(i+1)))
	}
	waitReplicas(t, ip.brokers, id, 3)
	ws.s.Close()

	rest := ip.closeBroker(t, old)
	leader := leaderOf(t, rest, id)
	other := rest[0]
	if other == leader {
		other = rest[1]
	}
	retry := openStream(t, ip.dial(other))
	for _, s := range []uint64{3, 1, 2} {
		a := wantAck(t, retry.roundTrip(idem(10+s, "r3", "p", s, "again")), 10+s)
		if !a.Duplicate || a.Offset != acks[s-1].Offset || a.Timestamp != acks[s-1].Timestamp || a.Owner != leader.NodeID() {
			t.Fatalf("retry of sequence %d after the failover: %+v, want the original ack (offset %d) from the new leader %s, marked duplicate",
				s, a, acks[s-1].Offset, leader.NodeID())
		}
	}
	if a := wantAck(t, retry.roundTrip(idem(14, "r3", "p", 4, "four")), 14); a.Duplicate || a.Offset != 3 {
		t.Fatalf("sequence 4 after the failover: %+v, want offset 3", a)
	}
	wantCode(t, retry.roundTrip(idem(16, "r3", "p", 6, "gap")), 16, transport.CodeOutOfOrderSequence)
	waitReplicas(t, rest, id, 4)
	for _, b := range rest {
		if got := replicaValues(t, b, id); !slices.Equal(got, []string{"one", "two", "three", "four"}) {
			t.Fatalf("%s's replica holds %q", b.NodeID(), got)
		}
	}
}

// TestReplicatedIdempotentAfterRestart: when every broker of a replicated
// shard restarts, each replica's producer table is filled again as raft
// applies the committed log, so a retry of a record acked before the
// restart gets its original ack from whichever replica leads.
func TestReplicatedIdempotentAfterRestart(t *testing.T) {
	ip := startInprocWith(t, fastRaft, 3, shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	leader := leaderOf(t, ip.brokers, id)
	ws := openStream(t, ip.dial(leader))
	var acks []*transport.Ack
	for i := uint64(1); i <= 3; i++ {
		acks = append(acks, wantAck(t, ws.roundTrip(idem(i, "r3", "pr", i, "r")), i))
		wantAck(t, ws.roundTrip(idem(100+i, "r3", "other", i, "o")), 100+i) // interleaved
	}
	waitReplicas(t, ip.brokers, id, 6)
	ws.s.Close()
	for _, b := range ip.brokers {
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range ip.brokers {
		ip.brokers[i] = ip.startBroker(i)
	}
	leader = waitOwnerLeads(t, ip, ip.brokers, id) // the acks name it: no hand-over may come later
	ws = openStream(t, ip.dial(ip.brokers[0]))
	for _, s := range []uint64{3, 2} {
		a := wantAck(t, ws.roundTrip(idem(10+s, "r3", "pr", s, "again")), 10+s)
		if !a.Duplicate || a.Offset != acks[s-1].Offset || a.Owner != leader.NodeID() {
			t.Fatalf("retry of sequence %d after the restart: %+v, want the original ack at offset %d", s, a, acks[s-1].Offset)
		}
	}
	if a := wantAck(t, ws.roundTrip(idem(20, "r3", "other", 4, "o")), 20); a.Duplicate || a.Offset != 6 {
		t.Fatalf("next sequence after the restart: %+v, want offset 6", a)
	}
}

// TestProducerTableAppliedAfterGiveBack: on a replicated shard, a record
// whose proposer saw it fail (replaced by another leader's entries) may
// still have committed from another leader's log and applied here; giving
// its sequence back must not let it be written again.
func TestProducerTableAppliedAfterGiveBack(t *testing.T) {
	tab := newProducerTable("s/0", producerLimits{max: 4, expiry: time.Minute, window: 4}, nil)
	a := tab.admit("p", 1)
	if a.kind != admitAppend {
		t.Fatalf("first: %v", a.kind)
	}
	tab.enqueued(a.p)
	tab.applied([]byte("p"), 1, 7, time.Now().UnixNano())
	tab.committed(a.p, 1, 0, 0, errors.New("replaced by another leader's entries"))
	if d := tab.admit("p", 1); d.kind != admitDuplicate || d.ack.offset != 7 {
		t.Fatalf("retry of a sequence that applied: %+v, want a duplicate of offset 7", d)
	}
	if n := tab.admit("p", 2); n.kind != admitAppend {
		t.Fatalf("next: %v, want admitAppend", n.kind)
	}

	// A follower learns producers from what applies alone, and a record
	// applied after a gap (a leader that forgot the producer) starts a
	// new run.
	f := newProducerTable("s/0", producerLimits{max: 4, expiry: time.Minute, window: 4}, nil)
	now := time.Now().UnixNano()
	for s := uint64(5); s <= 7; s++ {
		f.applied([]byte("q"), s, s*10, now)
	}
	f.applied([]byte("q"), 9, 90, now)
	if d := f.admit("q", 9); d.kind != admitDuplicate || d.ack.offset != 90 {
		t.Fatalf("q 9: %+v", d)
	}
	if d := f.admit("q", 7); d.kind != admitOutOfOrder {
		t.Fatalf("q 7, before the run the table knows: %+v, want out of order", d)
	}
	if d := f.admit("q", 10); d.kind != admitAppend {
		t.Fatalf("q 10: %+v", d)
	}
}

// TestReplicatedProducerRestartedAfterExpiry: a producer id that starts
// again at sequence 1 after ProducerExpiry (documented: "s == 1 and the
// producer is unknown (new, expired or evicted): accepted and appended")
// is accepted by the leader, which forgot it; the followers, which never
// admit and so never expire it, keep its old life and ignore the new
// sequence 1 as already committed. After a failover the new leader
// answers the new life's sequence 2 as a duplicate of the OLD sequence 2
// (its offset), and writes nothing: a false ack, the record lost.
func TestReplicatedProducerRestartedAfterExpiry(t *testing.T) {
	const expiry = 300 * time.Millisecond
	ip := startInprocWith(t, func(c *Config) { fastRaft(c); c.ProducerExpiry = expiry }, 3,
		shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	old := waitOwnerLeads(t, ip, ip.brokers, id)
	ws := openStream(t, ip.dial(old))
	for i := uint64(1); i <= 3; i++ {
		wantAck(t, ws.roundTrip(idem(i, "r3", "p", i, "old")), i)
	}
	time.Sleep(3 * expiry)
	a := wantAck(t, ws.roundTrip(idem(4, "r3", "p", 1, "new-1")), 4)
	if a.Duplicate || a.Offset != 3 {
		t.Fatalf("sequence 1 of a producer expired at the leader: %+v, want written at offset 3", a)
	}
	waitReplicas(t, ip.brokers, id, 4)
	for _, b := range ip.brokers {
		t.Logf("%s (leader %v): p committed %d", b.NodeID(), b == old, committedSeq(b, id, "p"))
	}
	ws.s.Close()
	rest := ip.closeBroker(t, old)
	leaderOf(t, rest, id)
	retry := openStream(t, ip.dial(rest[0]))
	a = wantAck(t, retry.roundTrip(idem(5, "r3", "p", 2, "new-2")), 5)
	if a.Duplicate || a.Offset != 4 {
		t.Fatalf("sequence 2 of the producer's new life after a failover: %+v, want written at offset 4", a)
	}
	waitReplicas(t, rest, id, 5)
	if got := replicaValues(t, rest[0], id); !slices.Equal(got, []string{"old", "old", "old", "new-1", "new-2"}) {
		t.Fatalf("replica holds %q", got)
	}
	_ = transport.CodeTimeout
}

// TestProducerEvictionSameOnEveryReplica: with a full table, the leader
// (whose recency list also moves on admits that write nothing: a
// duplicate answered) and a follower (moved by applies only) evict
// different producers for the same new one, so the same retry is judged
// differently by each: a duplicate at the leader, a first record to
