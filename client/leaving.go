package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/felix-broker/felix/transport"
)

// # Records refused by a broker shutting down
//
// A broker that closes gracefully answers every record it reads: those it
// took in before its drain are committed and acknowledged; those it reads
// after are refused shutting_down, naming itself (Error.Owner), and
// nothing of them is written. Once it has answered what it took in it
// tells each publisher stream to go away (an Error of Seq 0,
// shutting_down). It ends a stream only once it has answered every record
// it took in, so a record still unanswered when it ends the stream (FIN)
// was not written either.
//
// A plain Publisher's session whose broker says it is leaving (leave: a
// refusal or go-away naming it, or its STOP_SENDING shutting_down) moves
// the home (brokerLeaving), takes no more records and resets its write
// side, and its reader goes on reading the answers to the end of the
// stream. The records refused, and those unanswered at the stream's end,
// are kept (in send order), not failed. Once the reader has ended (every
// earlier record of the stream answered), they are sent again first thing
// on a stream to the new home, before any record published since
// (openResending): the publisher's order holds. A record is sent again at
// most maxLeavingResends times; then, if the home could not move (the map
// shows no other live broker), or if no broker takes a stream within
// leavingResendFor, it fails with its refusal: not written.
//
// Only a refusal that says nothing was written is sent again: a refusal
// relayed from a shard's owner that is shutting down (Owner names the
// owner, not this session's broker) is the record's outcome, as is every
// answer of unknown outcome. An idempotent publisher's records go again
// its own way (idempotent.go).

// maxLeavingResends bounds how many times a record refused by brokers
// shutting down is sent again: each refusal moved the home to another
// broker, and a cluster rarely restarts more at once.
const maxLeavingResends = 2

// leavingResendFor bounds how long records refused by a broker shutting
// down wait for a stream to another broker before they fail.
const leavingResendFor = 30 * time.Second

// refusedRecord is a record a broker shutting down did not write: its
// Seq on the session that sent it, and its refusal.
type refusedRecord struct {
	seq uint64
	f   *Future
	err error
}

// saysLeaving reports whether e, an Error the session's broker sent, says
// that broker is shutting down: a go-away (Seq 0), a refusal naming it,
// or any shutting_down answer once it stopped reading the stream with
// shutting_down. A refusal it relays from a shard's owner names the
// owner.
func (s *pubSession) saysLeaving(e *transport.Error) bool {
	if e.Code != transport.CodeShuttingDown {
		return false
	}
	if e.Seq == 0 || shuttingDown(context.Cause(s.str.Context())) {
		return true
	}
	return e.Owner != "" && s.link != nil && e.Owner == s.link.b.c.nodeAt(s.addr)
}

// nodeAt returns the node id of the broker at addr by the cached map, ""
// if it does not know it.
func (c *Client) nodeAt(addr string) string {
	if m := c.cachedMap(); m != nil {
		for _, n := range m.Nodes {
			if n.Addr == addr {
				return n.ID
			}
		}
	}
	return ""
}

// leave handles the session's broker saying it is shutting down (cause):
// the home moves off it, and a plain publisher's session takes no more
// records and resets its write side, while its reader reads on to the end
// of the stream (see above). The publisher counts the session leaving
// before it takes no more records, so that a record published meanwhile
// waits for those refused (openResending). An idempotent publisher's
// session is failed by its reader or writer as before.
func (s *pubSession) leave(cause error) {
	if s.link != nil {
		s.link.b.c.brokerLeaving(s.addr, cause)
	}
	if s.idem != nil || s.pub == nil || !s.pub.holdFor(s) {
		return
	}
	s.mu.Lock()
	s.mu.leaving = true
	if s.mu.err == nil && s.mu.writeErr == nil {
		s.mu.writeErr = cause
	}
	s.mu.Unlock()
	s.str.CancelWrite(0)
}

// isLeaving reports whether the session left its broker (leave).
func (s *pubSession) isLeaving() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.leaving
}

// refused keeps f, the record of seq its broker refused shutting down
// (err), to be sent again, or resolves it with err if it has been sent
// again as often as it may.
func (s *pubSession) refused(seq uint64, f *Future, err error) {
	if f.resent >= maxLeavingResends {
		f.resolve(Ack{}, s.publishErr(f, err))
		f.notify()
		f.finishLater()
		return
	}
	s.mu.Lock()
	s.mu.refused = append(s.mu.refused, refusedRecord{seq: seq, f: f, err: err})
	s.mu.Unlock()
}

// unread keeps the records still unanswered when a leaving broker ended
// the stream: not taken in, so not written.
func (s *pubSession) unread() {
	s.mu.Lock()
	pending := s.mu.pending
	s.mu.pending = map[uint64]*Future{}
	s.mu.Unlock()
	err := &transport.Error{Code: transport.CodeShuttingDown,
		Message: fmt.Sprintf("%s is shutting down and ended the stream without taking the record in; nothing was written", s.addr)}
	for seq, f := range pending {
		s.refused(seq, f, err)
	}
}

// handOff gives the publisher the records refused on the session, in
// the order sent, as its reader ends.
func (s *pubSession) handOff() {
	if s.pub == nil {
		return
	}
	s.mu.Lock()
	rs := s.mu.refused
	s.mu.refused = nil
	s.mu.Unlock()
	slices.SortFunc(rs, func(a, b refusedRecord) int { return cmp.Compare(a.seq, b.seq) })
	s.pub.left(s, rs)
}

// holdFor counts s leaving: until its reader has ended and its refused
// records are sent again, no new record is sent (current). It returns
// false if s was counted already, or the publisher is closed.
func (p *Publisher) holdFor(s *pubSession) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.mu.leaving[s]; ok || p.mu.closed {
		return false
	}
	if p.mu.leaving == nil {
		p.mu.leaving = map[*pubSession]struct{}{}
	}
	p.mu.leaving[s] = struct{}{}
	return true
}

// left takes the records refused on s, whose reader is ending, to send
// them again, and makes sure the resender runs. Called by s's reader, a
// counted goroutine.
func (p *Publisher) left(s *pubSession, rs []refusedRecord) {
	p.mu.Lock()
	delete(p.mu.leaving, s)
	if p.mu.closed {
		p.mu.Unlock()
		failRefused(rs, s.addr, errClosedRefused)
		return
	}
	if p.c.Addr() == s.addr {
		// The home did not move: the map shows no other live broker to
		// send them through. They fail with their refusals, as a
		// record sent now would be refused.
		p.mu.Unlock()
		failRefused(rs, s.addr, nil)
		return
	}
	p.mu.refused = append(p.mu.refused, rs...)
	start := len(p.mu.refused) > 0 && !p.mu.resending
	if start {
		p.mu.resending = true
		p.c.wg.Add(1) // under mu: shutdown takes mu before Close waits on wg
	}
	p.mu.Unlock()
	if start {
		go p.resendRefused()
	}
}

// errClosedRefused is the cause of records refused by a broker shutting
// down that the publisher was closed before sending again.
var errClosedRefused = fmt.Errorf("%w before the record, refused by a broker shutting down, was sent again; it was not written", ErrClosed)

// failRefused resolves the records rs, refused by the broker at addr,
// with err (their own refusal if err is nil).
func failRefused(rs []refusedRecord, addr string, err error) {
	fs := make([]*Future, 0, len(rs))
	for _, r := range rs {
		cause := err
		if cause == nil {
			cause = r.err
		}
		r.f.resolve(Ack{}, &PublishError{Stream: r.f.stream, Shard: int(r.f.shard), Broker: addr, Err: cause})
		fs = append(fs, r.f)
	}
	for _, f := range fs {
		f.notify()
		f.finish()
	}
}

// resending reports whether records wait to be sent again, or a leaving
// session's reader may still hand some over. p.mu is held.
func (p *Publisher) resendingLocked() bool {
	return len(p.mu.leaving) > 0 || len(p.mu.refused) > 0
}

// resendRefused has the refused records sent again (by session, which
// calls openResending) until none wait, for at most leavingResendFor;
// then it fails those left with their refusals. It is the publisher's
// goroutine while records refused by a broker shutting down wait.
func (p *Publisher) resendRefused() {
	defer p.c.wg.Done()
	ctx, cancel := context.WithTimeout(p.c.ctx, leavingResendFor)
	defer cancel()
	for attempt := 0; ; attempt++ {
		_, err := p.session(ctx)
		p.mu.Lock()
		if !p.resendingLocked() {
			p.mu.resending = false
			p.mu.Unlock()
			return
		}
		if err != nil && (ctx.Err() != nil || errors.Is(err, ErrClosed)) {
			rs := p.mu.refused
			p.mu.refused, p.mu.resending = nil, false
			p.mu.Unlock()
			failRefused(rs, p.c.Addr(), nil)
			return
		}
		p.mu.Unlock()
		if err != nil {
			sleep(ctx, p.c.backoff(attempt))
		}
	}
}

// openResending opens a stream to the home for a plain publisher whose
// records a broker shutting down refused: it waits for the leaving
// sessions' readers to end (every record sent before those refused is
// answered), then sends the refused records on the new stream, in order,
// before anyone else may use it. The caller holds the opening slot. A
// record that cannot be sent on it fails with its refusal: sending it on
// yet another stream could put it after records sent later.
func (p *Publisher) openResending(ctx context.Context) (*pubSession, error) {
	p.mu.Lock()
	waiting := make([]*pubSession, 0, len(p.mu.leaving))
	for s := range p.mu.leaving {
		waiting = append(waiting, s)
	}
	p.mu.Unlock()
	for _, s := range waiting {
		select {
		case <-s.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	s, err := p.openStream(ctx, false)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	rs := p.mu.refused
	p.mu.refused = nil
	p.mu.Unlock()
	for i, r := range rs {
		r.f.resent++
		if err := s.send(ctx, r.f, r.f.frame); err != nil {
			failRefused(rs[i:], s.addr, nil)
			return nil, fmt.Errorf("sending records refused by a broker shutting down again to %s: %w", s.addr, err)
		}
	}
	p.mu.Lock()
	p.mu.ready = true
	p.mu.Unlock()
	return s, nil
}

// refusedFutures returns the records waiting to be sent again.
func (p *Publisher) refusedFutures() []*Future {
	p.mu.Lock()
	defer p.mu.Unlock()
	fs := make([]*Future, 0, len(p.mu.refused))
	for _, r := range p.mu.refused {
		fs = append(fs, r.f)
	}
	return fs
}
