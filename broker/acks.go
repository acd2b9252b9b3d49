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
//
// An answer to a record holds the record's slot and its charge against
// its principal's budget until the answer is written (handed to QUIC
// under the publisher's flow control), not merely queued: a publisher
// that does not read its acks fills its slots with unwritten answers, and
// the session's reader, which takes a slot per record, stops reading it.
type ackWriter struct {
	s       *quic.Stream
	wg      *sync.WaitGroup            // counts the flusher
	release func(records, bytes int64) // gives back what written answers held

	mu struct {
		sync.Mutex
		scratch  []byte // encoding buffer for the fast path
		backlog  []byte // encoded frames waiting for the flusher
		held     held   // what the answers in backlog hold
		flushing bool   // a flusher owns the stream's write side
		err      error  // first write error; later frames are dropped
	}
}

// held is what answers hold until they are written: one slot each, and
// their records' charges.
type held struct{ records, bytes int64 }

func newAckWriter(s *quic.Stream, wg *sync.WaitGroup, release func(records, bytes int64)) *ackWriter {
	return &ackWriter{s: s, wg: wg, release: release}
}

// send writes f, a frame that answers no record (a stream-level error),
// or queues it behind frames already queued. It never blocks on the
// network.
func (a *ackWriter) send(f transport.Frame) { a.write(f, held{}) }

// answer is send for the answer to one record, whose slot and charge
// (bytes) are released once f is written or dropped.
func (a *ackWriter) answer(f transport.Frame, charge int64) { a.write(f, held{1, charge}) }

func (a *ackWriter) write(f transport.Frame, h held) {
	a.mu.Lock()
	if a.mu.err != nil {
		a.mu.Unlock()
		a.free(h)
		return
	}
	if !a.mu.flushing {
		var err error
		a.mu.scratch, err = transport.AppendFrame(a.mu.scratch[:0], f)
		if err == nil {
			err = a.s.TryWriteAll(a.mu.scratch)
		}
		if err == nil || !errors.Is(err, quic.ErrWouldBlock) {
			if err != nil {
				a.mu.err = err
			}
			a.mu.Unlock()
			a.free(h)
			return
		}
		a.mu.backlog = append(a.mu.backlog, a.mu.scratch...)
		a.mu.held.add(h)
		a.mu.flushing = true
		a.wg.Add(1)
		a.mu.Unlock()
		go a.flush()
		return
	}
	var err error
	if a.mu.backlog, err = transport.AppendFrame(a.mu.backlog, f); err != nil {
		a.mu.err = err
		a.mu.Unlock()
		a.free(h)
		return
	}
	a.mu.held.add(h)
	a.mu.Unlock()
}

func (h *held) add(o held) { h.records, h.bytes = h.records+o.records, h.bytes+o.bytes }

func (a *ackWriter) free(h held) {
	if h != (held{}) {
		a.release(h.records, h.bytes)
	}
}

// flush writes the backlog with blocking writes until it is empty, then
// hands the stream back to the fast path. After a write error it drops
// the backlog, releasing what it held.
func (a *ackWriter) flush() {
	defer a.wg.Done()
	var buf []byte
	for {
		a.mu.Lock()
		if len(a.mu.backlog) == 0 || a.mu.err != nil {
			h := a.mu.held
			a.mu.held, a.mu.backlog = held{}, nil
			a.mu.flushing = false
			a.mu.Unlock()
			a.free(h)
			return
		}
		buf, a.mu.backlog = a.mu.backlog, buf[:0]
		h := a.mu.held
		a.mu.held = held{}
		a.mu.Unlock()
		_, err := a.s.Write(buf)
		a.free(h)
		if err != nil {
			a.mu.Lock()
			a.mu.err = err
			a.mu.Unlock()
		}
	}
}

// backlogged returns the bytes of frames waiting for the flusher.
func (a *ackWriter) backlogged() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.mu.backlog)
}
