package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/felix-broker/felix/internal/msgtrace"
	"github.com/felix-broker/felix/transport"
)

// Ack says a record is durable: its owner wrote it and fsynced its log.
type Ack struct {
	Stream    string
	Shard     int
	Offset    uint64    // the record's offset in its shard, dense from 0
	Timestamp time.Time // commit time on the owner
	Owner     string    // node id of the shard's owner, which committed it
	Via       string    // node id of the broker the record was published through
	Forwarded bool      // Via forwarded it to Owner
	// Duplicate: the record had been committed by an earlier attempt of
	// the same idempotent publish (WithIdempotence retried it, its first
	// ack having been lost); it was not written again, and Offset and
	// Timestamp are the original's.
	Duplicate bool
}

func ackFrom(a *transport.Ack) Ack {
	return Ack{
		Stream:    a.Stream,
		Shard:     int(a.Shard),
		Offset:    a.Offset,
		Timestamp: time.Unix(0, a.Timestamp),
		Owner:     a.Owner,
		Via:       a.Via,
		Forwarded: a.Forwarded,
		Duplicate: a.Duplicate,
	}
}

// Future is the pending outcome of an asynchronous publish. It resolves
// exactly once, with an [Ack] or a [*PublishError].
type Future struct {
	// done is made by the first Done or Wait that finds f pending, or is
	// closedDone once f resolved: a Future whose caller never waits on
	// it (PublishAsync with OnResolved, or a Flush) costs no channel.
	done   atomic.Pointer[chan struct{}]
	ack    Ack
	err    error
	stream string
	shard  int32
	// window is the publisher's in-flight window, released on resolve.
	window chan struct{}

	then func(Ack, error) // OnResolved's, if any

	// obs is the publish's telemetry, set when the client traces or
	// records metrics; idem is set for an idempotent publisher's record.
	// Each in its own allocation, made only when used: a Future is
	// allocated per record, and carrying both cost a publisher 300 bytes
	// per record it did not use.
	obs  *publishObs
	idem *idemRecord
}

// publishObs is what the client's telemetry keeps of one publish.
type publishObs struct {
	tel      *telemetry
	span     trace.Span        // the producer span once started; nil when not traced
	reserved trace.SpanContext // its context, when reserved before the send
	parent   context.Context   // the publish's context, until the reserved span starts
	root     bool              // the reserved span has no parent
	start    time.Time         // zero unless metrics are recorded or the publish is traced
	end      time.Time         // when it resolved; zero when start is
	// For the producer span's attributes: the value's size, and, set as
	// the record is sent, the broker it went to and its producer id.
	bodySize   int
	broker     string
	producerID string
}

// idemRecord is what an idempotent publisher keeps of a record (see
// idempotent.go): the frame, kept to be sent again; the record's place in
// the publisher's send order; when its outcome first became unknown, and
// why.
type idemRecord struct {
	frame    *transport.Publish
	order    uint64
	failedAt time.Time
	cause    error
}

// closedDone is the done channel of every resolved Future.
var closedDone = func() *chan struct{} {
	c := make(chan struct{})
	close(c)
	return &c
}()

// Done returns a channel closed when the future has resolved.
func (f *Future) Done() <-chan struct{} {
	if p := f.done.Load(); p != nil {
		return *p
	}
	c := make(chan struct{})
	if f.done.CompareAndSwap(nil, &c) {
		return c // resolve closes it
	}
	return *f.done.Load() // resolved meanwhile: closedDone
}

// resolved reports whether f has resolved; its outcome is then readable.
func (f *Future) resolved() bool { return f.done.Load() == closedDone }

// Wait waits for the outcome of the publish: its Ack, or the
// [*PublishError] it failed with. If ctx ends first Wait returns ctx's
// error; the publish itself goes on, and Wait can be called again.
func (f *Future) Wait(ctx context.Context) (Ack, error) {
	if f.resolved() {
		return f.ack, f.err
	}
	select {
	case <-f.Done():
		return f.ack, f.err
	case <-ctx.Done():
		return Ack{}, fmt.Errorf("client: waiting for the ack of a record to %s: %w", f.stream, ctx.Err())
	}
}

// resolve settles f. Only the one who removed f from its session's
// pending set calls it, so it runs once. It leaves f's telemetry to
// finish or finishLater, which the caller runs once the waiter is
// released.
func (f *Future) resolve(ack Ack, err error) {
	if o := f.obs; o != nil && (!o.start.IsZero() || o.span != nil) {
		o.end = time.Now()
	}
	f.ack, f.err = ack, err
	<-f.window
	if p := f.done.Swap(closedDone); p != nil {
		close(*p) // a waiter made it
	}
}

// notify calls f's OnResolved function, if any, on this goroutine. f has
// resolved.
func (f *Future) notify() {
	if f.then != nil {
		f.then(f.ack, f.err)
	}
}

// notifyLater calls the OnResolved functions of fs, resolved, on the
// client's deferred runner (within a few milliseconds; at once after the
// client closed): for futures resolved where a lock is held, so that a
// function cannot deadlock on the session's write lock. The runner is the
// client's: Close runs what is queued and waits for it.
func notifyLater(later *msgtrace.Deferred, fs []*Future) {
	if !slices.ContainsFunc(fs, func(f *Future) bool { return f.then != nil }) {
		return
	}
	later.Add(func() {
		for _, f := range fs {
			f.notify()
		}
	})
}

// finish records f's telemetry once it has resolved.
func (f *Future) finish() {
	if f.obs != nil {
		f.obs.tel.finishPublish(f)
	}
}

// finishLater has f's telemetry recorded off the path of the next publish
// (telemetry.later).
func (f *Future) finishLater() {
	if f.obs != nil && !f.obs.end.IsZero() {
		f.obs.tel.later.Add(f.finish)
	}
}

// errStaleSession says a session died before a record was sent on it: the
// record can go on a new session.
var errStaleSession = errors.New("client: publish stream is gone")

// errClosedInFlight is the cause of records in flight when their publisher
// or client is closed.
var errClosedInFlight = fmt.Errorf("%w before the ack arrived; outcome unknown (the record may or may not have been written)", ErrClosed)

// pubSession is one publish stream: the caller writes Publish frames
// holding the writer (or buffers them there for flushLoop), and one reader goroutine
// resolves the futures from Acks and Errors.
// A session that fails stays failed; its publisher opens a new one.
type pubSession struct {
	addr     string
	link     *link // the connection str is on; nil in tests
	str      *quic.Stream
	maxFrame int
	idem     *idemState // non-nil for an idempotent publisher

	// writer, a lock of capacity one, serializes writers: it is held
	// from choosing a record's Seq to writing it, so Seqs go on the wire
	// in order, and never while waiting for an answer. A sender writes
	// only what the stream takes at once (TryFlush); only flushLoop's
	// write blocks on flow control (a broker that stops reading) while
	// holding it, and a sender waits for it with its context
	// (lockWriter), so a publish still ends when its context does. Lock
	// order: writer, then mu.
	writer chan struct{}
	w      *transport.Writer
	// buffered says records wait in w for flushLoop, which has been
	// kicked. Guarded by writer.
	buffered bool
	kick     chan struct{} // capacity 1: wakes flushLoop

	// mu guards the sequence number, the futures waiting for an answer and
	// the session's fate. The reader takes only mu, so a writer blocked on
	// flow control never keeps acks from being read.
	mu struct {
		sync.Mutex
		seq     uint64
		pending map[uint64]*Future
		err     error // non-nil once the session has failed
		// writeErr is non-nil once the stream's write side has failed
		// while its read side may still carry answers (writeFailed).
		writeErr error
		// failing are the futures fail took from pending and is still
		// resolving: Flush waits for them too.
		failing map[uint64]*Future
		// leftAt is the Seq of the first record the broker refused
		// saying it is leaving (leaving); 0 if none. It took in no
		// record after that one: those still pending when the session
		// fails were not written, whatever ended it.
		leftAt uint64
	}
	done    chan struct{} // closed when the reader has exited
	flushed chan struct{} // closed when flushLoop has exited

	// left: the session's broker refused a record saying it is shutting
	// down (leaving). Set by the reader; flushLoop then ends the stream's
	// write side (FIN) once what was buffered is written, and sendEnded
	// (guarded by writer) says it has.
	left      atomic.Bool
	sendEnded bool

	later *msgtrace.Deferred // the client's, for OnResolved functions (notifyLater)

	// mapNamed is the client's Client.mapNamed: the reader raises it to
	// the epoch of a broker that refused a record of a stream its map no
	// longer holds as the publisher knew it.
	mapNamed *atomic.Uint64
}

func newPubSession(addr string, str *quic.Stream, maxFrame int, later *msgtrace.Deferred, mapNamed *atomic.Uint64) *pubSession {
	s := &pubSession{addr: addr, str: str, maxFrame: maxFrame, done: make(chan struct{}), later: later, kick: make(chan struct{}, 1), mapNamed: mapNamed,
		writer: make(chan struct{}, 1), flushed: make(chan struct{})}
	s.w = transport.NewWriter(str)
	s.w.SetMaxFrame(maxFrame)
	s.mu.pending = make(map[uint64]*Future)
	return s
}

func (s *pubSession) alive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.err == nil && s.mu.writeErr == nil
}

// draining reports whether the session takes no more records but its
// reader still resolves those in flight (writeFailed).
func (s *pubSession) draining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.err == nil && s.mu.writeErr != nil
}

// writeFailed handles the failure of the stream's write side. The read
// side may still carry the answers to what the broker read: a broker
// shutting down gracefully stops reading (STOP_SENDING), then commits and
// acknowledges everything it took in. So the session takes no more
// records (the publisher opens another), and its reader goes on resolving
// those in flight until the broker ends the stream; what is unanswered
// then fails as of unknown outcome. Failing them all at once answered
// "may or may not have been written" for records the broker had committed
// and acknowledged. An idempotent publisher's session fails at once: it
// sends the records of unknown outcome again, in order, and the broker
// answers those it has as duplicates.
func (s *pubSession) writeFailed(cause error) {
	s.noteLeaving(cause)
	if s.idem != nil {
		s.fail(cause)
		return
	}
	s.mu.Lock()
	if s.mu.err == nil && s.mu.writeErr == nil {
		s.mu.writeErr = cause
	}
	s.mu.Unlock()
	s.str.CancelWrite(0)
}

// noteLeaving notes the session's broker as shutting down
// (brokerLeaving, which moves the home off it) if err, the end of the
// stream's write side or of its connection, says it is going away: a
// broker shutting down stops reading its publish streams, and refuses
// new ones, with shutting_down.
func (s *pubSession) noteLeaving(err error) {
	if s.link != nil && shuttingDown(err) {
		s.link.b.c.brokerLeaving(s.addr, err)
	}
}

// lockWriter takes the writer, waiting at most until ctx ends (nothing
// was sent: ctx's error) or the session's reader has exited (a failed
// session: errStaleSession).
func (s *pubSession) lockWriter(ctx context.Context) error {
	select {
	case s.writer <- struct{}{}:
		return nil
	default:
	}
	select {
	case s.writer <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.done:
		return errStaleSession
	}
}

func (s *pubSession) unlockWriter() { <-s.writer }

// send writes p, whose outcome f will carry, or buffers it for flushLoop
// (when many are in flight, or the stream's window is full). It returns
// errStaleSession if the session failed before p was sent, or ctx's error
// if ctx ended while another write held the stream (p was not sent and f
// is untouched: an idempotent publisher's p took no sequence); any other
// failure resolves f.
func (s *pubSession) send(ctx context.Context, f *Future, p *transport.Publish) error {
	if err := s.lockWriter(ctx); err != nil {
		return err
	}
	defer s.unlockWriter()
	if err := s.str.Context().Err(); err != nil {
		// The stream's write side is known dead: this record can go on
		// a new stream, and those in flight on this one are answered as
		// the broker answers them (writeFailed).
		s.writeFailed(s.connErr(context.Cause(s.str.Context())))
		return errStaleSession
	}
	s.mu.Lock()
	if s.mu.err != nil || s.mu.writeErr != nil {
		s.mu.Unlock()
		return errStaleSession
	}
	s.mu.seq++
	p.Seq = s.mu.seq
	if f.idem != nil && p.ProducerSeq == 0 {
		// Sequences are taken in the order records go on the wire.
		p.ProducerID, p.ProducerSeq = s.idem.next(p.Stream, p.Shard)
	}
	if o := f.obs; o != nil {
		o.broker, o.producerID = s.addr, p.ProducerID
	}
	// p is encoded before f is pending: once it is, a failing session
	// hands f to an idempotent publisher's resender, which sends p again
	// on a new session (setting its Seq, perhaps renumbering it), so p
	// must be read here no more by then. Encoding only copies into the
	// writer's buffer: nothing here waits while mu is held.
	if err := s.w.Buffer(p); err != nil {
		// It did not encode (too large, say): nothing was sent.
		if s.idem != nil {
			s.idem.unsent(p) // its sequence is taken back, or skipped
		}
		s.mu.Unlock()
		f.resolve(Ack{}, s.publishErr(f, err))
		notifyLater(s.later, []*Future{f}) // holding the writer
		f.finish()
		return nil
	}
	s.mu.pending[p.Seq] = f
	inFlight := len(s.mu.pending)
	s.mu.Unlock()

	if inFlight > inlineInFlight {
		// Many are in flight: flushLoop writes this one with whatever
		// else is buffered by the time it runs.
		s.kickFlush()
		return nil
	}
	// Written now, with anything buffered before it, if the stream takes
	// it at once; a sender never waits on flow control itself.
	written, err := s.w.TryFlush()
	if err != nil {
		s.writeFailed(s.connErr(err)) // f is answered with the rest, by the reader
		return nil
	}
	if !written {
		// The stream's window is full (a broker that reads slowly, or
		// not at all): flushLoop writes it once the window opens, and
		// senders wait for the writer meanwhile with their contexts.
		s.kickFlush()
		return nil
	}
	s.buffered = false
	if inFlight == 1 && f.obs != nil {
		// The only record in flight on the stream, as in a closed loop:
		// the telemetry of the records before it is built while it is on
		// its way, rather than at a tick that may fall on the caller's
		// path. Under load (more in flight) the ticks build it.
		s.later.Soon()
	}
	return nil
}

// inlineInFlight is the most records in flight on a stream, the new one
// included, with which a record is still written at once by its sender;
// past it the record is buffered for flushLoop. At light load a record
// often joins one or two others in flight (an open loop at 1,000/s on a
// 2-vCPU VM: a quarter of its records), and the hand-off to flushLoop, a
// wake-up, cost them more than a packet of their own; a pipelining
// publisher keeps far more in flight (the bench: 32).
const inlineInFlight = 4

// flushLoop writes the records send buffered while many others were in
// flight on the stream, until the reader exits. It is the session's
// second goroutine, in the way the NATS client's flusher goroutine writes
// what publishes buffered meanwhile.
//
// A record with few others in flight (inlineInFlight) is written by its
// sender at once, without a hand-off. One that joins many is only
// buffered, and this goroutine is woken; by the time it runs (the
// sender's goroutine readies it on its own P, so it usually runs once the
// sender waits), and after it yields once more, the sender's burst is
// buffered too and goes in one write. Under load that puts many records
// in each QUIC packet: writing each at once cost a packet and a sendmsg
// apiece, which on loopback also pays the receiver's kernel path, and
// was a third of the bench client's CPU. Measured on a 2-vCPU VM,
// `felixctl bench --local` with 64 publishers of 32 in flight, two
// alternated pairs of runs: 280–299k acked records/s against 236–244k,
// closed-loop direct and forwarded p50 unchanged (one record in flight
// is written at once, as before). A stream blocked by flow control
// blocks only its own loop: a sender writes only what the stream takes
// at once (TryFlush), and leaves the rest to this loop too.
//
// A record is written by its sender, or buffered for this loop, while
// its sender holds the writer; either way it is on its way once send
// returns (pending), and its Future carries its outcome. Its sender never
// waits on flow control: only for the writer, with its context.
func (s *pubSession) flushLoop() {
	defer close(s.flushed)
	for {
		select {
		case <-s.kick:
			runtime.Gosched()
			s.flushBuffered()
		case <-s.done:
			return
		}
	}
}

// kickFlush has flushLoop write what is buffered, unless it was kicked
// already. The writer is held.
func (s *pubSession) kickFlush() {
	if s.buffered {
		return
	}
	s.buffered = true
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// flushBuffered writes the records buffered for flushLoop, if any, and
// ends the stream's write side once its broker is leaving.
func (s *pubSession) flushBuffered() {
	if s.lockWriter(context.Background()) != nil {
		return // the session failed
	}
	defer s.unlockWriter()
	if s.buffered {
		s.buffered = false
		if err := s.w.Flush(); err != nil {
			s.writeFailed(s.connErr(err))
			return
		}
	}
	if s.left.Load() && !s.sendEnded {
		// Every record sent on the stream is on the wire: the broker,
		// reading on while it drains, answers each and then ends the
		// stream, without waiting out its bound.
		s.sendEnded = true
		s.str.Close()
	}
}

// leaving handles a refusal, e, by which the session's broker said it is
// shutting down and takes no more records: the broker is noted leaving
// (which moves the home off it), the session takes no more records (the
// publisher opens a new one, at the new home, for the next), and
// flushLoop ends its write side once what was sent is on the wire; the
// reader goes on resolving what is in flight, which the broker answers,
// each record refused so as not written, until it ends the stream. An
// idempotent publisher's session fails instead: it sends again what it
// carried, in order, on a new stream (as for any retriable refusal).
func (s *pubSession) leaving(e *transport.Error) {
	s.link.b.c.brokerLeaving(s.addr, e)
	if s.idem != nil || s.left.Swap(true) {
		return
	}
	s.mu.Lock()
	s.mu.leftAt = e.Seq
	if s.mu.err == nil && s.mu.writeErr == nil {
		s.mu.writeErr = e
	}
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// ownBroker reports whether node is the node id of the session's broker,
// by the client's cached map.
func (s *pubSession) ownBroker(node string) bool {
	if node == "" || s.link == nil {
		return false
	}
	m := s.link.b.c.cachedMap()
	if m == nil {
		return false
	}
	n, ok := m.Node(node)
	return ok && n.Addr == s.addr
}

// unread is the error of the records still unanswered when the broker
// ended the stream (its FIN) after saying it is shutting down (a refusal
// naming it, or STOP_SENDING with shutting_down): a broker ends a
// publish stream only once it has answered every record it took in, so
// these were not taken in, and not written. nil if the broker did not say
// so: they are then of unknown outcome, as on any lost stream.
func (s *pubSession) unread(err error) error {
	if !errors.Is(err, io.EOF) || !s.left.Load() && !shuttingDown(context.Cause(s.str.Context())) {
		return nil
	}
	return s.notTakenIn()
}

// notTakenIn is the error of a record the session's broker, shutting
// down, did not take in.
func (s *pubSession) notTakenIn() error {
	return &transport.Error{Code: transport.CodeShuttingDown,
		Message: fmt.Sprintf("broker %s is shutting down and ended the stream without taking the record in; nothing was written", s.addr)}
}

// take removes and returns the future waiting for seq, or nil.
func (s *pubSession) take(seq uint64) *Future {
	s.mu.Lock()
	f := s.mu.pending[seq]
	if f != nil {
		delete(s.mu.pending, seq)
	}
	s.mu.Unlock()
	return f
}

// fail marks the session failed with cause, abandons the stream and
// resolves every pending future with cause. Later calls do nothing.
func (s *pubSession) fail(cause error) {
	s.mu.Lock()
	if s.mu.err != nil {
		s.mu.Unlock()
		return
	}
	s.mu.err = cause
	pending := s.mu.pending
	s.mu.pending, s.mu.failing = nil, pending
	leftAt := s.mu.leftAt
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.mu.failing = nil
		s.mu.Unlock()
	}()
	cancelStream(s.str)
	if s.idem != nil && retriable(cause) {
		// Outcome unknown: the publisher sends them again.
		s.idem.unresolve(pending, cause)
		return
	}
	fs := make([]*Future, 0, len(pending))
	var unread error
	for seq, f := range pending {
		err := cause
		if leftAt != 0 && seq > leftAt {
			// Sent after a record the broker refused as it was leaving:
			// not taken in either (leftAt), whatever ended the session.
			if unread == nil {
				unread = s.notTakenIn()
			}
			err = unread
		}
		f.resolve(Ack{}, s.publishErr(f, err))
		fs = append(fs, f)
	}
	notifyLater(s.later, fs) // fail may run holding the writer (from send)
	for _, f := range fs {
		f.finish()
	}
}

// connErr is the error of the records in flight when the stream's
// connection failed with err: an error wrapping ErrConnectionLost (their
// outcome is unknown), or, if the broker refused the connection, the
// refusal (they were not written). See link.failure.
func (s *pubSession) connErr(err error) error {
	if s.link == nil {
		return lost(err)
	}
	return s.link.failure(err)
}

// withPending calls fn with the frame of the idempotent record waiting
// for seq, if one does, holding mu (so that it is not taken meanwhile).
func (s *pubSession) withPending(seq uint64, fn func(*transport.Publish)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fut := s.mu.pending[seq]; fut != nil && fut.idem != nil {
		fn(fut.idem.frame)
	}
}

func (s *pubSession) publishErr(f *Future, err error) error {
	return &PublishError{Stream: f.stream, Shard: int(f.shard), Broker: s.addr, Err: err}
}

// pending returns the futures waiting for an answer.
func (s *pubSession) inFlight() []*Future {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Future, 0, len(s.mu.pending)+len(s.mu.failing))
	for _, f := range s.mu.failing {
		out = append(out, f)
	}
	for _, f := range s.mu.pending {
		out = append(out, f)
	}
	return out
}

// readLoop reads the broker's answers and resolves futures until the
// stream ends. It is the session's one goroutine.
func (s *pubSession) readLoop() {
	defer close(s.done)
	r := transport.NewReader(s.str, s.maxFrame)
	answered := false
	for {
		f, err := r.Read()
		if err != nil {
			s.noteLeaving(context.Cause(s.str.Context()))
			if uerr := s.unread(err); uerr != nil {
				s.fail(uerr)
				return
			}
			s.fail(s.connErr(fmt.Errorf("reading acks from %s: %w", s.addr, err)))
			return
		}
		if !answered && s.link != nil {
			answered = true
			s.link.answer()
		}
		switch f := f.(type) {
		case *transport.Ack:
			if s.idem != nil && s.idem.refusedAgain.Load() != 0 {
				s.idem.refusedAgain.Store(0) // resending closed the gap
			}
			if f.Epoch != 0 {
				// Placed by a newer map than the one this client picked
				// its shard by (the stream was created again).
				raise(s.mapNamed, f.Epoch)
			}
			if fut := s.take(f.Seq); fut != nil {
				fut.resolve(ackFrom(f), nil)
				fut.notify()
				fut.finishLater()
			}
		case *transport.Error:
			if f.Code == transport.CodeShuttingDown {
				// From the broker itself if it names itself (Owner) or also
				// stopped reading the stream (a relayed refusal of an owner
				// names the owner): the home moves before the record's
				// publish learns of its refusal, so that it can go again
				// through the new home (publishSync), as idempotent
				// records do.
				if s.ownBroker(f.Owner) {
					s.leaving(f)
				}
				s.noteLeaving(context.Cause(s.str.Context()))
			}
			if f.Code == transport.CodeUnknownStream {
				raise(s.mapNamed, f.Epoch) // the next publish picks its shard by that map
			}
			if s.idem != nil && f.Seq != 0 && f.Code != transport.CodeDuplicateSequence {
				switch f.Code {
				case transport.CodeUnknownProducer:
					// Not written, nor anything after it under its
					// producer id: they are sent again under a new one.
					s.withPending(f.Seq, s.idem.forgotten)
				case transport.CodeOutOfOrderSequence:
					s.withPending(f.Seq, func(fr *transport.Publish) { s.idem.outOfOrder(fr, f.From) })
				}
				if retriable(f) {
					// Send this one and every record after it again,
					// in order, on a new stream.
					s.fail(lost(f))
					return
				}
				if fut := s.take(f.Seq); fut != nil {
					err := s.publishErr(fut, f)
					if fut.idem.failedAt.IsZero() {
						// Not written: later records of its shard will be
						// refused out of order; they are sent again under
						// a new producer id.
						s.idem.refused(fut.idem.frame)
					} else {
						// Sent again, its first send's outcome unknown:
						// refused before the owner's table judged it, its
						// first copy may have been written.
						s.idem.refusedResent(fut.idem.frame)
						err = s.publishErr(fut, fmt.Errorf("%w: refused when sent again, its first send's outcome unknown: %w", ErrConnectionLost, f))
					}
					fut.resolve(Ack{}, err)
					fut.notify()
					fut.finishLater()
					s.fail(lost(f))
					return
				}
			}
			if fut := s.take(f.Seq); fut != nil {
				fut.resolve(Ack{}, s.publishErr(fut, f))
				fut.notify()
				fut.finishLater()
			}
			if f.Seq == 0 || streamLevel(f.Code) {
				s.fail(lost(f))
				return
			}
		default:
			s.fail(lost(&transport.Error{Code: transport.CodeUnexpectedFrame, Message: "publish stream got a " + f.Type().String() + " frame"}))
			return
		}
	}
}

// streamLevel reports whether a broker closes the stream after an error
// with code.
func streamLevel(code transport.ErrorCode) bool {
	switch code {
	case transport.CodeMalformed, transport.CodeFrameTooLarge, transport.CodeUnknownFrame, transport.CodeUnexpectedFrame:
		return true
	}
	return false
}
