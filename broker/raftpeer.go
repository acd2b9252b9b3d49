package broker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/transport"
)

// raftPeer sends the raft messages of every group to one peer broker, on
// one stream of the pooled peer connection. Its goroutine (run) owns the
// stream: it takes what is queued, opens the stream if need be, and writes
// the messages in frames of about raftNet.batch bytes, or an empty frame
// when the ticker asks for a keep-alive. A failure drops what it was
// sending (raft sends it again) and the stream, which the next batch
// opens again.
type raftPeer struct {
	n    *raftNet
	id   string
	wake chan struct{} // capacity 1: messages are queued
	// wrote is set by run after each frame written, and cleared by
	// keepAlive.
	wrote atomic.Bool

	mu struct {
		sync.Mutex
		queue []transport.RaftMsg
		bytes int
		ping  bool // a keep-alive is asked for
	}
	dropped int // messages dropped since the last log line (run only)
}

// keepAlive, called once a tick, has an empty frame sent if nothing was
// written to the peer since the last call: the peer hears this broker at
// least once a tick, which its quiet groups' liveness rests on (raft.go).
func (p *raftPeer) keepAlive() {
	if p == nil || p.wrote.Swap(false) {
		return
	}
	p.mu.Lock()
	p.mu.ping = true
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// enqueue queues m; past raftQueueBytes it drops it. It never blocks.
func (p *raftPeer) enqueue(m transport.RaftMsg) {
	p.mu.Lock()
	if p.mu.bytes+len(m.Data) > raftQueueBytes {
		p.mu.Unlock()
		return
	}
	p.mu.queue = append(p.mu.queue, m)
	p.mu.bytes += len(m.Data)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *raftPeer) take() (msgs []transport.RaftMsg, ping bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	q, ping := p.mu.queue, p.mu.ping
	p.mu.queue, p.mu.bytes, p.mu.ping = nil, 0, false
	return q, ping
}

func (p *raftPeer) run() {
	defer p.n.wg.Done()
	var (
		s       *quic.Stream
		w       *transport.Writer
		retryAt time.Time
	)
	defer func() {
		if s != nil {
			s.CancelWrite(0)
			s.CancelRead(0)
		}
	}()
	for {
		select {
		case <-p.n.ctx.Done():
			return
		case <-p.wake:
		}
		msgs, ping := p.take()
		if len(msgs) == 0 && !ping {
			continue
		}
		if s == nil {
			if time.Now().Before(retryAt) {
				continue // dropped: raft sends again
			}
			var err error
			if s, err = p.open(); err != nil {
				retryAt = time.Now().Add(raftRedial)
				if p.n.bad.First(p.id + "\x00open") {
					p.n.log.Warn("cannot open the raft stream to a peer; retrying (logged once per peer)", "peer", p.id, "err", err)
				}
				continue
			}
			w = transport.NewWriter(s)
			w.SetMaxFrame(p.n.maxFrame)
			// An empty first frame: the peer reads a stream's first frame
			// under its usual (publish) frame limit, and raises it for
			// what follows once it sees a raft stream.
			s.SetWriteDeadline(time.Now().Add(raftWriteTimeout))
			if err := w.Write(&transport.Raft{From: p.n.node}); err != nil {
				s.CancelWrite(quic.StreamErrorCode(transport.CodeUnavailable))
				s.CancelRead(0)
				s, retryAt = nil, time.Now().Add(raftRedial)
				continue
			}
			p.wrote.Store(true)
			if len(msgs) == 0 {
				continue // that frame was the keep-alive
			}
		}
		if err := p.write(s, w, msgs); err != nil {
			p.n.log.Debug("raft stream to peer lost; opening it again", "peer", p.id, "err", err)
			s.CancelWrite(quic.StreamErrorCode(transport.CodeUnavailable))
			s.CancelRead(0)
			s = nil
		}
	}
}

// write sends msgs in frames of about raftNet.batch bytes of messages;
// no messages, one empty frame (a keep-alive).
func (p *raftPeer) write(s *quic.Stream, w *transport.Writer, msgs []transport.RaftMsg) error {
	for first := true; first || len(msgs) > 0; first = false {
		n, size := 0, 0
		for n < len(msgs) && (n == 0 || size+len(msgs[n].Data) <= p.n.batch) {
			size += len(msgs[n].Data)
			n++
		}
		s.SetWriteDeadline(time.Now().Add(raftWriteTimeout))
		if err := w.Write(&transport.Raft{From: p.n.node, Msgs: msgs[:n]}); err != nil {
			return err
		}
		clear(msgs[:n])
		msgs = msgs[n:]
		p.wrote.Store(true)
	}
	return nil
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
