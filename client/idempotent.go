package client

// # Idempotent publishers (WithIdempotence)
//
// Each Publisher of an idempotent client numbers its records per shard:
// the records it sends to shard s of stream x carry a producer id of its
// own (random, per Publisher and shard) and sequences 1, 2, 3, ... in the
// order they go on the wire. The shard's owner writes each (producer id,
// sequence) once (see broker's producers.go); on a replicated stream its
// leader does, and a new leader knows what the old one committed.
//
// When a record's outcome is unknown — its stream or connection died, or
// the broker answered unavailable, shutting_down, timeout or internal — or
// the owner refused it out_of_order_sequence (an earlier one was lost),
// the publisher does not fail it: it abandons the stream, and the records
// that were waiting on it ("unresolved", in send order) are sent again,
// first thing, on a new stream (redialing the broker as needed), with the
// same producer ids and sequences, before any record published since. A
// record the owner had committed is answered with its original ack
// (Ack.Duplicate set); one it had not is written. Each record thus ends up
// in its shard once, in the order sent.
//
// A record refused for good (payload_too_large, unauthorized, ...) is not
// written and fails; the records sent after it to the same shard would be
// refused out of order, so they are sent again under a fresh producer id
// of that shard, sequences from 1. (They cannot have been written under
// the old id: the owner accepts sequence n+1 of an id only after n, and
// sequence 1 only of an id it does not know.) That holds of a record sent
// once; one sent again, its first send's outcome unknown, may be refused
// by a check made before the owner's producer table (a limit lowered
// meanwhile, a grant taken away), though its first copy was written. It
// fails as of unknown outcome (matching [ErrConnectionLost]), and the
// records after it keep their producer id and sequences: if it was
// written they are answered as the owner has them, and if it was not the
// owner refuses the next out_of_order_sequence naming a sequence at or
// below its own (transport.Error.From), which settles it, and they are
// renumbered as above. Renumbered at once, those written after the first
// copy were written twice. A record the owner answers
// unknown_producer (it forgot the id: expiry, eviction, a restart) was not
// written, nor was anything after it under that id: it and they are sent
// again under a fresh id. A record that did not encode (too large for a
// frame) gives its sequence back. A record is numbered only once it holds
// its stream's writer (pubSession.send), in the order records go on the
// wire: one whose publish's context ended while it waited for the writer
// (held by a write blocked on flow control) was not sent and took no
// sequence, so the next record of its shard takes the one it would have,
// and no gap is left. A record of unknown outcome, already numbered, is
// never dropped so: one that a publish (or the resender) did not get to
// send again before its context ended stays unresolved, for the resender.
//
// A record refused out_of_order_sequence again and again, with no ack in
// between (a gap that sending again does not close), is sent again after
// waits that double from 10 ms up to a second.
//
// Retries are bounded: when a record has stayed unresolved for the retry
// timeout (WithRetryTimeout), the publisher gives up on every unresolved
// record — they fail with an error matching [ErrRetriesExhausted] and
// [ErrConnectionLost], their outcome unknown — and their shards get fresh
// producer ids.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/felix-broker/felix/transport"
)

// ErrRetriesExhausted is what a record of an idempotent publisher fails
// with when it stayed of unknown outcome for the retry timeout
// (WithRetryTimeout) and the publisher gave up on it: it may or may not
// have been written. The error also matches [ErrConnectionLost] and wraps
// the last cause.
var ErrRetriesExhausted = errors.New("client: gave up retrying a record of unknown outcome (it may or may not have been written)")

// Defaults of the idempotent publisher.
const (
	// DefaultRetryTimeout bounds how long an idempotent publisher retries
	// a record of unknown outcome.
	DefaultRetryTimeout = 2 * time.Minute
	// DefaultIdempotentMaxInFlight is the publish window of an idempotent
	// client unless WithMaxInFlight is given: the brokers' default
	// ProducerWindow, so that every retried record gets its original ack.
	DefaultIdempotentMaxInFlight = 256
)

type shardKey struct {
	stream string
	shard  int32
}

// idemShard is the producer id a publisher uses on one shard and the last
// sequence it took there.
type idemShard struct {
	id   string
	last uint64
}

// idemState is an idempotent publisher's numbering and its unresolved
// records. Lock order: a session's mu, then idemState.mu.
type idemState struct {
	p        *Publisher
	base     string
	retryFor time.Duration

	// refusedAgain counts the resends in a row whose records came back
	// out_of_order_sequence with no ack between them: a gap that sending
	// the records again does not close (a sequence the owner knows
	// nothing of), which the resender then waits longer and longer
	// before sending again, instead of opening a stream after another
	// until the retry timeout. An ack resets it.
	refusedAgain atomic.Int32

	mu struct {
		sync.Mutex
		ids        uint64 // producer ids made
		shards     map[shardKey]*idemShard
		order      uint64    // send order of the last record published
		unresolved []*Future // outcome unknown, to send again; by order
		// resent are the records the last takeUnresolved took, which
		// Flush waits for too: between the take and their send on the
		// new stream they are in no session (pruned as they resolve).
		resent  []*Future
		refused map[shardKey]refusal
		// uncertain are records sent again and refused for good before
		// the owner's table judged them (refusedResent): whether their
		// first copy was written is not known, so the records after
		// them keep their numbers until an owner's out_of_order answer
		// settles it (outOfOrder).
		uncertain map[shardKey]refusal
		resending bool // the resender goroutine runs
		// resenderDone is closed when the running resender exits.
		resenderDone chan struct{}
	}
}

// refusal is the lowest sequence of a shard's producer id refused for
// good since the unresolved records were last sent again.
type refusal struct {
	id  string
	seq uint64
}

func newIdemState(p *Publisher, retryFor time.Duration) *idemState {
	st := &idemState{p: p, base: fmt.Sprintf("%016x", rand.Uint64()), retryFor: retryFor}
	st.mu.shards = map[shardKey]*idemShard{}
	st.mu.refused = map[shardKey]refusal{}
	st.mu.uncertain = map[shardKey]refusal{}
	return st
}

// newIDLocked returns a producer id never used before by this publisher.
func (st *idemState) newIDLocked() string {
	st.mu.ids++
	return st.base + "." + strconv.FormatUint(st.mu.ids, 10)
}

// stamp gives f its place in the send order.
func (st *idemState) stamp(f *Future) {
	st.mu.Lock()
	st.mu.order++
	f.idem.order = st.mu.order
	st.mu.Unlock()
}

// next takes the next sequence of shard of stream. The caller holds the
// session's mu, so sequences are taken in wire order.
func (st *idemState) next(stream string, shard int32) (string, uint64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	k := shardKey{stream, shard}
	sh := st.mu.shards[k]
	if sh == nil {
		sh = &idemShard{id: st.newIDLocked()}
		st.mu.shards[k] = sh
	}
	sh.last++
	return sh.id, sh.last
}

// refused notes that the record sent as frame was refused for good.
func (st *idemState) refused(frame *transport.Publish) {
	if frame == nil || frame.ProducerSeq == 0 {
		return
	}
	st.note(frame.Stream, frame.Shard, refusal{id: frame.ProducerID, seq: frame.ProducerSeq})
}

// note keeps r, the records after which are renumbered, if it is the
// shard's first or lowest.
func (st *idemState) note(stream string, shard int32, r refusal) {
	st.mu.Lock()
	defer st.mu.Unlock()
	keepLowest(st.mu.refused, shardKey{stream, shard}, r)
}

// keepLowest keeps r as k's refusal in m if it is k's first or lowest.
func keepLowest(m map[shardKey]refusal, k shardKey, r refusal) {
	if old, ok := m[k]; !ok || old.id != r.id || r.seq < old.seq {
		m[k] = r
	}
}

// refusedResent notes that the record sent as frame, sent again because
// its first send's outcome is unknown, was refused for good: by a check
// made before the owner's table, so its first copy may have been
// written. The records after it keep their numbers (see uncertain).
func (st *idemState) refusedResent(frame *transport.Publish) {
	if frame == nil || frame.ProducerSeq == 0 {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	keepLowest(st.mu.uncertain, shardKey{frame.Stream, frame.Shard}, refusal{id: frame.ProducerID, seq: frame.ProducerSeq})
}

// outOfOrder settles an uncertain refusal of the shard of the record sent
// as frame, which the owner refused out_of_order_sequence expecting
// sequence next (transport.Error.From; 0: not known) of its producer id:
// nothing from next on was written under that id, so an uncertain record
// at or above it was not written, and the records after it are
// renumbered when sent again; one below it was.
func (st *idemState) outOfOrder(frame *transport.Publish, next uint64) {
	if frame == nil || frame.ProducerSeq == 0 || next == 0 {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	k := shardKey{frame.Stream, frame.Shard}
	u, ok := st.mu.uncertain[k]
	if !ok || u.id != frame.ProducerID {
		return
	}
	delete(st.mu.uncertain, k)
	if next <= u.seq {
		keepLowest(st.mu.refused, k, u)
	}
}

// forgotten notes that the owner does not know the producer id of the
// record sent as frame (unknown_producer): neither it nor anything after
// it under that id was written, and they are renumbered under a new id
// when sent again.
func (st *idemState) forgotten(frame *transport.Publish) {
	if frame == nil || frame.ProducerSeq == 0 {
		return
	}
	st.note(frame.Stream, frame.Shard, refusal{id: frame.ProducerID, seq: frame.ProducerSeq - 1})
}

// unsent handles a record that was not sent (it did not encode): its
// sequence is given back if none was taken after it (the caller holds the
// session's mu, under which sequences are taken), else it is skipped as
// refused.
func (st *idemState) unsent(frame *transport.Publish) {
	if frame == nil || frame.ProducerSeq == 0 {
		return
	}
	st.mu.Lock()
	sh := st.mu.shards[shardKey{frame.Stream, frame.Shard}]
	if sh != nil && sh.id == frame.ProducerID && sh.last == frame.ProducerSeq {
		sh.last--
		st.mu.Unlock()
		return
	}
	st.mu.Unlock()
	st.refused(frame)
}

// unresolve takes records whose outcome became unknown (cause) to send
// them again, and makes sure the resender runs.
func (st *idemState) unresolve(pending map[uint64]*Future, cause error) {
	if len(pending) == 0 {
		return
	}
	if errors.Is(cause, transport.ErrOutOfOrderSequence) {
		st.refusedAgain.Add(1)
	}
	now := time.Now()
	st.mu.Lock()
	for _, f := range pending {
		if f.idem.failedAt.IsZero() {
			f.idem.failedAt = now
		}
		f.idem.cause = cause
		st.mu.unresolved = append(st.mu.unresolved, f)
	}
	slices.SortFunc(st.mu.unresolved, byOrder)
	st.unlockResending()
}

// unlockResending unlocks st.mu, first making sure the resender runs if
// unresolved records wait. st.mu is held. The caller is a counted
// goroutine (a session's reader), or holds the publisher's opening slot
// with a session's goroutines running, so Close waits for the resender.
func (st *idemState) unlockResending() {
	start := !st.mu.resending && len(st.mu.unresolved) > 0
	if start {
		st.mu.resending = true
		st.mu.resenderDone = make(chan struct{})
	}
	st.mu.Unlock()
	if start {
		st.p.c.wg.Add(1)
		go st.p.resendLoop()
	}
}

// takeUnresolved returns the unresolved records to send again, in order,
// first renumbering those sent after a record refused for good.
func (st *idemState) takeUnresolved() []*Future {
	st.mu.Lock()
	defer st.mu.Unlock()
	fs := st.mu.unresolved
	st.mu.unresolved = nil
	st.mu.resent = slices.Clone(fs) // its own: unresolvedFutures prunes it in place
	for k, r := range st.mu.refused {
		sh := st.mu.shards[k]
		renumbered := false
		for _, f := range fs {
			fr := f.idem.frame
			if fr.Stream != k.stream || fr.Shard != k.shard || fr.ProducerID != r.id || fr.ProducerSeq <= r.seq {
				continue
			}
			if !renumbered && sh != nil && sh.id == r.id {
				sh.id, sh.last = st.newIDLocked(), 0
			}
			renumbered = true
			sh.last++
			fr.ProducerID, fr.ProducerSeq = sh.id, sh.last
		}
		if !renumbered && sh != nil && sh.id == r.id {
			// Nothing after it is left: start the shard afresh anyway,
			// so the next record is not refused out of order.
			sh.id, sh.last = st.newIDLocked(), 0
		}
		delete(st.mu.refused, k)
		if u, ok := st.mu.uncertain[k]; ok && u.id == r.id {
			delete(st.mu.uncertain, k) // its id is no longer used
		}
	}
	return fs
}

// putBack returns records taken by takeUnresolved and not sent, for the
// resender to send (it may have stopped once takeUnresolved took them).
func (st *idemState) putBack(fs []*Future) {
	st.mu.Lock()
	st.mu.unresolved = append(fs, st.mu.unresolved...)
	slices.SortFunc(st.mu.unresolved, byOrder)
	st.unlockResending()
}

// hasUnresolved reports whether records wait to be sent again.
func (st *idemState) hasUnresolved() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.mu.unresolved) > 0
}

// deadline returns when the publisher gives up on its oldest unresolved
// record; ok is false (and the resender stops) when there is none.
func (st *idemState) deadline() (time.Time, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.mu.unresolved) == 0 {
		st.mu.resending = false
		close(st.mu.resenderDone)
		return time.Time{}, false
	}
	oldest := st.mu.unresolved[0].idem.failedAt
	for _, f := range st.mu.unresolved {
		if f.idem.failedAt.Before(oldest) {
			oldest = f.idem.failedAt
		}
	}
	return oldest.Add(st.retryFor), true
}

func byOrder(a, b *Future) int { return cmp.Compare(a.idem.order, b.idem.order) }

// abandon fails every unresolved record with err (wrapped as a
// PublishError), and gives their shards fresh producer ids when fresh.
func (st *idemState) abandon(err func(*Future) error, fresh bool) {
	st.mu.Lock()
	fs := st.mu.unresolved
	st.mu.unresolved = nil
	if fresh {
		for _, f := range fs {
			k := shardKey{f.idem.frame.Stream, f.idem.frame.Shard}
			if sh := st.mu.shards[k]; sh != nil && sh.id == f.idem.frame.ProducerID {
				sh.id, sh.last = st.newIDLocked(), 0
			}
		}
	}
	st.mu.Unlock()
	for _, f := range fs {
		f.resolve(Ack{}, &PublishError{Stream: f.stream, Shard: int(f.shard), Broker: st.p.c.Addr(), Err: err(f)})
	}
	notifyLater(&st.p.c.tel.later, fs)
	for _, f := range fs {
		f.finish()
	}
}

// awaitResender waits until the resender, if one runs, has exited. The
// publisher is closed (its ctx ended), so it abandons what it holds.
func (st *idemState) awaitResender() {
	st.mu.Lock()
	running, done := st.mu.resending, st.mu.resenderDone
	st.mu.Unlock()
	if running {
		<-done
	}
}

// unresolvedFutures returns the records waiting to be sent again, and
// those being sent again that have not resolved.
func (st *idemState) unresolvedFutures() []*Future {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.mu.resent = slices.DeleteFunc(st.mu.resent, (*Future).resolved)
	return append(slices.Clone(st.mu.unresolved), st.mu.resent...)
}

// resendLoop sends the unresolved records again until there are none,
// giving up on them at their deadline. It is the publisher's goroutine
// while there are unresolved records.
func (p *Publisher) resendLoop() {
	defer p.c.wg.Done()
	st := p.idem
	for {
		deadline, ok := st.deadline()
		if !ok {
			return
		}
		if n := st.refusedAgain.Load(); n > 1 {
			sleep(p.ctx, min(time.Duration(10<<min(n-2, 7))*time.Millisecond, time.Second))
		}
		ctx, cancel := context.WithDeadline(p.ctx, deadline)
		_, err := p.session(ctx)
		cancel()
		switch {
		case err == nil:
		case errors.Is(err, ErrClosed) || p.ctx.Err() != nil:
			st.abandon(func(*Future) error { return errClosedInFlight }, false)
		case !time.Now().Before(deadline):
			st.abandon(func(f *Future) error {
				return fmt.Errorf("%w after %v: %w (last: %w; then %w)", ErrRetriesExhausted, st.retryFor, ErrConnectionLost, f.idem.cause, err)
			}, true)
			p.c.cfg.logger.Warn("client: idempotent publisher gave up retrying records of unknown outcome", "broker", p.c.Addr(), "after", st.retryFor, "err", err)
		default:
			// The broker cannot be reached yet; the dial backs off.
			sleep(p.ctx, 10*time.Millisecond)
		}
	}
}

// openIdem opens a new stream for an idempotent publisher and sends the
// unresolved records on it, in order, before anyone else may use it. The
// caller holds the opening slot. Each record waits for the stream's
// writer no longer than ctx allows (the caller's publish, or the
// resender's retry deadline): if ctx ends first, the records not sent
// yet go back to the resender, and the stream is left not ready, so the
// next opener abandons it and sends them all again, those sent on it
// too, on a stream of its own.
func (p *Publisher) openIdem(ctx context.Context) (*pubSession, error) {
	p.mu.Lock()
	old := p.mu.sess
	p.mu.Unlock()
	if old != nil {
		// Records sent after the unresolved ones would overtake them:
		// they are unresolved too.
		old.fail(lost(errors.New("publish stream abandoned to send records of unknown outcome again")))
	}
	s, err := p.openStream(ctx, false)
	if err != nil {
		return nil, err
	}

	fs := p.idem.takeUnresolved()
	for i, f := range fs {
		if err := s.send(ctx, f, f.idem.frame); err != nil {
			p.idem.putBack(fs[i:])
			return nil, fmt.Errorf("sending records of unknown outcome again to %s: %w", p.c.Addr(), err)
		}
	}
	p.mu.Lock()
	p.mu.ready = true
	p.mu.Unlock()
	return s, nil
}

// retriable reports whether an idempotent publisher sends again a record
// that failed with err: its outcome is unknown, or it was not written and
// may be on a retry.
func retriable(err error) bool {
	if errors.Is(err, ErrClosed) {
		return false
	}
	var derr *DialError
	if errors.As(err, &derr) {
		// A refused connection wrote none of them, but some may be
		// records sent again, whose first copies' outcome is unknown:
		// they go on a new connection after the backoff.
		return true
	}
	var werr *transport.Error
	if !errors.As(err, &werr) {
		return errors.Is(err, ErrConnectionLost)
	}
	switch werr.Code {
	case transport.CodeUnavailable, transport.CodeShuttingDown, transport.CodeTimeout, transport.CodeInternal,
		transport.CodeNotOwner, transport.CodeOutOfOrderSequence, transport.CodeUnknownProducer:
		return true
	}
	return errors.Is(err, ErrConnectionLost) // a stream-level error ended the stream
}
