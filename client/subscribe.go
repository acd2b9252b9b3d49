package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// Record is one committed record as a subscriber receives it.
type Record struct {
	Stream      string
	Shard       int
	Offset      uint64
	Timestamp   time.Time // commit time on the owner
	Key, Value  []byte
	Headers     map[string]string
	ProducerID  string // as given with WithProducer
	ProducerSeq uint64
}

// Subscription delivers the records of one stream (all its shards, or the
// one chosen with [Shard]) through [Subscription.Records], an iterator.
// Within a shard records come in offset order; shards are merged in the
// order their records arrive.
//
// The SDK attaches to each shard's owner (following the shard map and the
// brokers' not-owner redirects), and reattaches after a broker restart or
// a lost connection, resuming each shard after the last record it
// received: the application sees no gap and no duplicate. The one
// exception is a shard started with [Latest] that has delivered nothing
// yet: it restarts at the then-latest record.
//
// The stream subscribed to is the one of its name when the subscription
// first receives a record: until then it follows a stream deleted and
// created again with as many shards (the client's map may have been
// behind when Subscribe was called). Once a record is received, a
// stream of the same name created again is another one, and the
// subscription ends with an error matching [ErrUnknownStream] rather
// than read it from its own offsets.
//
// A record counts as delivered when the iterator yields it; [Subscription.Next]
// reports, per shard, the offset after the last delivered record, to resume
// a later subscription with [AtOffsets]. Flow control follows delivery: a
// shard's broker may run at most Credit records ahead of the application.
type Subscription struct {
	c      *Client
	stream string
	credit uint32
	shards []*shardSub
	// inc is the incarnation of the stream subscribed to
	// (shardmap.Stream.Created; 0 from a control plane that has none),
	// which moves to a stream of the same name created again only while
	// no shard has received a record (follow), and shards, how many the
	// stream had.
	inc struct {
		sync.Mutex
		created  uint64
		received bool // a shard received a record of created
	}
	shardCount int
	// cluster is the ID of the cluster the stream is in (shardmap.Map's
	// Cluster, "" from a control plane that has none): a cluster built
	// again counts its epochs from the start, so a stream created there
	// may have the same incarnation, and it is another stream too.
	cluster string

	skipCorrupt bool // see SkipCorrupt

	ctx    context.Context // ends on Stop, Client.Close or a terminal error
	cancel context.CancelFunc

	batches chan batch    // shard goroutines -> iterator; closed when all exited
	conns   subConns      // the connections the shards are read over
	running atomic.Int32  // shard goroutines still running
	stopped chan struct{} // closed by Stop and Client.Close
	closed  chan struct{} // closed when every shard goroutine has exited

	stopOnce  sync.Once
	iterating atomic.Bool

	// The batch being delivered, owned by the iterating goroutine (one at
	// a time, enforced by iterating).
	cur    []Record
	curIdx int
	curSh  *shardSub

	// mu guards what other goroutines read: the terminal error and the
	// per-shard resume offsets.
	mu struct {
		sync.Mutex
		err  error
		next map[int]uint64
	}
}

type batch struct {
	sh      *shardSub
	records []Record
}

// SkipCorrupt makes a subscription go on past records damaged in a shard
// owner's log instead of ending with a [*CorruptError]: it logs a warning
// with the shard and the damaged offsets and resumes the shard after them.
// The records in the damaged range are never delivered. Without it, the
// application decides (see [CorruptError]).
func SkipCorrupt() SubOpt { return subOptFunc(func(c *subConfig) { c.skipCorrupt = true }) }

// Subscribe subscribes to stream from the position from. By default it
// covers every shard of the stream, each read from its owner; [Shard]
// picks one. See [Subscription] for delivery and resumption.
func (c *Client) Subscribe(ctx context.Context, stream string, from Start, opts ...SubOpt) (*Subscription, error) {
	cfg := subConfig{shard: -1, credit: DefaultCredit}
	for _, o := range opts {
		if o != nil {
			o.applySub(&cfg)
		}
	}
	if err := shardmap.ValidateStreamName(stream); err != nil {
		return nil, fmt.Errorf("client: subscribe to %q: %w", stream, err)
	}
	m, st, err := c.mapWith(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("client: subscribe to %q: %w", stream, err)
	}
	var shards []int
	switch {
	case cfg.shard >= st.Shards || cfg.one && cfg.shard < 0:
		return nil, fmt.Errorf("client: subscribe to %q: %w: the stream has %d shards, not shard %d",
			stream, shardmap.ErrNoShard, st.Shards, cfg.shard)
	case cfg.shard >= 0:
		shards = []int{cfg.shard}
	default:
		for i := range st.Shards {
			shards = append(shards, i)
		}
	}
	if from.kind == transport.StartOffset && from.offsets == nil && len(shards) > 1 {
		return nil, fmt.Errorf("client: subscribe to %q: AtOffset is for one shard and the stream has %d: add Shard(n), or use AtOffsets", stream, len(shards))
	}

	s := &Subscription{
		c:           c,
		stream:      stream,
		shardCount:  st.Shards,
		cluster:     m.Cluster,
		credit:      cfg.credit,
		skipCorrupt: cfg.skipCorrupt,
		batches:     make(chan batch, len(shards)+1),
		stopped:     make(chan struct{}),
		closed:      make(chan struct{}),
	}
	s.inc.created = st.Created
	s.ctx, s.cancel = context.WithCancel(c.ctx)
	s.conns.c = c
	s.mu.next = make(map[int]uint64)
	for _, n := range shards {
		kind, off := from.forShard(n)
		if kind == transport.StartOffset {
			s.mu.next[n] = off
		}
		s.shards = append(s.shards, &shardSub{s: s, shard: n, startKind: kind, startOff: off, creditDue: make(chan struct{}, 1)})
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		s.cancel()
		return nil, ErrClosed
	}
	c.mu.subs[s] = struct{}{}
	// Add under c.mu: Close takes c.mu before it waits on wg.
	c.wg.Add(len(s.shards))
	s.running.Store(int32(len(s.shards)))
	for _, sh := range s.shards {
		go sh.run()
	}
	return s, nil
}

// Records returns an iterator over the subscription's records. It yields
// (record, nil) for each record, and ends:
//   - when the loop body breaks (call Records again to go on where it
//     stopped: nothing is lost),
//   - with (Record{}, err) when ctx ends (err wraps ctx's error; the
//     subscription goes on and Records can be called again),
//   - with (Record{}, err) when the subscription fails for good, for
//     example the stream was deleted (err is also [Subscription.Err]),
//     or a shard reached records damaged in its owner's log (a
//     [*CorruptError], after every record before the damage), or a
//     record too large for its broker to send ([ErrPayloadTooLarge],
//     after every record before it; the [BrokerError]'s From is its
//     offset),
//   - without an error after Stop or Client.Close.
//
// Only one goroutine may iterate at a time.
//
//	for rec, err := range sub.Records(ctx) {
//		if err != nil {
//			return err
//		}
//		handle(rec)
//	}
func (s *Subscription) Records(ctx context.Context) iter.Seq2[Record, error] {
	return func(yield func(Record, error) bool) {
		if !s.iterating.CompareAndSwap(false, true) {
			yield(Record{}, errors.New("client: Subscription.Records is already being iterated by another goroutine"))
			return
		}
		defer s.iterating.Store(false)
		for {
			for s.curIdx < len(s.cur) {
				select {
				case <-s.stopped:
					return
				default:
				}
				rec := s.cur[s.curIdx]
				s.cur[s.curIdx] = Record{} // let it be collected once delivered
				s.curIdx++
				s.delivered(s.curSh, rec)
				var sp trace.Span
				if tel := s.c.tel; tel.tracer != nil {
					sp = tel.startProcess(ctx, &rec)
				}
				more := yield(rec, nil)
				if sp != nil {
					sp.End()
				}
				if !more {
					return
				}
			}
			s.cur, s.curIdx, s.curSh = nil, 0, nil
			select {
			case b, ok := <-s.batches:
				if !ok {
					if err := s.Err(); err != nil {
						yield(Record{}, err)
					}
					return
				}
				s.cur, s.curSh = b.records, b.sh
			case <-s.stopped:
				return
			case <-ctx.Done():
				yield(Record{}, fmt.Errorf("client: subscription to %q: %w", s.stream, ctx.Err()))
				return
			}
		}
	}
}

// delivered accounts for rec being handed to the application: its shard's
// resume offset moves past it and its credit goes back to the broker.
func (s *Subscription) delivered(sh *shardSub, rec Record) {
	s.c.tel.delivered.Add(context.Background(), 1)
	s.mu.Lock()
	s.mu.next[rec.Shard] = rec.Offset + 1
	s.mu.Unlock()
	sh.consumed(1)
}

// Next returns, for each shard that has a position, the offset of the next
// record the application has not been given: pass it to [AtOffsets] to
// resume. A shard that has delivered nothing and started at an offset
// reports that offset; one started at Earliest or Latest is absent.
func (s *Subscription) Next() map[int]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.mu.next)
}

// Err returns the error that ended the subscription, or nil while it runs
// and after Stop.
func (s *Subscription) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.err
}

// Closed returns a channel closed once the subscription has ended (Stop,
// Client.Close or a terminal error) and its goroutines have exited.
func (s *Subscription) Closed() <-chan struct{} { return s.closed }

// Stop ends the subscription and waits for its goroutines to exit. Records
// received and not yet delivered are dropped; Next tells where to resume.
// It may be called from the loop body of Records, and more than once.
func (s *Subscription) Stop() {
	s.stop(nil)
	<-s.closed
}

// stop ends the subscription: with err, a terminal error the iterator
// yields after the records before it; with nil, at once and quietly.
func (s *Subscription) stop(err error) {
	if err != nil {
		s.mu.Lock()
		if s.mu.err == nil {
			s.mu.err = err
		}
		s.mu.Unlock()
	} else {
		s.stopOnce.Do(func() { close(s.stopped) })
	}
	s.cancel()
	for _, sh := range s.shards {
		sh.mu.Lock()
		if sh.mu.str != nil {
			cancelStream(sh.mu.str)
		}
		sh.mu.Unlock()
	}
}

// shardExited is called by each shard goroutine as it ends; the last one
// closes the delivery channel.
func (s *Subscription) shardExited() {
	if s.running.Add(-1) == 0 {
		s.cancel()
		s.conns.close()
		s.c.untrack(nil, s)
		close(s.batches)
		close(s.closed)
	}
	s.c.wg.Done()
}

// shardSub is the subscription to one shard: a goroutine that attaches to
// the shard's owner and reattaches after failures, and, per attachment, a
// credit writer that grants back the credit of the records the iterator
// delivers.
//
// Nothing is written to the network on the application's goroutine: the
// iterator only counts what it delivered (consumed) and, at half the
// credit, signals the credit writer, which takes the count and writes the
// Credit frame. A broker that stops reading can block that write (QUIC
// flow control) but never the iterator, nor Stop, which cancels the
// stream and so ends a blocked write.
type shardSub struct {
	s         *Subscription
	shard     int
	startKind transport.StartKind
	startOff  uint64

	// Owned by the shard goroutine: where to resume.
	received bool
	nextRecv uint64
	// lastAddr is the broker the shard was last attached at, and
	// askedLast says it was asked again because the map no longer shows
	// the stream (run).
	lastAddr  string
	askedLast bool

	// creditDue (capacity 1) is signalled when ungranted reaches half the
	// credit; the current attachment's credit writer drains it.
	creditDue chan struct{}

	// mu guards the current stream, which Stop cancels, and the credit
	// accounting, shared by the shard goroutine, the credit writer and
	// the iterator: granted-but-unsent + buffered + ungranted == the
	// subscription's credit. No I/O is done under it.
	mu struct {
		sync.Mutex
		str       *quic.Stream // the current stream, nil while detached
		buffered  int64        // received, not yet delivered
		ungranted uint32       // delivered (or dropped as duplicates), not yet granted back
	}
}

// consumed accounts for n buffered records delivered to the application;
// their credit goes back to the broker, half the credit at a time, by the
// credit writer.
func (sh *shardSub) consumed(n int) {
	sh.mu.Lock()
	sh.mu.buffered -= int64(n)
	sh.mu.ungranted += uint32(n)
	due := sh.mu.ungranted >= sh.creditBatch()
	sh.mu.Unlock()
	if due {
		sh.signalCredit()
	}
}

// grant gives back the credit of n records that were never buffered
// (duplicates dropped on arrival).
func (sh *shardSub) grant(n int) {
	sh.mu.Lock()
	sh.mu.ungranted += uint32(n)
	due := sh.mu.ungranted >= sh.creditBatch()
	sh.mu.Unlock()
	if due {
		sh.signalCredit()
	}
}

// creditBatch is how much credit is granted back at once: half the
// subscription's.
func (sh *shardSub) creditBatch() uint32 { return max(sh.s.credit/2, 1) }

func (sh *shardSub) signalCredit() {
	select {
	case sh.creditDue <- struct{}{}:
	default: // already signalled
	}
}

// writeCredit is an attachment's credit writer: it writes the credit the
// iterator signals until stop is closed. A failed write cancels the
// stream, so the shard goroutine's read ends and it reattaches (with the
// credit recomputed from what is buffered).
func (sh *shardSub) writeCredit(w *transport.Writer, str *quic.Stream, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-sh.creditDue:
		}
		sh.mu.Lock()
		n := sh.mu.ungranted
		if n < sh.creditBatch() { // a signal left from an earlier stream
			sh.mu.Unlock()
			continue
		}
		sh.mu.ungranted = 0
		sh.mu.Unlock()
		if err := w.Write(&transport.Credit{Records: n}); err != nil {
			cancelStream(str)
			return
		}
	}
}

func (sh *shardSub) String() string { return fmt.Sprintf("%s/%d", sh.s.stream, sh.shard) }

// run attaches to the shard's owner until the subscription ends.
func (sh *shardSub) run() {
	defer sh.s.shardExited()
	s, c := sh.s, sh.s.c
	ctx := s.ctx
	var redirect string
	failures, redirects, outOfRange := 0, 0, 0
	for ctx.Err() == nil {
		addr := redirect
		redirect = ""
		if addr == "" {
			a, err := sh.ownerAddr(ctx, failures)
			switch {
			case err == nil:
			case errors.Is(err, shardmap.ErrUnknownStream) && sh.lastAddr != "" && !sh.askedLast:
				// A principal's map shows only the streams it may use:
				// a revoke hides the stream as a delete does. The broker
				// it was read from last says which (unauthorized, or
				// unknown_stream).
				sh.askedLast = true
				a, err = sh.lastAddr, nil
			case errors.Is(err, shardmap.ErrUnknownStream) || errors.Is(err, shardmap.ErrNoShard):
				s.stop(fmt.Errorf("client: subscription to %s: %w", sh, err))
				return
			}
			if err != nil {
				failures++
				c.cfg.logger.Warn("client: subscription cannot find the shard's owner; retrying", "shard", sh.String(), "err", err)
				sleep(ctx, c.backoff(failures))
				continue
			}
			addr = a
		}

		progressed, err := sh.attach(ctx, addr)
		if ctx.Err() != nil || errors.Is(err, ErrClosed) {
			return
		}
		if progressed {
			failures, redirects, outOfRange = 0, 0, 0
			sh.askedLast = false
		}
		var werr *transport.Error
		isWire := !errors.Is(err, ErrConnectionLost) && errors.As(err, &werr)
		if shuttingDown(err) {
			// The broker read from is going away (it closed the
			// connection or the stream so; one that closed the
			// connection was noted by link.failure too): the next
			// attempt goes to another replica, if the shard has one. A
			// shutting_down error frame alone does not say so: a broker
			// sends one when the shard's log or replica is closed under
			// a read (moved away, replaced), and the broker stays.
			c.brokerLeaving(addr, err)
		}
		switch {
		case isWire && werr.Code == transport.CodeNotOwner:
			redirects++
			if m, rerr := c.refreshMap(ctx); rerr == nil && werr.Owner != "" {
				if n, ok := m.Node(werr.Owner); ok && n.Addr != "" {
					redirect = n.Addr
				}
			}
			c.cfg.logger.Debug("client: subscription redirected", "shard", sh.String(), "from", addr, "owner", werr.Owner, "to", redirect)
			if redirects <= 3 {
				continue // follow it at once
			}
		case isWire && werr.Code == transport.CodeUnknownStream && !sh.received && failures < 5:
			// A stream just created may not have reached that broker yet.
		case isWire && werr.Code == transport.CodeOutOfRange && outOfRange+1 < sh.replicas():
			// Replicas of one shard retain from different offsets (one
			// that rejoined by a snapshot starts where the leader had
			// compacted, retention passes run apart): another may still
			// hold the offset. The next attempt goes to the next replica.
			outOfRange++
			c.cfg.logger.Info("client: subscription offset out of range on one replica; trying another", "shard", sh.String(), "broker", addr, "err", werr.Message)
		case isWire && werr.Code == transport.CodeCorrupt:
			cerr := &CorruptError{Stream: s.stream, Shard: sh.shard, From: werr.From, To: werr.To, Broker: addr, Err: werr}
			if !s.skipCorrupt {
				s.stop(cerr)
				return
			}
			// Go on after the damage at once: it will not heal.
			c.cfg.logger.Warn("client: subscription skips damaged records", "shard", sh.String(),
				"from", cerr.From, "to", cerr.To, "broker", addr, "err", werr.Message)
			if !sh.received || sh.nextRecv <= cerr.To {
				sh.received, sh.nextRecv = true, cerr.To+1
			}
			redirect = addr
			continue
		case isWire && !retryable(werr.Code):
			s.stop(fmt.Errorf("client: subscription to %s via %s: %w", sh, addr, err))
			return
		default:
			c.cfg.logger.Info("client: subscription lost its broker; reattaching", "shard", sh.String(), "broker", addr, "err", err)
		}
		failures++
		if !sleep(ctx, c.backoff(failures)) {
			return
		}
		if !isWire || werr.Code != transport.CodeNotOwner {
			// The owner may have moved. Each broker asked gets the request
			// timeout: if none answers, reattach by the map held.
			_, _ = c.refreshMap(ctx)
		}
	}
}

// retryable reports whether a subscription error with code can go away
// by itself.
func retryable(code transport.ErrorCode) bool {
	switch code {
	case transport.CodeNotOwner, transport.CodeUnavailable, transport.CodeShuttingDown,
		transport.CodeTimeout, transport.CodeInternal:
		return true
	}
	return false
}

// replicas returns how many replicas the shard has in the client's map (1
// for a shard of replication factor 1).
func (sh *shardSub) replicas() int {
	if m := sh.s.c.cachedMap(); m != nil {
		if st, ok := m.Stream(sh.s.stream); ok {
			return max(1, len(st.Placement.Replicas(sh.shard)))
		}
	}
	return 1
}

// ownerAddr returns the address of the shard's owner in the client's map.
// A replicated shard can be read from any of its replicas (each serves
// committed records only, at the same offsets): it returns a live one,
// the owner first, the next ones after failures attaching.
func (sh *shardSub) ownerAddr(ctx context.Context, failures int) (string, error) {
	c := sh.s.c
	m, st, err := c.mapWith(ctx, sh.s.stream)
	if err != nil {
		return "", err
	}
	if sh.s.cluster != "" && m.Cluster != "" && m.Cluster != sh.s.cluster {
		return "", fmt.Errorf("client: stream %q: %w (%w): the cluster of the stream subscribed to (%s) is gone; the brokers now serve cluster %s",
			sh.s.stream, &transport.Error{Code: transport.CodeUnknownStream, Message: "cluster built again"}, shardmap.ErrUnknownStream, sh.s.cluster, m.Cluster)
	}
	if created, ok := sh.s.follow(st); !ok {
		return "", fmt.Errorf("client: stream %q: %w (%w): the stream subscribed to, of map epoch %d, was deleted, and one of its name created at epoch %d",
			sh.s.stream, &transport.Error{Code: transport.CodeUnknownStream, Message: "deleted"}, shardmap.ErrUnknownStream, created, st.Created)
	}
	if set := st.Placement.Replicas(sh.shard); len(set) > 1 {
		// One that said it is shutting down (isLeaving) only if no
		// other is live: the map may show it live for a while yet.
		for _, skipLeaving := range []bool{true, false} {
			for i := range set {
				if n, ok := m.Node(set[(failures+i)%len(set)]); ok && n.Live && n.Addr != "" && !(skipLeaving && c.isLeaving(n.Addr)) {
					return n.Addr, nil
				}
			}
		}
	}
	n, err := m.Owner(sh.s.stream, sh.shard)
	if err != nil {
		return "", err
	}
	if n.Addr == "" {
		return "", fmt.Errorf("client: shard %s is owned by %q, which has no address in the map (epoch %d)", sh, n.ID, m.Epoch)
	}
	return n.Addr, nil
}

// follow says whether st, the stream of the subscription's name in the
// client's map, is the one subscribed to, which it becomes if the
// subscription has received nothing yet and st has as many shards. It
// returns the incarnation subscribed to.
func (s *Subscription) follow(st *shardmap.Stream) (created uint64, ok bool) {
	s.inc.Lock()
	defer s.inc.Unlock()
	if s.inc.created == 0 || st.Created == s.inc.created {
		return s.inc.created, true
	}
	if s.inc.received || st.Shards != s.shardCount || st.Created == 0 {
		return s.inc.created, false
	}
	s.c.cfg.logger.Info("client: the stream subscribed to was created again before the subscription received a record; it reads the new one",
		"stream", s.stream, "created", st.Created, "was", s.inc.created)
	s.inc.created = st.Created
	return st.Created, true
}

// incarnation returns the incarnation an attachment subscribes to.
func (s *Subscription) incarnation() uint64 {
	s.inc.Lock()
	defer s.inc.Unlock()
	return s.inc.created
}

// receive says whether records an attachment made at incarnation created
// may be received: not once the subscription follows another (follow),
// and from then on the subscription follows none.
func (s *Subscription) receive(created uint64) bool {
	s.inc.Lock()
	defer s.inc.Unlock()
	if created != s.inc.created {
		return false
	}
	s.inc.received = true
	return true
}

// errIncarnationMoved ends an attachment made to a stream the
// subscription no longer follows: it attaches again, to the one it does.
var errIncarnationMoved = &transport.Error{Code: transport.CodeUnknownStream, Message: "the stream was created again before a record was received"}

// attach subscribes once on the broker at addr and feeds the records it
// sends to the iterator until the stream ends. progressed says the
// attachment did useful work (records, or a long life), so backoff resets.
func (sh *shardSub) attach(ctx context.Context, addr string) (progressed bool, err error) {
	s, c := sh.s, sh.s.c
	sc, err := s.conns.get(addr)
	if err != nil {
		return false, err
	}
	defer s.conns.put(sc)
	l, err := sc.b.get(ctx)
	if err != nil {
		return false, err
	}
	str, err := l.conn.OpenStreamSync(ctx)
	if err != nil {
		return false, c.streamErr(ctx, l, err)
	}
	sh.lastAddr = addr
	// Stop cancels the stream registered here, so the read below ends.
	sh.mu.Lock()
	if ctx.Err() != nil {
		sh.mu.Unlock()
		cancelStream(str)
		return false, ctx.Err()
	}
	sh.mu.str = str
	sh.mu.Unlock()
	started := time.Now()
	stopCredit := make(chan struct{})
	creditDone := make(chan struct{})
	defer func() {
		sh.mu.Lock()
		sh.mu.str = nil
		sh.mu.Unlock()
		cancelStream(str) // ends a credit write blocked by flow control
		close(stopCredit)
		<-creditDone
		if time.Since(started) > c.cfg.backoffMax {
			progressed = true
		}
	}()

	created := s.incarnation()
	sub := &transport.Subscribe{Stream: s.stream, Shard: int32(sh.shard), Start: sh.startKind, Offset: sh.startOff, Created: created, Cluster: s.cluster}
	if m := c.cachedMap(); m != nil {
		// A broker behind it that refuses the subscription catches up to
		// it first: the grant may be in it.
		sub.Epoch = m.Epoch
	}
	if sh.received {
		sub.Start, sub.Offset = transport.StartOffset, sh.nextRecv
	}
	w := transport.NewWriter(str)
	w.SetMaxFrame(c.maxFrame())
	sh.mu.Lock()
	// The new stream's credit keeps received-but-undelivered records
	// counted: buffered + credit == the subscription's credit. Credit
	// granted back to the old stream and not yet sent is part of it. A
	// full buffer subscribes with none (the broker waits for a grant):
	// one more each time would hold more than Credit records, and pass
	// the broker's MaxCredit once granted back.
	sub.Credit = uint32(max(int64(s.credit)-sh.mu.buffered, 0))
	sh.mu.ungranted = 0
	sh.mu.Unlock()
	// Not under the lock: Stop cancels str, which ends a blocked write.
	if err := w.Write(sub); err != nil {
		close(creditDone)
		return false, c.streamErr(ctx, l, err)
	}
	go func() {
		defer close(creditDone)
		sh.writeCredit(w, str, stopCredit)
	}()

	r := transport.NewReader(str, c.maxFrame())
	for {
		f, err := r.Read()
		if err != nil {
			var werr *transport.Error
			if errors.As(err, &werr) && werr.Code == transport.CodeFrameTooLarge && ctx.Err() == nil {
				// Records larger than this client reads (the brokers'
				// --max-record-bytes raised past its MaxFrame): every
				// attempt would meet them again.
				return progressed, fmt.Errorf("%w: records of %s are larger than this client reads: raise its transport.Config.MaxFrame (WithTransport) to the brokers' frame limit", werr, sh)
			}
			if errors.Is(err, io.EOF) {
				err = fmt.Errorf("broker ended the subscription stream: %w", io.ErrUnexpectedEOF)
			}
			return progressed, c.streamErr(ctx, l, err)
		}
		l.answer()
		switch f := f.(type) {
		case *transport.Records:
			if !s.receive(created) {
				return progressed, errIncarnationMoved
			}
			recs, dups := sh.convert(f)
			if dups > 0 {
				sh.grant(dups) // a duplicate took credit; give it back
			}
			if len(recs) == 0 {
				continue
			}
			progressed = true
			sh.mu.Lock()
			sh.mu.buffered += int64(len(recs))
			sh.mu.Unlock()
			select {
			case s.batches <- batch{sh: sh, records: recs}:
			case <-ctx.Done():
				return progressed, ctx.Err()
			}
		case *transport.Error:
			return progressed, f
		case *transport.MapUpdate:
			c.storeMap(f.Map)
		default:
			return progressed, c.streamErr(ctx, l, &transport.Error{Code: transport.CodeUnexpectedFrame, Message: "subscription got a " + f.Type().String() + " frame"})
		}
	}
}

// convert turns a Records frame into Records, dropping any the shard has
// already received (dups counts them), and moves the resume point.
func (sh *shardSub) convert(f *transport.Records) (recs []Record, dups int) {
	recs = make([]Record, 0, len(f.Records))
	for i := range f.Records {
		r := &f.Records[i]
		if sh.received && r.Offset < sh.nextRecv {
			dups++
			continue
		}
		sh.received, sh.nextRecv = true, r.Offset+1
		recs = append(recs, Record{
			Stream:      sh.s.stream,
			Shard:       sh.shard,
			Offset:      r.Offset,
			Timestamp:   time.Unix(0, r.Timestamp),
			Key:         r.Key,
			Value:       r.Value,
			Headers:     r.Headers,
			ProducerID:  r.ProducerID,
			ProducerSeq: r.ProducerSeq,
		})
	}
	return recs, dups
}
