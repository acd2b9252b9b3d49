package broker

import (
	"errors"
	"sync"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/transport"
)

// ackWriter serializes the frames a broker writes back on one publisher
// stream. Acks are written by whichever goroutine completes the record (a
// shard's committer, or the reader of a forwarding lane) without waking
// anyone: TryWriteAll queues the frame in quic-go's send buffer without
// blocking. Only when the stream's flow-control window is full does the
// frame go to a backlog that a short-lived flusher goroutine writes with a
// blocking Write, so a client that stops reading acks never stalls a
// shard's committer.
type ackWriter struct {
	s  *quic.Stream
	wg *sync.WaitGroup // counts the flusher

	mu struct {
		sync.Mutex
		scratch  []byte // encoding buffer for the fast path
		backlog  []byte // encoded frames waiting for the flusher
		flushing bool   // a flusher owns the stream's write side
		err      error  // first write error; later frames are dropped
	}
}

func newAckWriter(s *quic.Stream, wg *sync.WaitGroup) *ackWriter {
	return &ackWriter{s: s, wg: wg}
}

// send writes f, or queues it behind frames already queued. It never blocks
// on the network.
func (a *ackWriter) send(f transport.Frame) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mu.err != nil {
		return
	}
	if !a.mu.flushing {
		var err error
		a.mu.scratch, err = transport.AppendFrame(a.mu.scratch[:0], f)
		if err != nil {
			a.mu.err = err
			return
		}
		err = a.s.TryWriteAll(a.mu.scratch)
		if err == nil {
			return
		}
		if !errors.Is(err, quic.ErrWouldBlock) {
			a.mu.err = err
			return
		}
		a.mu.backlog = append(a.mu.backlog, a.mu.scratch...)
		a.mu.flushing = true
		a.wg.Add(1)
		go a.flush()
		return
	}
	var err error
	if a.mu.backlog, err = transport.AppendFrame(a.mu.backlog, f); err != nil {
		a.mu.err = err
	}
}

// flush writes the backlog with blocking writes until it is empty, then
// hands the stream back to the fast path.
func (a *ackWriter) flush() {
	defer a.wg.Done()
	var buf []byte
	for {
		a.mu.Lock()
		if len(a.mu.backlog) == 0 || a.mu.err != nil {
			a.mu.flushing = false
			a.mu.Unlock()
			return
		}
		buf, a.mu.backlog = a.mu.backlog, buf[:0]
		a.mu.Unlock()
		if _, err := a.s.Write(buf); err != nil {
			a.mu.Lock()
			a.mu.err = err
			a.mu.flushing = false
			a.mu.Unlock()
			return
		}
	}
}
