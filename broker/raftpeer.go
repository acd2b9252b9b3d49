package broker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// raftPeer sends the raft messages of every group to one peer broker, on
// one stream of the pooled peer connection. A group's goroutine writes its
// messages itself, encoded into frames of about raftNet.batch bytes and
// queued in quic-go's send buffer without blocking (a frameWriter): no
// goroutine is woken between a group's Ready and the packet, and a
// follower's answer leaves as soon as its fdatasync returns. Only while the
// stream's flow-control window is full does the writer's flusher write
// what waits, and drop what passes raftQueueBytes.
//
// The peer's goroutine (run) owns the stream's life: while no stream is
// open, messages wait in a queue (bounded alike) and run opens the stream,
// writes the queue, and hands the stream to the groups. A write failure
// drops what was being sent (raft sends it again) and the stream, and the
// next messages have run open another one. A queue whose oldest message
// waited longer than an election timeout (a dial to a peer that went
// away) is dropped rather than written to the next stream: raft probes a
// peer back from silence itself, and a burst of stale messages would
// only replay what it has moved on from.
//
// One stream carries a pair's raft traffic both ways: the one the broker
// whose node id sorts first opens. Its opener reads the peer's messages
// on it (read) and says so in its first frame (Duplex); the peer adopts
// it for its own messages (adopt, from serveRaft) and drops any stream
// it had opened itself. So both directions share one QUIC connection,
// and a follower's answer acknowledges the packet of the leader's append
// it answers, instead of an acknowledgement packet of its own in each
// direction (every other packet of a one-way stream: quic-go's ACK
// frequency). Until the first broker opens its stream (or with a peer of
// an earlier version, which never writes back), the other opens its own,
// as before.
type raftPeer struct {
	n    *raftNet
	id   string
	wake chan struct{} // capacity 1: messages are queued, or the stream failed
	stop chan struct{} // closed when the peer left the map and every group (raftNet.prune)
	// wrote is set after each frame handed to the stream, and cleared by
	// keepAlive.
	wrote atomic.Bool

	mu struct {
		sync.Mutex
		w       *frameWriter // the open stream's writer (run's, or adopted); nil while none is
		adopted bool         // w writes on the stream the peer opened
		queue   []transport.RaftMsg
		since   time.Time // when the oldest message in queue was queued
		bytes   int
		ping    bool // a keep-alive is asked for
	}
}

// keepAlive, called once a tick, has an empty frame sent if nothing was
// written to the peer since the last call: the peer hears this broker at
// least once a tick, which its quiet groups' liveness rests on (raft.go).
func (p *raftPeer) keepAlive() {
	if p == nil || p.wrote.Swap(false) {
		return
	}
	p.mu.Lock()
	w := p.mu.w
	if w == nil {
		p.mu.ping = true
	}
	p.mu.Unlock()
	if w != nil {
		w.send(&transport.Raft{From: p.n.node})
		p.wrote.Store(true)
		return
	}
	p.poke()
}

// send writes msgs, in order, on the peer's stream; while none is open it
// queues them for run (past raftQueueBytes it drops them). It never blocks
// on the network.
func (p *raftPeer) send(msgs []transport.RaftMsg) {
	p.mu.Lock()
	w := p.mu.w
	if w == nil {
		if len(p.mu.queue) == 0 {
			p.mu.since = time.Now()
		}
		for _, m := range msgs {
			if p.mu.bytes+len(m.Data) > raftQueueBytes {
				break
			}
			p.mu.queue = append(p.mu.queue, m)
			p.mu.bytes += len(m.Data)
		}
		p.mu.Unlock()
		p.poke()
		return
	}
	p.mu.Unlock()
	p.frames(w, msgs)
}

// frames hands msgs to w in frames of about raftNet.batch bytes of
// messages; no messages, one empty frame (a keep-alive).
func (p *raftPeer) frames(w *frameWriter, msgs []transport.RaftMsg) {
	for first := true; first || len(msgs) > 0; first = false {
		n, size := 0, 0
		for n < len(msgs) && (n == 0 || size+len(msgs[n].Data) <= p.n.batch) {
			size += len(msgs[n].Data)
			n++
		}
		w.send(&transport.Raft{From: p.n.node, Msgs: msgs[:n]})
		msgs = msgs[n:]
	}
	p.wrote.Store(true)
}

func (p *raftPeer) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// failed is the writer's report of a write error: the groups stop using
// w, and run drops its stream.
func (p *raftPeer) failed(w *frameWriter) {
	p.mu.Lock()
	if p.mu.w == w {
		p.mu.w, p.mu.adopted = nil, false
	}
	p.mu.Unlock()
	p.poke()
}

func (p *raftPeer) run() {
	defer p.n.wg.Done()
	var (
		s       *quic.Stream
		w       *frameWriter
		retryAt time.Time
	)
	drop := func() {
		if w != nil {
			w.abort(errors.New("raft stream dropped"))
			p.failed(w)
		}
		if s != nil {
			s.CancelWrite(quic.StreamErrorCode(transport.CodeUnavailable))
			s.CancelRead(0)
		}
		s, w = nil, nil
	}
	defer drop()
	for {
		select {
		case <-p.n.ctx.Done():
			return
		case <-p.stop:
			return
		case <-p.wake:
		}
		p.mu.Lock()
		current := w != nil && p.mu.w == w
		adopted := p.mu.w != nil && !current
		waiting := len(p.mu.queue) > 0 || p.mu.ping
		p.mu.Unlock()
		if current {
			continue // the groups write on the stream
		}
		if s != nil && !adopted {
			p.n.log.Debug("raft stream to peer lost; opening it again", "peer", p.id)
		}
		drop()
		if adopted || !waiting {
			continue // the groups write on the peer's stream, or have nothing to
		}
		if time.Now().Before(retryAt) {
			p.take() // dropped: raft sends again
			continue
		}
		var err error
		if s, err = p.open(); err != nil {
			p.take()
			retryAt = time.Now().Add(raftRedial)
			if p.n.bad.First(p.id + "\x00open") {
				p.n.log.Warn("cannot open the raft stream to a peer; retrying (logged once per peer)", "peer", p.id, "err", err)
			}
			continue
		}
		w = p.newWriter()
		// The first frame is empty: the peer reads a stream's first frame
		// under its usual (publish) frame limit, and raises it for what
		// follows once it sees a raft stream. The queue follows, then
		// whatever the groups send once they have the writer.
		w.send(&transport.Raft{From: p.n.node, Duplex: !p.n.simplex})
		if !p.install(w, s, false) {
			w.abort(errAdopted)
			s.CancelWrite(quic.StreamErrorCode(transport.CodeUnavailable))
			s.CancelRead(0)
			s, w = nil, nil
			continue
		}
		if !p.n.simplex {
			p.n.wg.Add(1)
			go p.read(s, w)
		}
	}
}

// errAdopted ends a stream of this broker's own when the peer's stream
// took its place.
var errAdopted = errors.New("raft stream replaced by the peer's")

// newWriter returns a detached writer for a raft stream.
func (p *raftPeer) newWriter() *frameWriter {
	var w *frameWriter
	w = newDetachedWriter(&p.n.wg, func(error) { p.failed(w) })
	w.limit, w.timeout = raftQueueBytes, raftWriteTimeout
	return w
}

// install makes w, a detached writer, write on s and the groups write on
// w, what waits in the queue first. A writer on a stream of this broker's
// own (not adopted) does not take the place of another (false).
func (p *raftPeer) install(w *frameWriter, s *quic.Stream, adopted bool) bool {
	p.mu.Lock()
	if p.mu.w != nil && !adopted {
		p.mu.Unlock()
		return false
	}
	p.mu.adopted = adopted
	msgs := p.mu.queue
	p.mu.queue, p.mu.bytes, p.mu.ping = nil, 0, false
	if len(msgs) > 0 && time.Since(p.mu.since) <= p.n.silentAfter {
		p.frames(w, msgs)
	}
	p.mu.w = w
	p.mu.Unlock()
	w.attach(s)
	w.flush()
	p.wrote.Store(true)
	return true
}

// adopt makes s, the duplex raft stream the peer opened, the stream this
// broker sends to the peer on; run drops a stream of its own. It returns
// the writer, which the caller (the stream's reader) releases when the
// stream ends.
func (p *raftPeer) adopt(s *quic.Stream) *frameWriter {
	w := p.newWriter()
	p.install(w, s, true)
	p.poke()
	return w
}

// release ends w, an adopted stream's writer, once its stream ended: the
// next messages have run open a stream of this broker's own until the
// peer opens another.
func (p *raftPeer) release(w *frameWriter) {
	w.abort(errors.New("raft stream ended"))
	p.failed(w)
}

// read delivers what the peer sends back on s, the stream run opened
// (written by w), until the stream ends; a peer of an earlier version
// sends nothing. A peer that breaks the protocol loses the stream.
func (p *raftPeer) read(s *quic.Stream, w *frameWriter) {
	defer p.n.wg.Done()
	if err := p.n.receive(p.id, transport.NewReader(s, raftFrameLimit), nil); err != nil {
		p.n.refuse(p.id, "raft stream broken by its peer", shardmap.ShardID{}, err)
		s.CancelRead(quic.StreamErrorCode(transport.CodeUnexpectedFrame))
		p.failed(w)
	}
}

// take drops what is queued.
func (p *raftPeer) take() {
	p.mu.Lock()
	p.mu.queue, p.mu.bytes, p.mu.ping = nil, 0, false
	p.mu.Unlock()
}

// open opens the raft stream to the peer over the pooled connection, at
// the address the current map gives it.
func (p *raftPeer) open() (*quic.Stream, error) {
	m := p.n.mapOf()
	if m == nil {
		return nil, errNoMap
	}
	node, ok := m.Node(p.id)
	if !ok {
		return nil, errNotMember
	}
	ctx, cancel := context.WithTimeout(p.n.ctx, dialTimeout)
	defer cancel()
	conn, err := p.n.peers.conn(ctx, node)
	if err != nil {
		return nil, err
	}
	return conn.OpenStreamSync(ctx)
}
