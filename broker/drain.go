package broker

import (
	"fmt"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/transport"
)

// # The drain of publisher streams at Close
//
// A broker that closes gracefully answers every record a publisher sent
// it: it never leaves one unread whose publisher cannot tell whether it
// was written. Close starts the drain of every publisher session
// (beginDrain); from then on each session's reader goes on reading, and
// refuses every record it reads shutting_down, naming this broker
// (Error.Owner): nothing of it is written, and the publisher sends it
// again through another broker (Kafka's controlled shutdown answers
// NOT_LEADER the same way). The records taken in before are committed
// and acknowledged, or forwarded and answered, as ever. Close waits for
// them (waitTaken), then:
//
//   - tells each client's session to go away (goAway: an Error frame
//     with Seq 0, shutting_down, naming this broker; sent only now, as an
//     SDK from before the drain fails every record in flight on a
//     stream-level error), and goes on reading and refusing until the
//     client ends the stream's write side (the SDK does on that frame, or
//     on the first refusal naming its broker): every record the client
//     sent is read and answered;
//   - stops reading every peer's session at once (STOP_SENDING
//     shutting_down): a forwarder's lane knows what follows (below);
//
// and every session ends once it has answered what it took in. Both waits
// share the one bound Close had before, ForwardTimeout: a client that
// goes on sending to a closing broker is stopped reading at it, and while
// it sends, each record it has unanswered holds a slot and its bytes as
// any record does (PublishInFlight, PublishBytesPerPrincipal).
//
// A session ends its stream (FIN) only once it has answered every record
// it took in (finish): a record unanswered when the stream ends was never
// taken in, so not written. A forwarder's lane (lane.kill) and the SDK
// rely on that for the records they had sent when the owner stopped
// reading: not "may or may not have been written", but not written.

// drainGate orders the reader's count of a record taken in (take) against
// the start of Close's drain, so that once beginDrain has returned no
// record is counted pending any more and Close may wait for the pending
// ones (sync.WaitGroup forbids an Add from zero concurrent with a Wait).
type drainGate struct {
	mu       sync.Mutex
	draining bool
}

// count counts a record taken in on pending and returns true, or returns
// false once the drain has begun.
func (g *drainGate) count(pending *sync.WaitGroup) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.draining {
		return false
	}
	pending.Add(1)
	return true
}

// beginDrain makes the session refuse every record it reads from now on.
func (p *pubSession) beginDrain() {
	p.drain.mu.Lock()
	p.drain.draining = true
	p.drain.mu.Unlock()
}

// refuseDraining answers a record read after the drain began, taken
// (its slot and charge held) but not counted pending: refused
// shutting_down, nothing written.
func (p *pubSession) refuseDraining(in *inbound) {
	p.respond(in, p.b.shuttingDown(in.pub.Seq), false)
}

// goAway tells the client to publish through another broker from now
// on: shuttingDown, answering no record (Seq 0).
func (p *pubSession) goAway() {
	p.acks.send(p.b.shuttingDown(0))
}

// shuttingDown is the refusal of a record this broker did not take in
// because it is shutting down (of the stream, for Seq 0): it names this
// broker (Owner), so that a publisher can tell it from a shard owner's
// refusal relayed by its broker, and go elsewhere.
func (b *Broker) shuttingDown(seq uint64) *transport.Error {
	return &transport.Error{Seq: seq, Code: transport.CodeShuttingDown, Owner: b.cfg.NodeID,
		Message: fmt.Sprintf("%s is shutting down and did not take the record in; nothing was written: publish it through another broker", b.cfg.NodeID)}
}

// waitTaken returns once every record the session counted pending is
// answered. Only after beginDrain: no record is counted then.
func (p *pubSession) waitTaken() { p.pending.Wait() }

// stopReading makes the session stop taking in publishes; what it already
// took in is still answered, and then the stream ends.
func (p *pubSession) stopReading() {
	p.stopped.Store(true)
	p.s.CancelRead(quic.StreamErrorCode(transport.CodeShuttingDown))
}

// waitIdle returns once the session has answered everything it took in.
func (p *pubSession) waitIdle() { <-p.idle }

// drainPublishers drains the publisher sessions pubs (see above), within
// ForwardTimeout. It returns a channel closed once every session has
// ended, which Close waits for at its end (on time, the sessions have
// all ended when drainPublishers returns).
func (b *Broker) drainPublishers(pubs []*pubSession) <-chan struct{} {
	for _, p := range pubs {
		p.beginDrain()
	}
	bound := time.NewTimer(b.cfg.ForwardTimeout)
	defer bound.Stop()
	taken := all(pubs, (*pubSession).waitTaken)
	select {
	case <-taken:
	case <-bound.C:
		b.log.Warn("shutdown: gave up waiting for in-flight publishes; records a raft group has not committed fail with an unknown outcome", "sessions", len(pubs))
		b.shards.stopGroups() // so that no session waits on a group that cannot commit
		for _, p := range pubs {
			p.stopReading()
		}
		return all(pubs, (*pubSession).waitIdle)
	}
	for _, p := range pubs {
		if p.peerID != "" {
			p.stopReading()
		} else {
			p.goAway()
		}
	}
	idle := all(pubs, (*pubSession).waitIdle)
	select {
	case <-idle:
	case <-bound.C:
		b.log.Warn("shutdown: publishers told to go elsewhere did not end their streams; stopped reading them", "sessions", len(pubs))
		for _, p := range pubs {
			p.stopReading()
		}
	}
	return idle
}

// all returns a channel closed once wait has returned for every session,
// waited for one after the other by one goroutine.
func all(pubs []*pubSession, wait func(*pubSession)) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		for _, p := range pubs {
			wait(p)
		}
		close(done)
	}()
	return done
}
