package client

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestAcksAfterStopSendingKept: a broker shutting down gracefully
// stops reading (STOP_SENDING) and then answers every record it took in,
// as broker.pubSession.stopReading does. The SDK delivers those acks; it
// failed all ten records as "outcome unknown" once a later publish found
// the stream's send side closed. The record published meanwhile is
// committed after the ten, in the order sent.
func TestAcksAfterStopSendingKept(t *testing.T) {
	fc := newFakeCluster(t, 1)
	b := fc.brokers[0]
	const n = 10
	var drained atomic.Bool
	var read atomic.Int32
	committed := make(chan struct{})
	drain := pubHook(func(str *quic.Stream, first *transport.Publish, r *transport.Reader, w *transport.Writer) bool {
		if !drained.CompareAndSwap(false, true) {
			return false // later streams: served normally
		}
		took := []*transport.Publish{first}
		read.Add(1)
		for len(took) < n {
			f, err := r.Read()
			if err != nil {
				return true
			}
			took = append(took, f.(*transport.Publish))
			read.Add(1)
		}
		// Shutting down: stop reading, commit what was taken in, ack it.
		str.CancelRead(quic.StreamErrorCode(transport.CodeShuttingDown))
		time.Sleep(300 * time.Millisecond) // the commit (fsync, a forward)
		for _, p := range took {
			if err := w.Buffer(b.publish(p)); err != nil {
				return true
			}
		}
		close(committed)
		if err := w.Flush(); err != nil {
			t.Logf("broker: writing the acks of committed records: %v", err)
		}
		_ = str.Close()
		return true
	})
	b.publishHook.Store(&drain)
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "s", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	var futs []*Future
	for range n {
		f, err := c.PublishAsync(ctx, "s", nil, []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		futs = append(futs, f)
	}
	for read.Load() < n {
		time.Sleep(time.Millisecond)
	}
	// Wait for the broker's STOP_SENDING to reach the client.
	c.pub.mu.Lock()
	s := c.pub.mu.sess
	c.pub.mu.Unlock()
	<-s.str.Context().Done()
	// The application keeps publishing: the record goes on a new stream,
	// after the ten the broker is still committing.
	next, err := c.PublishAsync(ctx, "s", nil, []byte("next"))
	if err != nil {
		t.Fatalf("next publish: %v", err)
	}
	lost := 0
	for i, f := range futs {
		if _, err := f.Wait(ctx); err != nil {
			lost++
			if lost == 1 {
				t.Logf("future %d: %v", i, err)
			}
		}
	}
	<-committed
	if _, err := next.Wait(ctx); err != nil {
		t.Fatalf("the record published while the broker drained: %v", err)
	}
	recs, _, _ := fc.read(shardmap.ShardID{Stream: "s", Shard: 0}, 0, 100)
	if lost > 0 {
		t.Fatalf("%d of %d records the broker committed and acked were failed as outcome unknown (log holds %d records)", lost, n, len(recs))
	}
	// Sent after the ten, it is committed after them (awaitDrained): on
	// a new stream at once it was written while they were committing,
	// and both it and they were acked, out of the order sent.
	if len(recs) != n+1 || string(recs[n].Value) != "next" {
		var got []string
		for _, r := range recs {
			got = append(got, string(r.Value))
		}
		t.Fatalf("the log holds %q; want the ten drained records, then next", got)
	}
}

// TestFlushWaitsForFailingSession: Flush waits until every record
// published before the call has resolved, also while a session that lost
// its connection is failing its records (it returned with 19,564 of
// 20,000 unresolved).
func TestFlushWaitsForFailingSession(t *testing.T) {
	fc, c, ctx := withStream(t, WithMaxInFlight(1<<20))
	b := fc.brokers[0]
	b.holdAcks.Store(true)
	const n = 20000
	futs := make([]*Future, 0, n)
	for range n {
		f, err := c.PublishAsync(ctx, "s", nil, []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		futs = append(futs, f)
	}
	for b.published.Load() < n {
		time.Sleep(time.Millisecond)
	}
	var bad atomic.Int32
	stop := make(chan struct{})
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		for {
			select {
			case <-stop:
				return
			default:
			}
			fctx, cancel := context.WithTimeout(ctx, 100*time.Microsecond)
			err := c.Flush(fctx)
			cancel()
			if err != nil {
				continue // some still in flight
			}
			unresolved := 0
			for _, f := range futs {
				if !f.resolved() {
					unresolved++
				}
			}
			if unresolved > 0 {
				bad.Store(int32(unresolved))
				return
			}
		}
	}()
	b.holdAcks.Store(false)
	b.restart(t)
	for _, f := range futs {
		f.Wait(ctx)
	}
	close(stop)
	<-flushed
	if u := bad.Load(); u > 0 {
		t.Fatalf("Flush returned nil with %d records published before it still unresolved", u)
	}
}

// TestPublishHonorsCtxWhenStreamBlocked: a broker that stops reading a
// publish stream (its flow-control window full) does not make Publish or
// PublishAsync ignore their context: they waited for the writer a blocked
// write held, until the stream died; and a record larger than the window
// blocked its own sender, in its write.
func TestPublishHonorsCtxWhenStreamBlocked(t *testing.T) {
	for _, size := range []int{300, 4 << 10} {
		t.Run(fmt.Sprintf("%dB", size), func(t *testing.T) { publishWhenStreamBlocked(t, size) })
	}
}

func publishWhenStreamBlocked(t *testing.T, size int) {
	fc := newFakeClusterWith(t, 1, transport.Config{InitialStreamWindow: 1 << 10, MaxStreamWindow: 1 << 10})
	stall := pubHook(func(str *quic.Stream, _ *transport.Publish, _ *transport.Reader, _ *transport.Writer) bool {
		// Read nothing more: the client's writes block once the window is full.
		<-str.Context().Done()
		return true
	})
	fc.brokers[0].publishHook.Store(&stall)
	// A window that takes many records buffered while the flusher waits
	// for a CPU, so that the stream's writer blocks first.
	c := connect(t, fc, 0, WithMaxInFlight(1<<14), WithBlockOnFull(false))
	ctx := testCtx(t)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "s", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	wantDeadline(t, publishUntilFailed(ctx, c, size, nil), "PublishAsync (WithBlockOnFull(false)) on a stream the broker does not read")
	pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := c.Publish(pctx, "s", nil, []byte("x")); done <- err }()
	wantDeadline(t, done, "Publish on a stream the broker does not read")
}

// publishUntilFailed publishes records of size bytes to the stream "s"
// with c.PublishAsync, each with a context of 200ms, on a goroutine of its
// own, until one fails: its error comes on the channel returned, and the
// futures of the records sent before it are then in *sent (if not nil).
// It gives up, with nil, after 100,000 records: a stream's window of a
// few KiB filled long before.
func publishUntilFailed(ctx context.Context, c *Client, size int, sent *[]*Future) <-chan error {
	returned := make(chan error, 1)
	go func() {
		for range 100_000 {
			cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			f, err := c.PublishAsync(cctx, "s", nil, make([]byte, size))
			cancel()
			if err != nil {
				returned <- err
				return
			}
			if sent != nil {
				*sent = append(*sent, f)
			}
		}
		returned <- nil
	}()
	return returned
}

// wantDeadline waits up to 3s for the error of a call whose context had a
// deadline of 200ms, what, and fails unless it is that deadline's (the
// failure shows the client's goroutines, where the call blocks).
func wantDeadline(t *testing.T, returned <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-returned:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: %v; want its context's deadline", what, err)
		}
		t.Logf("%s returned: %v", what, err)
		return err
	case <-time.After(3 * time.Second):
		t.Fatalf("%s (ctx of 200ms) still blocked after 3s:\n%s", what, clientGoroutines())
		return nil
	}
}

// never resolves.
func TestDrainBoundedByIdleTimeout(t *testing.T) {
	fc := newFakeCluster(t, 2)
	b := fc.brokers[0]
	hung := make(chan struct{})
	hook := pubHook(func(str *quic.Stream, _ *transport.Publish, r *transport.Reader, _ *transport.Writer) bool {
		str.CancelRead(quic.StreamErrorCode(transport.CodeShuttingDown)) // stops reading, answers nothing
		select {
		case <-hung:
		case <-str.Context().Done():
		}
		return true
	})
	c := connect(t, fc, 0, WithTransport(transport.Config{MaxIdleTimeout: 2 * time.Second}))
	ctx := testCtx(t)
	p := streamPublisher(t, c, ctx)
	defer close(hung)
	b.publishHook.Store(&hook)
	// The publisher's current stream was opened before the hook: make it
	// open a new one, served by the hook.
	p.mu.Lock()
	s := p.mu.sess
	p.mu.Unlock()
	s.fail(lost(errTest))
	<-s.done
	f1, err := p.PublishAsync(ctx, nil, []byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	pctx, cancel := context.WithTimeout(ctx, 8*time.Second) // over the 5 s idle timeout
	defer cancel()
	start := time.Now()
	_, err = p.PublishAsync(pctx, nil, []byte("two"))
	took := time.Since(start)
	if errors.Is(err, context.DeadlineExceeded) {
		select {
		case <-f1.Done():
		default:
			t.Fatalf("the next publish waited %v (its whole context, past the idle timeout) on a hung broker's drain, and the record in flight is still unresolved; home now %s", took, c.Addr())
		}
	}
	t.Logf("second publish after %v: %v", took, err)
}
