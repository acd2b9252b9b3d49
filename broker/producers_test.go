package broker

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
	"github.com/felix-broker/felix/wal"
)

// idem builds an idempotent publish of value to shard 0 of stream.
func idem(seq uint64, stream, producer string, pseq uint64, value string) *transport.Publish {
	p := publish(seq, stream, value)
	p.Shard = 0
	p.ProducerID, p.ProducerSeq = producer, pseq
	return p
}

func wantCode(t *testing.T, f transport.Frame, seq uint64, code transport.ErrorCode) *transport.Error {
	t.Helper()
	e, ok := f.(*transport.Error)
	if !ok || e.Code != code {
		t.Fatalf("seq %d: want %v, got %T %+v", seq, code, f, f)
	}
	if e.Seq != seq {
		t.Fatalf("error for seq %d, want %d", e.Seq, seq)
	}
	return e
}

func (ws *wireStream) roundTrip(p *transport.Publish) transport.Frame {
	ws.t.Helper()
	ws.send(p)
	return ws.recv()
}

// TestIdempotentPublish: on the owner, a repeated sequence gets the
// original ack and is written once; a gap and a sequence before anything
// known get out_of_order_sequence, one older than the acks remembered
// duplicate_sequence; sequence 0 is not idempotent.
func TestIdempotentPublish(t *testing.T) {
	ip := startInprocWith(t, func(c *Config) { c.ProducerWindow = 3 }, 1, shardmap.StreamConfig{Name: "idem", Shards: 1})
	b := ip.brokers[0]
	ws := openStream(t, ip.dial(b))

	var offsets []uint64
	for i := uint64(1); i <= 5; i++ {
		a := wantAck(t, ws.roundTrip(idem(i, "idem", "p1", i, "v")), i)
		if a.Duplicate {
			t.Fatalf("first publish of sequence %d acked as a duplicate", i)
		}
		offsets = append(offsets, a.Offset)
	}
	// The last three sequences are remembered: their original acks.
	for _, s := range []uint64{5, 4, 3} {
		a := wantAck(t, ws.roundTrip(idem(10+s, "idem", "p1", s, "again")), 10+s)
		if !a.Duplicate || a.Offset != offsets[s-1] || a.Owner != b.NodeID() || a.Stream != "idem" || a.Shard != 0 {
			t.Fatalf("retry of sequence %d: %+v, want the original ack at offset %d marked duplicate", s, a, offsets[s-1])
		}
	}
	wantCode(t, ws.roundTrip(idem(20, "idem", "p1", 2, "old")), 20, transport.CodeDuplicateSequence)
	e := wantCode(t, ws.roundTrip(idem(21, "idem", "p1", 7, "gap")), 21, transport.CodeOutOfOrderSequence)
	if !errors.Is(e, transport.ErrOutOfOrderSequence) {
		t.Fatalf("%v does not match ErrOutOfOrderSequence", e)
	}
	if e.From != 6 {
		t.Fatalf("out_of_order_sequence names %d as the sequence expected next, want 6", e.From)
	}
	// The gap wrote nothing: 6 is next.
	if a := wantAck(t, ws.roundTrip(idem(22, "idem", "p1", 6, "six")), 22); a.Duplicate || a.Offset != offsets[4]+1 {
		t.Fatalf("sequence 6: %+v", a)
	}
	// A producer not known, at a sequence past 1: it may be a retry of
	// a record written before the producer was forgotten. Refused,
	// unknown_producer; it starts at 1.
	e = wantCode(t, ws.roundTrip(idem(23, "idem", "p2", 100, "p2-forgotten")), 23, transport.CodeUnknownProducer)
	if !errors.Is(e, transport.ErrUnknownProducer) {
		t.Fatalf("%v does not match ErrUnknownProducer", e)
	}
	wantAck(t, ws.roundTrip(idem(24, "idem", "p2", 1, "p2")), 24)
	wantCode(t, ws.roundTrip(idem(27, "idem", "p2", 100, "p2-gap")), 27, transport.CodeOutOfOrderSequence)
	// Sequence 0 is metadata only: written every time.
	wantAck(t, ws.roundTrip(idem(25, "idem", "p1", 0, "zero")), 25)
	wantAck(t, ws.roundTrip(idem(26, "idem", "p1", 0, "zero")), 26)

	want := []string{"v", "v", "v", "v", "v", "six", "p2", "zero", "zero"}
	if got := readAll(t, b, "idem", 0); !slices.Equal(got, want) {
		t.Fatalf("log holds %q, want %q", got, want)
	}
}

// TestIdempotentPublishForwarded: a retry through another broker (or
// straight to the owner) of a record forwarded before gets the original
// ack, relayed, and the record is in the owner's log once.
func TestIdempotentPublishForwarded(t *testing.T) {
	ip := startInproc(t, 2, shardmap.StreamConfig{Name: "fwd", Shards: 1})
	owner, other := ip.owner("fwd", 0), ip.nonOwner("fwd", 0)
	first := openStream(t, ip.dial(other))
	a1 := wantAck(t, first.roundTrip(idem(1, "fwd", "px", 1, "one")), 1)
	if !a1.Forwarded || a1.Owner != owner.NodeID() {
		t.Fatalf("first publish not forwarded to the owner: %+v", a1)
	}
	// The client lost the ack, reconnected and retried through the same
	// broker, then straight to the owner.
	again := openStream(t, ip.dial(other))
	a2 := wantAck(t, again.roundTrip(idem(7, "fwd", "px", 1, "one")), 7)
	if !a2.Duplicate || a2.Offset != a1.Offset || !a2.Forwarded || a2.Via != other.NodeID() {
		t.Fatalf("forwarded retry: %+v, want the original ack (offset %d) marked duplicate, via %s", a2, a1.Offset, other.NodeID())
	}
	direct := openStream(t, ip.dial(owner))
	a3 := wantAck(t, direct.roundTrip(idem(1, "fwd", "px", 1, "one")), 1)
	if !a3.Duplicate || a3.Offset != a1.Offset || a3.Forwarded {
		t.Fatalf("direct retry: %+v", a3)
	}
	if e := wantCode(t, again.roundTrip(idem(8, "fwd", "px", 3, "gap")), 8, transport.CodeOutOfOrderSequence); e.From != 2 {
		t.Fatalf("relayed out_of_order_sequence names %d as the sequence expected next, want 2", e.From)
	}
	wantAck(t, again.roundTrip(idem(9, "fwd", "px", 2, "two")), 9)
	if got := readAll(t, owner, "fwd", 0); !slices.Equal(got, []string{"one", "two"}) {
		t.Fatalf("owner's log holds %q", got)
	}
}

// TestIdempotentPublishAfterRestart: the owner's producer table is
// rebuilt from its log when it restarts, so a retry of a record
// committed before the restart is still answered with its original ack,
// within the acks it remembers (ProducerWindow, 2 here); one older than
// those is refused out_of_order_sequence naming no expected sequence (its
// outcome is not known there).
func TestIdempotentPublishAfterRestart(t *testing.T) {
	ip := startInprocWith(t, func(c *Config) { c.ProducerWindow = 2 }, 1, shardmap.StreamConfig{Name: "rs", Shards: 1})
	b := ip.brokers[0]
	ws := openStream(t, ip.dial(b))
	var acks []*transport.Ack
	for i := uint64(1); i <= 3; i++ {
		acks = append(acks, wantAck(t, ws.roundTrip(idem(i, "rs", "pr", i, "r")), i))
		wantAck(t, ws.roundTrip(idem(100+i, "rs", "other", i, "o")), 100+i) // interleaved
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = ip.startBroker(0)
	ip.brokers[0] = b
	ws = openStream(t, ip.dial(b))
	for _, s := range []uint64{3, 2} {
		a := wantAck(t, ws.roundTrip(idem(s, "rs", "pr", s, "r")), s)
		if !a.Duplicate || a.Offset != acks[s-1].Offset || a.Timestamp != acks[s-1].Timestamp {
			t.Fatalf("retry of %d after restart: %+v, want the original %+v", s, a, acks[s-1])
		}
	}
	if e := wantCode(t, ws.roundTrip(idem(1, "rs", "pr", 1, "r")), 1, transport.CodeOutOfOrderSequence); e.From != 0 {
		t.Fatalf("a sequence older than the acks remembered: out_of_order_sequence names %d as expected next, want none", e.From)
	}
	if e := wantCode(t, ws.roundTrip(idem(5, "rs", "pr", 5, "gap")), 5, transport.CodeOutOfOrderSequence); e.From != 4 {
		t.Fatalf("a gap after restart: out_of_order_sequence names %d as expected next, want 4", e.From)
	}
	wantAck(t, ws.roundTrip(idem(6, "rs", "other", 3, "o")), 6) // a duplicate
	if a := wantAck(t, ws.roundTrip(idem(7, "rs", "pr", 4, "r4")), 7); a.Duplicate || a.Offset != 6 {
		t.Fatalf("sequence 4 after restart: %+v, want a new record at offset 6", a)
	}
	if got := readAll(t, b, "rs", 0); len(got) != 7 {
		t.Fatalf("log holds %q, want 7 records", got)
	}
}

// TestProducerTableInFlight: a retry of a sequence queued and not yet
// committed is not appended again; it gets the outcome of the queued
// record, success or failure (after which the sequence may be sent
// again).
func TestProducerTableInFlight(t *testing.T) {
	tab := newProducerTable("s/0", producerLimits{max: 2, expiry: time.Minute, window: 4}, nil)
	a := tab.admit("p", 1)
	if a.kind != admitAppend {
		t.Fatalf("first: %v", a.kind)
	}
	tab.enqueued(a.p)
	r := tab.admit("p", 1)
	if r.kind != admitWait {
		t.Fatalf("retry in flight: %v, want admitWait", r.kind)
	}
	var got []seqAck
	w1 := seqWaiter(func(ack seqAck, err error) { got = append(got, ack) })
	if !tab.await(r.p, 1, &w1) {
		t.Fatal("await refused a sequence in flight")
	}
	// A waiter taken back (boundWait's timeout) is not called, once.
	gone := seqWaiter(func(seqAck, error) { t.Error("a waiter taken back was called") })
	if !tab.await(r.p, 1, &gone) || !tab.unwait(r.p, 1, &gone) || tab.unwait(r.p, 1, &gone) {
		t.Fatal("unwait does not take back a registered waiter exactly once")
	}
	if n := tab.admit("p", 2); n.kind != admitAppend {
		t.Fatalf("next while 1 is in flight: %v", n.kind)
	} else {
		tab.enqueued(n.p)
	}
	tab.committed(a.p, 1, 40, 99, nil)
	if len(got) != 1 || got[0].offset != 40 {
		t.Fatalf("waiter got %+v", got)
	}
	// 2 fails: it is given back.
	var failed error
	r = tab.admit("p", 2)
	w2 := seqWaiter(func(_ seqAck, err error) { failed = err })
	tab.await(r.p, 2, &w2)
	tab.committed(a.p, 2, 0, 0, errors.New("disk on fire"))
	if failed == nil {
		t.Fatal("waiter of a failed record got no error")
	}
	if n := tab.admit("p", 2); n.kind != admitAppend {
		t.Fatalf("2 after its failure: %v, want admitAppend", n.kind)
	} else {
		tab.enqueued(n.p)
		tab.committed(n.p, 2, 41, 100, nil)
	}
	if d := tab.admit("p", 1); d.kind != admitDuplicate || d.ack.offset != 40 {
		t.Fatalf("1: %+v", d)
	}
	// Bounded: a third producer evicts the least recently used one with
	// nothing in flight (p); with every one in flight, no room is made.
	q := tab.admit("q", 1)
	tab.enqueued(q.p)
	r = tab.admit("r", 1)
	if r.kind != admitAppend || tab.size() != 2 {
		t.Fatalf("a third producer: %v, %d producers; want admitAppend and 2", r.kind, tab.size())
	}
	tab.enqueued(r.p)
	if a := tab.admit("s", 1); a.kind != admitFull {
		t.Fatalf("a new producer while both known have records in flight: %v; want admitFull", a.kind)
	}
	tab.committed(q.p, 1, 42, 101, nil)
	if a := tab.admit("s", 1); a.kind != admitAppend {
		t.Fatalf("a new producer once q's record committed: %v; want admitAppend", a.kind)
	}
	if a := tab.admit("p", 3); a.kind != admitUnknown {
		t.Fatalf("an evicted producer's next sequence: %v, want admitUnknown", a.kind)
	}
}

// TestProducerInFlightNeverEvicted: a producer with a record in flight
// stays known when new producers fill the table, so that its retry is
// answered, not written again; a new producer with no room is refused.
// Eviction once took the least recently used producer whatever it had in
// flight, and any client could make others' retries duplicates by making
// new producers.
func TestProducerInFlightNeverEvicted(t *testing.T) {
	tab := newProducerTable("s/0", producerLimits{max: 2, expiry: time.Hour, window: 8}, nil)
	victim := tab.admit("victim", 1)
	tab.enqueued(victim.p)
	for i := range 3 {
		a := tab.admit(fmt.Sprint("hostile-", i), 1)
		if a.kind != admitAppend {
			if i == 0 || a.kind != admitFull {
				t.Fatalf("hostile producer %d: %v", i, a.kind)
			}
			continue
		}
		tab.enqueued(a.p)
		tab.committed(a.p, 1, uint64(i), 1, nil)
	}
	if a := tab.admit("victim", 1); a.kind != admitWait {
		t.Fatalf("the victim's retry of its record in flight: %v, want admitWait", a.kind)
	}
}

// A replica that installs a snapshot first forgets its producers
// (forget, then restoreState): a producer it knew at sequence 3, whose
// records up to 7 it skipped, is not one whose next record is out of
// order; a record in flight still completes.
func TestProducerTableForget(t *testing.T) {
	tab := newProducerTable("s/0", producerLimits{max: 10, expiry: time.Minute, window: 4}, nil)
	tab.applied([]byte("p"), 3, 30, time.Now().UnixNano())
	inflight := tab.admit("q", 1)
	tab.enqueued(inflight.p)
	if a := tab.admit("p", 8); a.kind != admitOutOfOrder {
		t.Fatalf("8 after 3, before forget: %v, want admitOutOfOrder", a.kind)
	}
	tab.forget()
	if n := tab.size(); n != 0 {
		t.Fatalf("%d producers after forget", n)
	}
	if a := tab.admit("p", 8); a.kind != admitUnknown {
		t.Fatalf("8 after forget: %v, want admitUnknown", a.kind)
	}
	tab.committed(inflight.p, 1, 31, time.Now().UnixNano(), nil) // completes on the forgotten entry
	if a := tab.admit("q", 2); a.kind != admitUnknown {
		t.Fatalf("q's next after forget: %v, want admitUnknown", a.kind)
	}
}

// dropClientConns closes every connection made to b (clients' and
// peers'), as a network fault would.
func dropClientConns(b *Broker) int {
	b.mu.Lock()
	conns := make([]*quic.Conn, 0, len(b.mu.conns))
	for c := range b.mu.conns {
		conns = append(conns, c)
	}
	b.mu.Unlock()
	for _, c := range conns {
		c.CloseWithError(quic.ApplicationErrorCode(transport.CodeUnavailable), "test: connection dropped")
	}
	return len(conns)
}

// TestIdempotentPublisherExactlyOnce: the SDK's idempotent publisher
// sends records of unknown outcome again by itself while the connection
// to its broker is cut again and again; every record resolves with an
// ack, and each is in its shard's log exactly once, in the order sent.
func TestIdempotentPublisherExactlyOnce(t *testing.T) {
	ip := startInproc(t, 2, shardmap.StreamConfig{Name: "eo", Shards: 2})
	via := ip.brokers[0]
	caFile := filepath.Join(ip.dir, "certs", "ca.crt")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.Connect(ctx, via.Addr().String(), client.WithCAFile(caFile), adminCert(caFile), client.WithLogger(quiet()),
		client.WithIdempotence(), client.WithReconnect(5*time.Millisecond, 50*time.Millisecond), client.WithRetryTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pub, err := c.Publisher(ctx, "eo")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	const n = 3000
	// The connection is cut every 30 ms, but only once the owners have
	// taken in more records since the last cut: on a loaded machine a
	// reconnection can take longer than 30 ms, and cuts that never let a
	// record through would only use up the records' retry timeout.
	logs := []interface{ NextOffset() uint64 }{ip.logOf(ip.owner("eo", 0), "eo", 0), ip.logOf(ip.owner("eo", 1), "eo", 1)}
	taken := func() uint64 { return logs[0].NextOffset() + logs[1].NextOffset() }
	stop := make(chan struct{})
	killed := make(chan int)
	go func() {
		kills := 0
		defer func() { killed <- kills }()
		last := taken()
		for {
			select {
			case <-stop:
				return
			case <-time.After(30 * time.Millisecond):
				if now := taken(); now > last {
					last = now
					if dropClientConns(via) > 0 {
						kills++
					}
				}
			}
		}
	}()
	futures := make([]*client.Future, n)
	for i := range n {
		key := fmt.Sprintf("k%d", i%7)
		f, err := pub.PublishAsync(ctx, []byte(key), []byte(strconv.Itoa(i)))
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		futures[i] = f
	}
	dups := 0
	for i, f := range futures {
		a, err := f.Wait(ctx)
		if err != nil {
			close(stop)
			<-killed
			t.Fatalf("record %d: %v", i, err)
		}
		if a.Duplicate {
			dups++
		}
	}
	close(stop)
	kills := <-killed
	seen := map[string]int{}
	for shard := range 2 {
		last := -1
		for _, v := range readAll(t, ip.owner("eo", shard), "eo", shard) {
			seen[v]++
			i, _ := strconv.Atoi(v)
			if i <= last {
				t.Fatalf("shard %d: record %d after %d", shard, i, last)
			}
			last = i
		}
	}
	for i := range n {
		if got := seen[strconv.Itoa(i)]; got != 1 {
			t.Fatalf("record %d is in the log %d times", i, got)
		}
	}
	if len(seen) != n {
		t.Fatalf("%d distinct records in the logs, want %d", len(seen), n)
	}
	t.Logf("%d records, %d connection drops, %d acked as duplicates of an earlier attempt", n, kills, dups)
}

// retainingLog is a log whose retention drops records up to cut just
// before the first read that reaches below it, as a background pass can
// while a rebuild reads.
type retainingLog struct {
	*wal.Log
	t    *testing.T
	cut  uint64
	done bool
}

func (l *retainingLog) Read(from uint64, max, maxBytes int) ([]wal.Record, error) {
	if !l.done && from < l.cut {
		l.done = true
		if _, err := l.EnforceRetention(time.Now()); err != nil || l.FirstOffset() <= from {
			l.t.Fatalf("retention: %v, first offset %d", err, l.FirstOffset())
		}
	}
	return l.Log.Read(from, max, maxBytes)
}

// TestProducerRebuildRacingRetention: a retention pass that drops the
// start of the chunk the rebuild is reading does not end the rebuild: it
// reads on from the log's new start. It once stopped with "read failed"
// and learnt nothing of that chunk, so the retries of its producers, the
// newest, were written again.
func TestProducerRebuildRacingRetention(t *testing.T) {
	l, err := wal.Open(t.TempDir(), wal.Options{Name: "s/0", SegmentSize: 4 << 10, RetentionBytes: 8 << 10, RetentionCheck: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const n = 300
	for i := range n {
		r := &wal.Record{Value: make([]byte, 100), ProducerID: fmt.Sprintf("p%d", i%50), ProducerSeq: uint64(i/50 + 1)}
		if _, err := l.Append(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	tab := newProducerTable("s/0", producerLimits{max: 100, expiry: time.Hour, window: 8, rebuildBytes: 1 << 30}, nil)
	st, err := tab.rebuild(&retainingLog{Log: l, t: t, cut: 1})
	if err != nil || l.FirstOffset() == 0 {
		t.Fatalf("rebuild: %v (stopped: %s); first offset %d", err, st.stop, l.FirstOffset())
	}
	if tab.size() != 50 {
		t.Fatalf("rebuild learnt %d producers, want 50 (stopped: %s)", tab.size(), st.stop)
	}
	if a := tab.admit("p49", 6); a.kind != admitDuplicate {
		t.Fatalf("p49's last sequence after the rebuild: %v, want a duplicate", a.kind)
	}
}

// TestProducerTableMemoryBound: what a full table holds, against the
// documented bound MaxProducers × (600 + 16 × ProducerWindow), at a
// window that is a power of two and one that is not.
func TestProducerTableMemoryBound(t *testing.T) {
	for _, window := range []int{256, 300} {
		const n = 2000
		lim := producerLimits{max: n, expiry: time.Hour, window: window}
		var ms0, ms1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms0)
		tab := newProducerTable("s/0", lim, nil)
		pfx := strings.Repeat("x", 256) + "\x00" + strings.Repeat("y", 120)
		for i := range n {
			id := fmt.Sprintf("%s%08d", pfx, i)
			for s := uint64(1); s <= uint64(window); s++ {
				a := tab.admit(id, s)
				if a.kind != admitAppend {
					t.Fatal(a.kind)
				}
				tab.enqueued(a.p)
				tab.committed(a.p, s, s, 1, nil)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&ms1)
		per := float64(ms1.HeapAlloc-ms0.HeapAlloc) / n
		bound := float64(600 + 16*window)
		t.Logf("window %d: %.0f bytes per producer held, documented at most %.0f (%.2fx)", window, per, bound, per/bound)
		if per > bound*1.05 {
			t.Errorf("window %d: %.0f bytes per producer, over the documented %.0f", window, per, bound)
		}
		runtime.KeepAlive(tab)
	}
}

// TestProducerEvictionSameOnEveryReplica: with a full table, the leader
// and a follower evict the same producer for a new one. The leader's
// recency list moved on admits that wrote nothing (a duplicate answered),
// the follower's on applies only, so they evicted different producers,
// and the same retry was judged differently by each: a duplicate at the
// leader, a first record to append at the follower once it leads.
func TestProducerEvictionSameOnEveryReplica(t *testing.T) {
	lim := producerLimits{max: 2, expiry: time.Hour, window: 4}
	l := newProducerTable("s/0", lim, nil)
	f := newProducerTable("s/0", lim, nil)
	off := uint64(0)
	write := func(id string) { // judged by the leader, applied on both
		a := l.admit(id, 1)
		if a.kind != admitAppend {
			t.Fatalf("%s: %v", id, a.kind)
		}
		l.enqueued(a.p)
		l.applied([]byte(id), 1, off, 1)
		f.applied([]byte(id), 1, off, 1)
		l.committed(a.p, 1, off, 1, nil)
		off++
	}
	write("P")
	write("Q")
	if a := l.admit("P", 1); a.kind != admitDuplicate { // P's retry, answered by the leader
		t.Fatalf("retry of P 1 at the leader: %v", a.kind)
	}
	write("R") // the leader evicts Q, the follower P
	lk, fk := l.admit("P", 1).kind, f.admit("P", 1).kind
	if lk != fk {
		t.Fatalf("the same retry of P 1: leader decides %v, follower %v (admitDuplicate=%d, admitAppend=%d)", lk, fk, admitDuplicate, admitAppend)
	}
}
