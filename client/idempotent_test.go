package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestIdempotentGapBacksOff: a record that the owner keeps refusing
// out_of_order_sequence (a gap sending it again does not close) is sent
// again less and less often, not once a round trip until the retry
// timeout: the publisher opened a stream after another for two minutes.
// It fails once the retry timeout passes, its outcome unknown.
func TestIdempotentGapBacksOff(t *testing.T) {
	fc, c, ctx := withStream(t, WithIdempotence(), WithRetryTimeout(time.Second))
	fc.brokers[0].refuseIdempotent.Store(true)
	pub, err := c.Publisher(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	before := fc.brokers[0].published.Load()
	_, err = pub.Publish(ctx, []byte("k"), []byte("v"))
	if !errors.Is(err, ErrRetriesExhausted) {
		t.Fatalf("a record refused out of order for the whole retry timeout: %v, want ErrRetriesExhausted", err)
	}
	// Sent again after 0, 0, 10, 20, 40, 80, 160, 320 and 640 ms at
	// most within the second (the first two without waiting).
	if sent := fc.brokers[0].published.Load() - before; sent > 12 {
		t.Fatalf("the record was sent %d times within its one-second retry timeout", sent)
	}
}

// A map that gives a stream no shards (damaged, or of another version) is
// an error for an idempotent publisher, which picks shards itself: it
// divided by zero and took the application down.
func TestIdempotentPublishToAStreamOfNoShards(t *testing.T) {
	fc := newFakeCluster(t, 1)
	fc.mu.Lock()
	m := *fc.mu.m
	m.Epoch++
	m.Streams = []shardmap.Stream{{StreamConfig: shardmap.StreamConfig{Name: "z", Shards: 0}}}
	fc.mu.m = &m
	fc.mu.Unlock()
	c := connect(t, fc, 0, WithIdempotence())
	if _, err := c.Publish(testCtx(t), "z", []byte("k"), []byte("v")); err == nil {
		t.Fatal("a publish to a stream of 0 shards was acked")
	}
}

// TestIdempotentPublishHonorsCtxWhenStreamBlocked: an idempotent
// client's PublishAsync on a stream the broker does not read (its
// flow-control window full) returns its context's error, as a plain
// client's does (TestPublishHonorsCtxWhenStreamBlocked); it waited for
// the stream's writer as long as the client lived, and a record larger
// than the window blocked its own sender in the write, whatever the
// client. The record that gave up was not sent and took no sequence:
// once the broker reads again, the records sent and the next one are
// committed once each, in order, under sequences 1, 2, 3, ... of one
// producer id, with no gap.
func TestIdempotentPublishHonorsCtxWhenStreamBlocked(t *testing.T) {
	for _, size := range []int{300, 4 << 10} {
		t.Run(fmt.Sprintf("%dB", size), func(t *testing.T) { idempotentPublishWhenStreamBlocked(t, size) })
	}
}

func idempotentPublishWhenStreamBlocked(t *testing.T, size int) {
	fc := newFakeClusterWith(t, 1, transport.Config{InitialStreamWindow: 1 << 10, MaxStreamWindow: 1 << 10})
	b := fc.brokers[0]
	release := make(chan struct{})
	stall := pubHook(func(str *quic.Stream, first *transport.Publish, r *transport.Reader, w *transport.Writer) bool {
		// Read nothing more until released: the client's writes block
		// once the window is full.
		select {
		case <-release:
		case <-str.Context().Done():
			return true
		}
		b.servePublish(first, r, w)
		return true
	})
	b.publishHook.Store(&stall)
	// A window that takes many records buffered while the flusher waits
	// for a CPU, so that the stream's writer blocks first.
	c := connect(t, fc, 0, WithIdempotence(), WithMaxInFlight(1<<14), WithBlockOnFull(false))
	ctx := testCtx(t)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "s", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	var sent []*Future
	err := wantDeadline(t, publishUntilFailed(ctx, c, size, &sent), "idempotent PublishAsync on a stream the broker does not read")
	if perr := (*PublishError)(nil); !errors.As(err, &perr) || perr.Stream != "s" {
		t.Fatalf("PublishAsync failed with %v, want a PublishError of stream s", err)
	}
	t.Logf("%d records sent before", len(sent))

	close(release)
	next, err := c.Publish(ctx, "s", nil, []byte("next"))
	if err != nil {
		t.Fatalf("the record after the one that gave up: %v", err)
	}
	for i, f := range sent {
		if ack, err := f.Wait(ctx); err != nil || ack.Offset != uint64(i) || ack.Duplicate {
			t.Fatalf("record %d sent before the stream blocked: %+v, %v", i, ack, err)
		}
	}
	if next.Offset != uint64(len(sent)) {
		t.Fatalf("the record after the one that gave up is at offset %d, want %d", next.Offset, len(sent))
	}
	checkSequences(t, fc, len(sent)+1)
}

// checkSequences checks that shard s/0 holds n records, of one producer
// id, numbered 1 to n in offset order.
func checkSequences(t *testing.T, fc *fakeCluster, n int) {
	t.Helper()
	fc.mu.Lock()
	log := fc.mu.logs[shardmap.ShardID{Stream: "s"}]
	fc.mu.Unlock()
	if len(log) != n {
		t.Fatalf("%d records committed, want %d", len(log), n)
	}
	for i, rec := range log {
		if rec.ProducerID != log[0].ProducerID || rec.ProducerSeq != uint64(i+1) {
			t.Fatalf("record %d committed as producer %q sequence %d; want %q sequence %d", i, rec.ProducerID, rec.ProducerSeq, log[0].ProducerID, i+1)
		}
	}
}

// TestIdempotentResendHonorsCtx: whoever opens an idempotent publisher's
// next stream sends the records of unknown outcome again on it first
// (openIdem). If the broker does not read that stream, a publish doing
// so still returns with its context's error; it waited as long as the
// client lived. The records it did not get out go back to the
// publisher's resender, which sends them all again once the broker
// reads: each is committed once, in order.
func TestIdempotentResendHonorsCtx(t *testing.T) {
	fc := newFakeClusterWith(t, 1, transport.Config{InitialStreamWindow: 1 << 10, MaxStreamWindow: 1 << 10})
	b := fc.brokers[0]
	var streams atomic.Int32
	hook := pubHook(func(str *quic.Stream, _ *transport.Publish, r *transport.Reader, _ *transport.Writer) bool {
		switch streams.Add(1) {
		case 1: // read every record, commit and answer none
			for {
				if _, err := r.Read(); err != nil {
					return true
				}
			}
		case 2: // the stream of the first resend: read nothing
			<-str.Context().Done()
			return true
		}
		return false // served
	})
	b.publishHook.Store(&hook)
	c := connect(t, fc, 0, WithIdempotence())
	ctx := testCtx(t)
	p := streamPublisher(t, c, ctx)
	const n = 100
	var fs []*Future
	for range n {
		f, err := p.PublishAsync(ctx, nil, make([]byte, 4<<10)) // 400 KiB in all: more than the stream's buffers take
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, f)
	}
	// The stream fails with the records in flight, their outcome unknown,
	// while this test holds the publisher's opening slot: the resender
	// waits for it, and the test opens the next stream, as a publish does.
	p.opening <- struct{}{}
	p.mu.Lock()
	first := p.mu.sess
	p.mu.Unlock()
	first.fail(lost(errTest))
	opened := make(chan error, 1)
	go func() {
		octx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err := p.openIdem(octx)
		opened <- err
	}()
	wantDeadline(t, opened, "sending records of unknown outcome again on a stream the broker does not read")
	<-p.opening
	for i, f := range fs {
		if ack, err := f.Wait(ctx); err != nil || ack.Offset != uint64(i) {
			t.Fatalf("record %d of unknown outcome, sent again: %+v, %v", i, ack, err)
		}
	}
	checkSequences(t, fc, n)
}

// TestFlushSeesRecordsBeingResent: records an idempotent publisher took
// to send again (takeUnresolved) are in no session until each is sent
// on the new stream, and Flush still waits for them (unresolvedFutures);
// once one resolves it is no longer kept. Flush once saw neither the
// taken records nor, when it looked before the new stream was in place,
// the stream they went on, and returned while they were in flight.
func TestFlushSeesRecordsBeingResent(t *testing.T) {
	st := newIdemState(nil, time.Minute)
	var fs []*Future
	for i := range 3 {
		f := &Future{window: make(chan struct{}, 1), idem: &idemRecord{
			frame: &transport.Publish{Stream: "s", ProducerID: "p", ProducerSeq: uint64(i + 1)}, order: uint64(i + 1)}}
		f.window <- struct{}{}
		fs = append(fs, f)
	}
	st.mu.unresolved = slices.Clone(fs)
	taken := st.takeUnresolved()
	if got := st.unresolvedFutures(); len(got) != 3 {
		t.Fatalf("Flush sees %d of the 3 records taken to be sent again", len(got))
	}
	taken[0].resolve(Ack{}, nil)
	if got := st.unresolvedFutures(); len(got) != 2 || slices.Contains(got, taken[0]) {
		t.Fatalf("after one resolved, Flush sees %d records (the resolved one: %v); want the other 2", len(got), slices.Contains(got, taken[0]))
	}
	if len(taken) != 3 || taken[0] != fs[0] || taken[2] != fs[2] {
		t.Fatal("pruning what Flush sees changed the records the resender sends")
	}
}

// TestResentRecordRefusedBeforeTheTable: a record of unknown outcome
// (its stream lost) that is refused for good when sent again, by a check
// made before the owner's producer table (here a record limit lowered
// meanwhile), fails as of unknown outcome, and the records after it keep
// their producer id. If its first copy was written, so were they, and
// they are answered as written: renumbered at once as after a refusal of
// a record sent once, they were written twice. If it was not, the
// owner's out_of_order_sequence answer, naming the sequence it expects,
// settles it, and they are written under a new producer id, without
// waiting out the retry timeout.
func TestResentRecordRefusedBeforeTheTable(t *testing.T) {
	for _, written := range []bool{true, false} {
		t.Run(fmt.Sprintf("written=%v", written), func(t *testing.T) { resentRecordRefused(t, written) })
	}
}

func resentRecordRefused(t *testing.T, written bool) {
	fc, c, ctx := withStream(t, WithIdempotence())
	b := fc.brokers[0]
	owner := &tableOwner{b: b, acks: map[string][]transport.Ack{}}
	big := bytes.Repeat([]byte("r"), 200)
	var streams atomic.Int32
	hook := pubHook(func(str *quic.Stream, first *transport.Publish, r *transport.Reader, w *transport.Writer) bool {
		n := streams.Add(1)
		for p, i := first, 0; ; i++ {
			switch {
			case n == 1 && i == 0:
				_ = w.Write(owner.answer(p)) // the first record, acked
			case n == 1:
				// The next three: written or not, then the stream is
				// lost unanswered.
				if written {
					owner.answer(p)
				}
				if i == 3 {
					str.CancelRead(0)
					str.CancelWrite(0)
					return true
				}
			case len(p.Value) == len(big):
				// The record limit was lowered: refused before the table.
				_ = w.Write(&transport.Error{Seq: p.Seq, Code: transport.CodePayloadTooLarge, Message: "fake: over the lowered limit"})
			default:
				_ = w.Write(owner.answer(p))
			}
			f, err := r.Read()
			if err != nil {
				return true
			}
			p = f.(*transport.Publish)
		}
	})
	b.publishHook.Store(&hook)

	pub, err := c.Publisher(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if _, err := pub.Publish(ctx, nil, []byte("a")); err != nil {
		t.Fatal(err)
	}
	var futs []*Future
	for _, v := range [][]byte{big, []byte("s1"), []byte("s2")} {
		f, err := pub.PublishAsync(ctx, nil, v)
		if err != nil {
			t.Fatal(err)
		}
		futs = append(futs, f)
	}
	if _, err := futs[0].Wait(ctx); !errors.Is(err, ErrConnectionLost) || !errors.Is(err, transport.ErrPayloadTooLarge) {
		t.Fatalf("the record refused when sent again: %v, want its outcome unknown (ErrConnectionLost) and the refusal", err)
	}
	for i, f := range futs[1:] {
		a, err := f.Wait(ctx)
		if err != nil || a.Duplicate != written {
			t.Fatalf("record %d after the refused one: %+v, %v; want acked, as a duplicate: %v", i+1, a, err, written)
		}
	}
	want := []string{"a", string(big), "s1", "s2"}
	if !written {
		want = []string{"a", "s1", "s2"}
	}
	recs, _, _ := fc.read(shardmap.ShardID{Stream: "s"}, 0, 100)
	var got []string
	for _, r := range recs {
		got = append(got, string(r.Value))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the shard holds %q, want %q: each record once, in the order sent", got, want)
	}
}

// tableOwner answers idempotent publishes as an owner's producer table
// does (broker's producers.go): a sequence written before gets its
// original ack, the next one is written, a sequence past 1 of a producer
// id not known is refused unknown_producer, and any other
// out_of_order_sequence, naming the sequence expected next.
type tableOwner struct {
	b    *fakeBroker
	mu   sync.Mutex
	acks map[string][]transport.Ack // each producer id's, by sequence
}

func (o *tableOwner) answer(p *transport.Publish) transport.Frame {
	o.mu.Lock()
	defer o.mu.Unlock()
	acks, known := o.acks[p.ProducerID]
	switch next := uint64(len(acks)) + 1; {
	case p.ProducerSeq < next:
		a := acks[p.ProducerSeq-1]
		a.Seq, a.Duplicate = p.Seq, true
		return &a
	case p.ProducerSeq == next:
		f := o.b.publish(p)
		if a, ok := f.(*transport.Ack); ok {
			o.acks[p.ProducerID] = append(acks, *a)
		}
		return f
	case !known:
		return &transport.Error{Seq: p.Seq, Code: transport.CodeUnknownProducer, Message: "fake: producer not known"}
	default:
		return &transport.Error{Seq: p.Seq, Code: transport.CodeOutOfOrderSequence, From: next, Message: "fake: a gap"}
	}
}

// publisherGoroutines returns the stacks of goroutines running p's
// resender (resendLoop), the "publisher's goroutine" of an idempotent
// Publisher while it has records of unknown outcome.
func resenderGoroutines() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "client.(*Publisher).resendLoop") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// TestPublisherCloseWaitsForResender: Publisher.Close says it "waits for
// the publisher's goroutine". An idempotent publisher whose broker is
// gone has its resender dialing it; Close must not return while that
// goroutine still runs.
func TestPublisherCloseWaitsForResender(t *testing.T) {
	fc := newFakeCluster(t, 1)
	b := fc.brokers[0]
	c := connect(t, fc, 0, WithIdempotence(), WithHomeFailover(-1), WithDialTimeout(5*time.Second))
	ctx := testCtx(t)
	p := streamPublisher(t, c, ctx)
	b.holdAcks.Store(true)
	f, err := p.PublishAsync(ctx, nil, []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	for b.published.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	b.stop() // the connection is lost: the record's outcome is unknown, the resender redials
	deadline := time.Now().Add(5 * time.Second)
	for resenderGoroutines() == "" && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if resenderGoroutines() == "" {
		t.Fatal("no resender started")
	}
	time.Sleep(200 * time.Millisecond) // it is dialing the broker that is gone
	start := time.Now()
	p.Close()
	took := time.Since(start)
	if _, err := f.Wait(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("record in flight at Close: %v", err)
	}
	if g := resenderGoroutines(); g != "" {
		t.Fatalf("Publisher.Close returned (after %v) with the publisher's resender still running:\n%s", took, g)
	}
}

// TestDrainBoundedByIdleTimeout: awaitDrained says a broker that hangs
// while draining a publish stream (it stopped reading, shutting down, and
// never answers what it took in) holds the publisher's next record no
// longer than the connection's idle timeout (5 s by default). But the
// connection's keep-alives keep a hung broker's connection up: the next
// publish waits as long as its context allows, and the record in flight
