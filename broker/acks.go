package broker

import (
	"errors"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/transport"
)

// frameWriter serializes the frames several goroutines write on one QUIC
// stream, and never blocks any of them on the network: TryWriteAll queues
// a frame in quic-go's send buffer without blocking. Only when the
// stream's flow-control window is full (or the stream is not open yet)
// does the frame go to a backlog, which one flusher goroutine at a time
// writes with blocking writes, in order, and then hands the stream back
// to the fast path. So a client that stops reading acks never stalls a
// shard's committer, and an owner that stops reading forwards never
// stalls the publisher stream's reader.
//
// Two kinds of stream use it: a publisher stream's answers (ackWriter,
// written by the shard committers and the lanes' readers), and a
// forwarding lane's publishes (written by the session's reader and its
// retrier). A lane's writer starts with no stream: the lane's connector
// goroutine holds the flusher role while it dials, so what is forwarded
// meanwhile waits in the backlog, in order (see lane).
//
// An answer to a record holds the record's slot and its charge against
// its principal's budget until the answer is written (handed to QUIC
// under the publisher's flow control), not merely queued: a publisher
// that does not read its acks fills its slots with unwritten answers, and
// the session's reader, which takes a slot per record, stops reading it.
type frameWriter struct {
	wg      *sync.WaitGroup            // counts the flusher
	release func(records, bytes int64) // gives back what written answers held; nil if frames hold nothing
	failed  func(error)                // told once of the first write error; may be nil
	// limit, if not 0, bounds the backlog's bytes with those the flusher
	// is writing: a frame that would pass it is dropped (for frames whose
	// loss the protocol repairs, raft's). timeout, if not 0, bounds each
	// blocking write of the flusher; one that runs out fails the writer.
	limit   int
	timeout time.Duration

	// mu guards the stream's write side; it is never held across a write
	// that can block (the flusher writes with it released).
	mu struct {
		sync.Mutex
		s        *quic.Stream // nil until attached
		scratch  []byte       // encoding buffer for the fast path
		backlog  []byte       // encoded frames waiting for the flusher
		writing  int          // bytes the flusher took from backlog and is writing
		held     held         // what the answers in backlog hold
		flushing bool         // a flusher (or a connector) owns the stream's write side
		err      error        // first write error; later frames are dropped

		corks      int        // corks held (see cork)
		corked     []byte     // frames written while corked
		corkedHeld held       // what the answers in corked hold
		uncorked   *sync.Cond // signalled when corks drops to 0
	}
}

// ackWriter writes the answers on one publisher stream.
type ackWriter = frameWriter

// held is what answers hold until they are written: one slot each, and
// their records' charges.
type held struct{ records, bytes int64 }

func newAckWriter(s *quic.Stream, wg *sync.WaitGroup, release func(records, bytes int64)) *ackWriter {
	a := &frameWriter{wg: wg, release: release}
	a.mu.s = s
	a.mu.uncorked = sync.NewCond(&a.mu)
	return a
}

// newDetachedWriter returns a writer with no stream yet, whose caller
// holds the flusher role until attach (or abort).
func newDetachedWriter(wg *sync.WaitGroup, failed func(error)) *frameWriter {
	a := &frameWriter{wg: wg, failed: failed}
	a.mu.flushing = true
	a.mu.uncorked = sync.NewCond(&a.mu)
	return a
}

// send writes f, a frame that answers no record (a stream-level error, a
// forward), or queues it behind frames already queued. It never blocks on
// the network. It returns an error only if f cannot be encoded; nothing
// is written then and the stream goes on.
func (a *frameWriter) send(f transport.Frame) error { return a.write(f, held{}) }

// answer is send for the answer to one record, whose slot and charge
// (bytes) are released once f is written or dropped.
func (a *frameWriter) answer(f transport.Frame, charge int64) { a.write(f, held{1, charge}) }

func (a *frameWriter) write(f transport.Frame, h held) error {
	a.mu.Lock()
	if a.mu.err != nil {
		a.mu.Unlock()
		a.free(h)
		return nil
	}
	if a.mu.corks > 0 && !a.mu.flushing {
		mark := len(a.mu.corked)
		var err error
		if a.mu.corked, err = transport.AppendFrame(a.mu.corked, f); err != nil {
			a.mu.corked = a.mu.corked[:mark]
			a.mu.Unlock()
			a.free(h)
			return err
		}
		a.mu.corkedHeld.add(h)
		a.mu.Unlock()
		return nil
	}
	if !a.mu.flushing {
		var err error
		if a.mu.scratch, err = transport.AppendFrame(a.mu.scratch[:0], f); err != nil {
			a.mu.Unlock()
			a.free(h)
			return err
		}
		a.tryWrite(a.mu.scratch, h) // unlocks
		return nil
	}
	mark := len(a.mu.backlog)
	var err error
	if a.mu.backlog, err = transport.AppendFrame(a.mu.backlog, f); err != nil || a.limit > 0 && a.mu.writing+len(a.mu.backlog) > a.limit {
		a.mu.backlog = a.mu.backlog[:mark]
		a.mu.Unlock()
		a.free(h)
		return err
	}
	a.mu.held.add(h)
	a.mu.Unlock()
	return nil
}

// tryWrite writes buf, encoded frames holding h, with TryWriteAll, or,
// when the stream's window is full, puts them in the backlog and starts
// the flusher. The caller holds a.mu, which tryWrite unlocks, and does
// not hold the flusher role; buf may be reused once a.mu is taken again
// (TryWriteAll copies it).
func (a *frameWriter) tryWrite(buf []byte, h held) {
	err := a.mu.s.TryWriteAll(buf)
	if err == nil || !errors.Is(err, quic.ErrWouldBlock) {
		first := err != nil
		if first {
			a.mu.err = err
		}
		a.mu.Unlock()
		a.free(h)
		if first {
			a.fail(err)
		}
		return
	}
	a.mu.backlog = append(a.mu.backlog, buf...)
	a.mu.held.add(h)
	a.mu.flushing = true
	a.wg.Add(1)
	a.mu.Unlock()
	go func() {
		defer a.wg.Done()
		a.flush()
	}()
}

// cork makes the frames written from now on wait, encoded, until the
// matching uncork, which writes them in one write: a shard log's commit
// corks the publisher streams it answers on while it runs the batch's
// callbacks (batchAnswers), so a batch of acks costs one quic-go write
// per stream, not one per record. Corks nest (two shards' commits may
// answer on one stream at once); the last uncork writes.
func (a *frameWriter) cork() {
	a.mu.Lock()
	a.mu.corks++
	a.mu.Unlock()
}

// maxKeptCork is the largest corked buffer a writer keeps for the next
// cork: a stream's corked answers are bounded by its records in flight
// (PublishInFlight, about 60 bytes each), and thousands of streams must
// not each keep their largest burst.
const maxKeptCork = 16 << 10

// uncork ends a cork; the last one writes what was corked.
func (a *frameWriter) uncork() {
	a.mu.Lock()
	a.mu.corks--
	if a.mu.corks > 0 {
		a.mu.Unlock()
		return
	}
	defer a.mu.uncorked.Broadcast()
	buf, h := a.mu.corked, a.mu.corkedHeld
	a.mu.corked, a.mu.corkedHeld = buf[:0], held{} // reused once buf is written (under mu)
	if cap(buf) > maxKeptCork {
		a.mu.corked = nil // a burst's buffer is not kept for the stream's life
	}
	switch {
	case len(buf) == 0:
		a.mu.Unlock()
	case a.mu.err != nil:
		a.mu.Unlock()
		a.free(h) // dropped, like any frame after a write error
	case a.mu.flushing:
		// Not while corked (corked frames never start a flusher), but a
		// flusher that was already running when the cork began owns the
		// stream: the frames go after its backlog, which is older.
		a.mu.backlog = append(a.mu.backlog, buf...)
		a.mu.held.add(h)
		a.mu.Unlock()
	default:
		a.tryWrite(buf, h) // unlocks
	}
}

// batchAnswers is the set of publisher streams one commit of a shard log
// answers on: each is corked at its first ack of the commit and uncorked
// by flush, the log's wal.Options.Answered, once the commit's callbacks
// have run. Only the goroutine committing touches it (a log's commits
// never overlap), and only for records the commit wrote: a record failed
// outside a commit (the log closed, say) is answered at once.
type batchAnswers struct {
	corked map[*frameWriter]struct{}
}

// cork corks w until flush, once per commit.
func (b *batchAnswers) cork(w *frameWriter) {
	if _, ok := b.corked[w]; ok {
		return
	}
	if b.corked == nil {
		b.corked = make(map[*frameWriter]struct{})
	}
	w.cork()
	b.corked[w] = struct{}{}
}

// flush uncorks every stream the commit answered on.
func (b *batchAnswers) flush() {
	for w := range b.corked {
		w.uncork()
	}
	clear(b.corked)
}

// waitUncorked waits until no cork is held, so that every answer written
// so far has reached the stream (or its backlog).
func (a *frameWriter) waitUncorked() {
	a.mu.Lock()
	for a.mu.corks > 0 {
		a.mu.uncorked.Wait()
	}
	a.mu.Unlock()
}

func (h *held) add(o held) { h.records, h.bytes = h.records+o.records, h.bytes+o.bytes }

func (a *frameWriter) free(h held) {
	if h != (held{}) && a.release != nil {
		a.release(h.records, h.bytes)
	}
}

func (a *frameWriter) fail(err error) {
	if a.failed != nil {
		a.failed(err)
	}
}

// attach gives a detached writer its stream; its caller, which holds the
// flusher role, then writes the backlog with flush.
func (a *frameWriter) attach(s *quic.Stream) {
	a.mu.Lock()
	a.mu.s = s
	a.mu.Unlock()
}

// abort drops the backlog of a detached writer that will never have a
// stream, releasing what it held; later frames are dropped too.
func (a *frameWriter) abort(err error) {
	a.mu.Lock()
	if a.mu.err == nil {
		a.mu.err = err
	}
	h := a.mu.held
	a.mu.held, a.mu.backlog = held{}, nil
	a.mu.flushing = false
	a.mu.Unlock()
	a.free(h)
}

// maxKeptBacklog is the largest written backlog buffer the flusher keeps
// for the next: with limit, the frames waiting and those being written
// stay within it, and the buffers they were in must not double it.
const maxKeptBacklog = 1 << 20

// flush writes the backlog with blocking writes until it is empty, then
// hands the stream back to the fast path. After a write error it drops
// the backlog, releasing what it held. Its caller holds the flusher role.
func (a *frameWriter) flush() {
	var buf []byte
	for {
		a.mu.Lock()
		a.mu.writing = 0
		if len(a.mu.backlog) == 0 || a.mu.err != nil {
			h := a.mu.held
			a.mu.held, a.mu.backlog = held{}, nil
			a.mu.flushing = false
			a.mu.Unlock()
			a.free(h)
			return
		}
		buf, a.mu.backlog = a.mu.backlog, buf[:0]
		a.mu.writing = len(buf)
		h := a.mu.held
		a.mu.held = held{}
		s := a.mu.s
		a.mu.Unlock()
		if a.timeout > 0 {
			s.SetWriteDeadline(time.Now().Add(a.timeout))
		}
		_, err := s.Write(buf)
		a.free(h)
		if cap(buf) > maxKeptBacklog {
			buf = nil
		}
		if err != nil {
			a.mu.Lock()
			first := a.mu.err == nil
			if first {
				a.mu.err = err
			}
			a.mu.Unlock()
			if first {
				a.fail(err)
			}
		}
	}
}

// backlogged returns the bytes of frames waiting for the flusher or
// being written by it.
func (a *frameWriter) backlogged() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mu.writing + len(a.mu.backlog)
}
