package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// Publisher publishes on one QUIC stream to the broker the client is
// connected to. Records sent on one Publisher, pipelined or not, are
// committed in the order sent within each shard, also when the broker
// forwards them to the shard's owner. Records of different publishers have
// no defined relative order. A Publisher is safe for concurrent use; the
// order between concurrent callers is the order their calls take the
// stream.
//
// If the stream or connection dies, records in flight fail with an error
// matching [ErrConnectionLost] (outcome unknown), and the next publish opens
// a new stream, redialing the broker if needed: order holds within one
// stream, so a caller that retries failed records should expect them after
// records sent since. When the broker shuts down gracefully it answers
// the records it took in; the next record waits for those answers before
// it goes on a new stream, through the new home, so order holds there too.
type Publisher struct {
	c      *Client
	stream string // "" for the client's own publisher, which takes it per call
	// ctx ends when the publisher or its client is closed: it bounds the
	// resender's work (resendLoop), which Close waits for.
	ctx    context.Context
	cancel context.CancelFunc
	sticky uint32 // picks the shard of keyless records

	// window holds a token per record in flight (cap WithMaxInFlight).
	window chan struct{}
	// opening serializes opening a new stream, honoring callers' contexts.
	opening chan struct{}

	// idem numbers the records and sends again those of unknown outcome,
	// for an idempotent client (WithIdempotence); nil otherwise.
	idem *idemState

	// mu guards the current stream and whether the publisher is closed.
	mu struct {
		sync.Mutex
		sess *pubSession
		// ready: sess takes new records. An idempotent publisher's new
		// stream is not ready until the records of unknown outcome have
		// been sent again on it.
		ready  bool
		closed bool
	}
}

func newPublisher(c *Client, stream string) *Publisher {
	p := &Publisher{
		c:       c,
		stream:  stream,
		sticky:  rand.Uint32(),
		window:  make(chan struct{}, c.cfg.maxInFlight),
		opening: make(chan struct{}, 1),
	}
	p.ctx, p.cancel = context.WithCancel(c.ctx)
	if c.cfg.idempotent {
		p.idem = newIdemState(p, c.cfg.retryTimeout)
	}
	return p
}

// Publisher opens an ordered publish stream for stream on the broker the
// client is connected to. Close it when done.
func (c *Client) Publisher(ctx context.Context, stream string) (*Publisher, error) {
	if err := shardmap.ValidateStreamName(stream); err != nil {
		return nil, fmt.Errorf("client: publisher for %q: %w", stream, err)
	}
	p := newPublisher(c, stream)
	if err := c.track(p, nil); err != nil {
		return nil, err
	}
	if _, err := p.session(ctx); err != nil {
		p.Close()
		return nil, fmt.Errorf("client: publisher for %q: %w", stream, err)
	}
	return p, nil
}

// Publish publishes one record to stream and waits until it is durable.
// The key picks the shard (hash(key) mod shards) unless [WithShard] is
// given; records without a key go to one shard picked per client. If ctx
// ends first Publish returns ctx's error, and the record may still be
// written.
//
// A record refused by a broker that is shutting down (an error matching
// [ErrShuttingDown] and not [ErrConnectionLost]) was not written; if that
// broker was the client's home, the home has moved to another live broker
// (see [WithHomeFailover]) and Publish sends the record again through it.
// An [OnResolved] function sees each attempt.
func (c *Client) Publish(ctx context.Context, stream string, key, value []byte, opts ...PublishOpt) (Ack, error) {
	return c.pub.publishSync(ctx, stream, key, value, opts)
}

// PublishAsync sends one record to stream without waiting for its ack and
// returns its [Future]. At most WithMaxInFlight records are in flight; when
// the window is full PublishAsync blocks until a slot frees or ctx ends, or
// fails with [ErrWindowFull] under WithBlockOnFull(false). Records
// published with PublishAsync from one goroutine are committed in that
// order within each shard.
//
// A record refused by a broker that is shutting down is not sent again:
// its Future fails with an error matching [ErrShuttingDown] and not
// [ErrConnectionLost]; it was not written, and is safe to publish again
// (after the records published since, as any retried record).
func (c *Client) PublishAsync(ctx context.Context, stream string, key, value []byte, opts ...PublishOpt) (*Future, error) {
	return c.pub.publish(ctx, stream, key, value, opts, c.cfg.blockOnFull)
}

// Publish publishes one record and waits until it is durable; see
// [Client.Publish].
func (p *Publisher) Publish(ctx context.Context, key, value []byte, opts ...PublishOpt) (Ack, error) {
	return p.publishSync(ctx, p.stream, key, value, opts)
}

// publishSync publishes one record and waits for its outcome. A record
// refused by the home broker because it is shutting down, which moved the
// home (refusedByLeaving), was not written: it is published again through
// the new home, at most maxLeavingResends times.
func (p *Publisher) publishSync(ctx context.Context, stream string, key, value []byte, opts []PublishOpt) (Ack, error) {
	for resent := 0; ; resent++ {
		f, err := p.publish(ctx, stream, key, value, opts, true)
		if err != nil {
			return Ack{}, err
		}
		ack, err := f.Wait(ctx)
		if err == nil || resent >= maxLeavingResends || !p.c.refusedByLeaving(err) {
			return ack, err
		}
	}
}

// maxLeavingResends bounds how many times publishSync sends a record
// again after brokers shutting down refused it: each refusal moved the
// home to another broker, and the cluster rarely restarts more at once.
const maxLeavingResends = 2

// refusedByLeaving reports whether err, a publish's, is a refusal with
// shutting_down (the record was not written: a broker answers it only
// for records it did not take in, or whose log or raft group was closed
// before they were appended or proposed) by a broker the client noted as
// leaving and no longer its home. A record of unknown outcome (its
// connection lost) is not one.
func (c *Client) refusedByLeaving(err error) bool {
	var perr *PublishError
	var werr *transport.Error
	return errors.As(err, &perr) && !errors.Is(err, ErrConnectionLost) &&
		errors.As(err, &werr) && werr.Code == transport.CodeShuttingDown &&
		perr.Broker != c.Addr() && c.isLeaving(perr.Broker)
}

// PublishAsync sends one record without waiting for its ack; see
// [Client.PublishAsync].
func (p *Publisher) PublishAsync(ctx context.Context, key, value []byte, opts ...PublishOpt) (*Future, error) {
	return p.publish(ctx, p.stream, key, value, opts, p.c.cfg.blockOnFull)
}

// Flush waits until every record published before the call has resolved,
// or ctx ends. It reports no per-record outcome: that is in each Future.
func (p *Publisher) Flush(ctx context.Context) error {
	// A session that drains (its broker leaving) stays the publisher's
	// until it has resolved all it carried: the next waits (awaitDrained).
	p.mu.Lock()
	s := p.mu.sess
	p.mu.Unlock()
	var futures []*Future
	if s != nil {
		futures = s.inFlight()
	}
	if p.idem != nil {
		futures = append(futures, p.idem.unresolvedFutures()...)
	}
	for _, f := range futures {
		select {
		case <-f.Done():
		case <-ctx.Done():
			return fmt.Errorf("client: flush: %w", ctx.Err())
		}
	}
	return nil
}

// Flush waits until every record published with Client.Publish or
// Client.PublishAsync before the call has resolved, or ctx ends.
func (c *Client) Flush(ctx context.Context) error { return c.pub.Flush(ctx) }

// Close closes the publisher's stream. Records still in flight fail with
// an error matching [ErrClosed] (outcome unknown): call Flush first to wait
// for them. Close waits for the publisher's goroutine and returns nil.
func (p *Publisher) Close() error {
	p.shutdown()
	p.c.untrack(p, nil)
	return nil
}

func (p *Publisher) shutdown() {
	p.mu.Lock()
	p.mu.closed = true
	s := p.mu.sess
	p.mu.sess = nil
	p.mu.Unlock()
	p.cancel() // ends the resender's dial or wait
	if s != nil {
		s.fail(errClosedInFlight)
		<-s.done
		<-s.flushed
	}
	if p.idem != nil {
		p.idem.abandon(func(*Future) error { return errClosedInFlight }, false)
		p.idem.awaitResender()
	}
}

// publish takes a window slot and sends the record on the current
// session, opening one if there is none.
func (p *Publisher) publish(ctx context.Context, stream string, key, value []byte, opts []PublishOpt, block bool) (*Future, error) {
	if stream == "" {
		return nil, fmt.Errorf("client: publish: empty stream name")
	}
	cfg := publishConfig{shard: -1}
	for _, o := range opts {
		if o != nil {
			cfg = o.applyPublish(cfg)
		}
	}
	// created is the incarnation of the stream whose map picked the
	// shard, if this publisher picked it: a broker places a plain record
	// again, and refuses an idempotent one, if the stream has been
	// created again since (see transport.Publish).
	var created uint64
	if cfg.shard < 0 && (len(key) == 0 || p.idem != nil) {
		p.c.catchUpMap(ctx)
	}
	if cfg.shard < 0 && len(key) == 0 {
		cfg.shard, created = p.keylessShard(stream)
	}
	if p.idem != nil && cfg.shard < 0 {
		// Sequences are per shard: the shard is picked here, by the map.
		_, st, err := p.c.mapWith(ctx, stream)
		if err != nil {
			return nil, &PublishError{Stream: stream, Shard: -1, Broker: p.c.Addr(), Err: err}
		}
		if st.Shards <= 0 {
			return nil, &PublishError{Stream: stream, Shard: -1, Broker: p.c.Addr(), Err: fmt.Errorf("client: the shard map gives stream %q %d shards", stream, st.Shards)}
		}
		if len(key) == 0 {
			cfg.shard = int32(p.sticky % uint32(st.Shards))
		} else {
			cfg.shard = int32(shardmap.ShardFor(key, st.Shards))
		}
		created = st.Created
	}
	if err := p.acquire(ctx, block); err != nil {
		return nil, &PublishError{Stream: stream, Shard: int(cfg.shard), Broker: p.c.Addr(), Err: err}
	}
	tel := p.c.tel
	f := &Future{stream: stream, shard: cfg.shard, window: p.window, then: cfg.then}
	if tel.timed || tel.tracer != nil {
		f.obs = &publishObs{tel: tel, bodySize: len(value)}
		if tel.timed {
			f.obs.start = time.Now()
		}
	}
	var frame *transport.Publish
	if p.idem != nil {
		frame = new(transport.Publish) // kept until acked (idemRecord)
	} else {
		// Encoded by send, not kept: reused (a frame per record was 140
		// bytes allocated per publish).
		frame = publishFrames.Get().(*transport.Publish)
		defer func() {
			*frame = transport.Publish{}
			publishFrames.Put(frame)
		}()
	}
	*frame = transport.Publish{
		Stream:      stream,
		Shard:       cfg.shard,
		Key:         key,
		Value:       value,
		Headers:     tel.startPublish(ctx, f, cfg.headers),
		ProducerID:  cfg.producerID,
		ProducerSeq: cfg.producerSeq,
		Created:     created,
	}
	if p.idem != nil {
		// The publisher numbers it (when it goes on the wire), and keeps
		// the frame to send it again.
		frame.ProducerID, frame.ProducerSeq = "", 0
		f.idem = &idemRecord{frame: frame}
		p.idem.stamp(f)
	}
	// A record waits for the stream's writer (held by a write blocked on
	// flow control, say) no longer than ctx allows, and is then not sent.
	// An idempotent publisher's too: it is numbered only once it holds
	// the writer (pubSession.send), so one that gave up took no sequence,
	// and the next record of its shard takes the one it would have.
	// Retries are bounded from the first failure (read then: a clock read
	// on every publish cost 1.6% of a publishing process's CPU).
	var began time.Time
	for attempt := 0; ; attempt++ {
		s, err := p.session(ctx)
		if err == nil {
			err = s.send(ctx, f, frame)
			if err == nil {
				return f, nil
			}
		}
		if errors.Is(err, errStaleSession) {
			// The stream died before the record went out: nothing was sent.
			if began.IsZero() {
				began = time.Now()
			}
			if attempt < 2 {
				continue
			}
			// An idempotent publisher goes on trying for as long as it
			// would retry a record of unknown outcome.
			if p.idem != nil && time.Since(began) < p.c.cfg.retryTimeout && sleep(ctx, p.c.backoff(attempt)) {
				continue
			}
		}
		<-p.window
		perr := &PublishError{Stream: stream, Shard: int(cfg.shard), Broker: p.c.Addr(), Err: err}
		f.err = perr
		f.finish()
		return nil, perr
	}
}

// publishFrames are the frames of plain publishes, reused once sent.
var publishFrames = sync.Pool{New: func() any { return new(transport.Publish) }}

// acquire takes a window slot, waiting for one if block.
func (p *Publisher) acquire(ctx context.Context, block bool) error {
	select {
	case p.window <- struct{}{}:
		return nil
	default:
	}
	if !block {
		return ErrWindowFull
	}
	select {
	case p.window <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-p.c.ctx.Done():
		return ErrClosed
	}
}

// keylessShard picks the shard of a record with no key and no WithShard:
// one per publisher, from the cached map, whose incarnation of the stream
// it returns too; -1 (the broker decides) when the map does not know the
// stream yet.
func (p *Publisher) keylessShard(stream string) (int32, uint64) {
	if m := p.c.cachedMap(); m != nil {
		if st, ok := m.Stream(stream); ok && st.Shards > 0 {
			return int32(p.sticky % uint32(st.Shards)), st.Created
		}
	}
	return -1, 0
}

// session returns the live session, opening a new stream if there is none.
func (p *Publisher) session(ctx context.Context) (*pubSession, error) {
	if s, err := p.current(); s != nil || err != nil {
		return s, err
	}
	select {
	case p.opening <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.c.ctx.Done():
		return nil, ErrClosed
	}
	defer func() { <-p.opening }()
	if s, err := p.current(); s != nil || err != nil {
		return s, err
	}
	if p.idem != nil {
		return p.openIdem(ctx)
	}
	return p.openStream(ctx, true)
}

// openStream opens a publish stream on the home broker, installs it as the
// publisher's session (ready for new records or not) and starts its
// reader. The caller holds the opening slot.
func (p *Publisher) openStream(ctx context.Context, ready bool) (*pubSession, error) {
	if err := p.awaitDrained(ctx); err != nil {
		return nil, err
	}
	home := p.c.homeConn()
	l, err := home.hold(ctx)
	if err != nil && ctx.Err() == nil {
		// A failed dial may have moved the home (moveHome): nothing was
		// sent, so the new home is tried at once.
		if next := p.c.homeConn(); next != home {
			home = next
			l, err = home.hold(ctx)
		}
	}
	if err != nil {
		return nil, err
	}
	// The session holds the connection until its reader ends.
	held := true
	defer func() {
		if held {
			home.release()
		}
	}()
	str, err := l.conn.OpenStreamSync(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if rerr := l.refusal(err); rerr != nil {
			return nil, rerr // a new connection waits out the backoff
		}
		// The connection is gone (a stateless reset from a restarted
		// broker, say), though its context may not have ended yet: the
		// caller's next attempts met it again, at once, and failed with
		// it. Closed here, it has ended when this returns, and the next
		// attempt dials anew. Nothing was sent.
		l.conn.CloseWithError(0, "")
		return nil, fmt.Errorf("opening publish stream to %s: %w", home.addr, errors.Join(errStaleSession, err))
	}
	s := newPubSession(home.addr, str, p.c.maxFrame(), &p.c.tel.later, &p.c.mapNamed)
	s.idem, s.link = p.idem, l

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.closed || p.c.closed.Load() {
		cancelStream(str)
		return nil, ErrClosed
	}
	p.mu.sess, p.mu.ready = s, ready
	// Add under mu: shutdown takes mu before Close waits on wg.
	p.c.wg.Add(2)
	held = false
	go func() {
		defer p.c.wg.Done()
		defer home.release()
		s.readLoop()
	}()
	go func() {
		defer p.c.wg.Done()
		s.flushLoop()
	}()
	return s, nil
}

// awaitDrained waits until the publisher's session, if it drains (its
// broker takes no more records but still answers those it took in:
// pubSession.writeFailed, leaving), has resolved all it carried, or ctx
// ends (nothing is sent then). A record sent on a new stream, through
// another broker perhaps, could otherwise be committed before records of
// its shard that the draining broker was still committing: both acked,
// out of the order sent. The wait is what the leaving broker takes to
// commit and answer what it took in, about an fsync and a forward. A
// broker that hangs meanwhile keeps its connection alive (keep-alives),
// so the wait is bounded by drainTimeout: past it the old stream is
// ended and what it still carries fails as of unknown outcome
// (ErrConnectionLost), and the records after go on a new stream (a
// caller that retries them should expect them after those, as after any
// lost connection). The caller holds the opening slot, so no record
// overtakes meanwhile.
func (p *Publisher) awaitDrained(ctx context.Context) error {
	p.mu.Lock()
	old := p.mu.sess
	p.mu.Unlock()
	if old == nil || !old.draining() {
		return nil
	}
	timer := time.NewTimer(drainTimeout(p.c.cfg.transport))
	defer timer.Stop()
	select {
	case <-old.done:
		return nil
	case <-timer.C:
		old.fail(lost(fmt.Errorf("the broker at %s did not finish answering the records it took in before leaving", old.addr)))
		<-old.done
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-p.c.ctx.Done():
		return ErrClosed
	}
}

// drainTimeout bounds the wait for a leaving broker's answers: twice the
// connection's idle timeout (ten seconds by default), which is what a
// broker that went silent would have taken to be given up, had the
// connection no keep-alives.
func drainTimeout(tc transport.Config) time.Duration {
	idle := tc.MaxIdleTimeout
	if idle <= 0 {
		idle = 5 * time.Second
	}
	return 2 * idle
}

func (p *Publisher) current() (*pubSession, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.closed {
		return nil, ErrClosed
	}
	if s := p.mu.sess; s != nil && p.mu.ready && s.alive() && (p.idem == nil || !p.idem.hasUnresolved()) {
		return s, nil
	}
	return nil, nil
}
