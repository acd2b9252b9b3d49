package broker

import (
	"context"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/transport"
)

// raftPeer sends the raft messages of every group to one peer broker, on
// one stream of the pooled peer connection. Its goroutine (run) owns the
// stream: it takes what is queued, opens the stream if need be, and writes
// the messages in frames of about raftNet.batch bytes. A failure drops
// what it was sending (raft sends it again) and the stream, which the next
// batch opens again.
type raftPeer struct {
	n    *raftNet
	id   string
	wake chan struct{} // capacity 1: messages are queued

	mu struct {
		sync.Mutex
		queue []transport.RaftMsg
		bytes int
	}
	dropped int // messages dropped since the last log line (run only)
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

func (p *raftPeer) take() []transport.RaftMsg {
	p.mu.Lock()
	defer p.mu.Unlock()
	q := p.mu.queue
	p.mu.queue, p.mu.bytes = nil, 0
	return q
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
		msgs := p.take()
		if len(msgs) == 0 {
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
		}
		if err := p.write(s, w, msgs); err != nil {
			p.n.log.Debug("raft stream to peer lost; opening it again", "peer", p.id, "err", err)
			s.CancelWrite(quic.StreamErrorCode(transport.CodeUnavailable))
			s.CancelRead(0)
			s = nil
		}
	}
}

// write sends msgs in frames of about raftNet.batch bytes of messages.
func (p *raftPeer) write(s *quic.Stream, w *transport.Writer, msgs []transport.RaftMsg) error {
	for len(msgs) > 0 {
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
