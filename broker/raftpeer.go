package broker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

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
// next messages have run open another one.
type raftPeer struct {
	n    *raftNet
	id   string
	wake chan struct{} // capacity 1: messages are queued, or the stream failed
	// wrote is set after each frame handed to the stream, and cleared by
	// keepAlive.
	wrote atomic.Bool

	mu struct {
		sync.Mutex
		w     *frameWriter // the open stream's writer; nil while none is
		queue []transport.RaftMsg
		bytes int
		ping  bool // a keep-alive is asked for
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
		p.mu.w = nil
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
		case <-p.wake:
		}
		p.mu.Lock()
		current := w != nil && p.mu.w == w
		waiting := len(p.mu.queue) > 0 || p.mu.ping
		p.mu.Unlock()
		if current {
			continue // the groups write on the stream
		}
		if s != nil {
			p.n.log.Debug("raft stream to peer lost; opening it again", "peer", p.id)
			drop()
		}
		if !waiting {
			continue
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
		var nw *frameWriter
		nw = newDetachedWriter(&p.n.wg, func(error) { p.failed(nw) })
		nw.limit, nw.timeout = raftQueueBytes, raftWriteTimeout
		w = nw
		// The first frame is empty: the peer reads a stream's first frame
		// under its usual (publish) frame limit, and raises it for what
		// follows once it sees a raft stream. The queue follows, then
		// whatever the groups send once they have the writer.
		w.send(&transport.Raft{From: p.n.node})
		p.mu.Lock()
		msgs := p.mu.queue
		p.mu.queue, p.mu.bytes, p.mu.ping = nil, 0, false
		if len(msgs) > 0 {
			p.frames(w, msgs)
		}
		p.mu.w = w
		p.mu.Unlock()
		w.attach(s)
		w.flush()
		p.wrote.Store(true)
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
