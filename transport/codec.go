package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/quic-go/quic-go"
)

const (
	// readBufSize is a Reader's initial buffer: many small frames per
	// underlying Read.
	readBufSize = 16 << 10
	// keepBufSize is the largest buffer a Reader or Writer keeps once it
	// is drained; a bigger one, grown for a big frame, is dropped so an idle
	// stream does not pin it.
	keepBufSize = 256 << 10
)

// Reader reads frames from a stream. It reads ahead: once a Reader is used,
// read the stream only through it. A Reader is not safe for concurrent use.
type Reader struct {
	r        io.Reader
	maxFrame int
	maxSkip  int // the largest Publish frame skipped, not refused at once; 0: skipFactor times maxFrame
	buf      []byte
	start    int // first unconsumed byte in buf
	end      int // end of valid data in buf

	hold Holder // nil: the buffer's growth is not accounted
	held int    // bytes taken from hold for the buffer

	last int // body length of the frame ReadRaw returned last

	small int // SmallFrames: the buffer to start with, if not readBufSize
}

// SmallFrames says that the stream's next frames are small (a
// subscriber's credit grants): r drops the buffer it has, if nothing is
// left in it, and starts the next with n bytes, not the 16 KiB a
// request stream's many small frames are read with; it grows as a frame
// needs, as always.
func (r *Reader) SmallFrames(n int) {
	r.small = max(n, 8)
	if r.start == r.end && len(r.buf) > r.small {
		r.buf, r.start, r.end = nil, 0, 0
	}
}

// newBuf is the buffer a read starts with.
func (r *Reader) newBuf() []byte {
	if r.small > 0 {
		return make([]byte, r.small)
	}
	return make([]byte, readBufSize)
}

// LastSize returns the body length of the frame read last. A frame decoded
// from it (Read, ReadIf) points its strings and byte slices into one copy
// of that body ([DecodeFrame]): keeping any of them keeps LastSize bytes,
// whatever the fields' own lengths (a sender may pad a frame with fields
// the receiver ignores).
func (r *Reader) LastSize() int { return r.last }

// A Holder accounts what Readers buffer for frames larger than they keep
// between frames (a partial large frame held until its last byte comes):
// a server gives the Readers of one client's streams the client's byte
// budget, so that frames started and never finished cannot make it hold
// more than that.
type Holder interface {
	// Hold takes n bytes before the Reader buffers them, waiting for
	// them if need be; false fails the read with ErrNotHeld.
	Hold(n int) bool
	// Free gives back n bytes taken by Hold.
	Free(n int)
}

// ErrNotHeld is the error a Reader returns when its Holder refused the
// bytes of the frame it was reading.
var ErrNotHeld = errors.New("transport: the frame's bytes could not be held")

// SetHolder makes r take the bytes it buffers for a frame larger than
// keepBufSize from h, from the next frame on; Release gives them back.
func (r *Reader) SetHolder(h Holder) { r.hold = h }

// Release gives back what r holds of its Holder and drops its buffer; r
// must not be used after.
func (r *Reader) Release() {
	if r.hold != nil && r.held > 0 {
		r.hold.Free(r.held)
	}
	r.held, r.buf, r.start, r.end = 0, nil, 0, 0
}

// shrink drops a buffer grown for a big frame once nothing is left in it,
// giving back what it held.
func (r *Reader) shrink() {
	if r.start == r.end && len(r.buf) > keepBufSize {
		r.buf, r.start, r.end = nil, 0, 0
		if r.held > 0 {
			r.hold.Free(r.held)
			r.held = 0
		}
	}
}

// NewReader returns a Reader of frames from r that refuses frames whose
// length N (type byte plus body) is over maxFrame; maxFrame <= 0 means
// [DefaultMaxFrame].
func NewReader(r io.Reader, maxFrame int) *Reader {
	if maxFrame <= 0 {
		maxFrame = DefaultMaxFrame
	}
	return &Reader{r: r, maxFrame: maxFrame}
}

// SetMaxFrame changes the largest frame length N the Reader accepts from
// the next frame on (n <= 0 means [DefaultMaxFrame]), for a stream whose
// first frame decided what it carries (a broker's raft stream carries
// larger frames than a publisher's).
func (r *Reader) SetMaxFrame(n int) {
	if n <= 0 {
		n = DefaultMaxFrame
	}
	r.maxFrame = n
}

// skipFactor bounds the Publish frames a Reader skips by default: up to
// skipFactor times its maximum.
const skipFactor = 4

// SetMaxSkip sets the largest frame length N of a [Publish] over the
// frame limit that the Reader skips (see [Reader.Read]) rather than
// refuse at once; n <= 0 means 4 times the frame limit, the default.
// Skipping holds no memory (the body is dropped as it arrives), so a
// server may skip more for a sender it trusts to be bounded otherwise: a
// broker skips whatever a peer broker forwards, which its own record
// limit let through.
func (r *Reader) SetMaxSkip(n int) { r.maxSkip = max(n, 0) }

// skips reports whether a Publish frame of length n, over the frame
// limit, is skipped.
func (r *Reader) skips(n int) bool {
	if r.maxSkip > 0 {
		return n <= r.maxSkip
	}
	return n/skipFactor <= r.maxFrame
}

// ErrSkipped is wrapped by the error [Reader.Read] returns for a frame it
// refused and skipped whole: the stream is still at a frame boundary and
// may be read on.
var ErrSkipped = errors.New("transport: frame skipped; the stream is still usable")

// Read reads and decodes the next frame. The frame does not alias the
// Reader's buffer.
//
// It returns io.EOF when the stream ends at a frame boundary, and an
// [*Error] for a framing problem: [CodeMalformed] for a zero-length frame,
// for a stream that ends inside a frame (wrapping io.ErrUnexpectedEOF) or
// for a body that does not decode; [CodeFrameTooLarge] for a length over
// the maximum (the body is not read); [CodeUnknownFrame] for an unknown
// type. After a framing error the stream's position is undefined: answer
// with the error and close the stream. Other errors come from the
// underlying reader, wrapped.
//
// A [Publish] frame over the maximum is not a framing error but a record
// over the limit: its body is read and dropped as it arrives (never
// buffered), and Read returns a [CodePayloadTooLarge] error carrying the
// frame's Seq and wrapping [ErrSkipped]. The stream stays usable: answer
// that publish and read on. A Publish frame more than 4 times over the
// maximum (or over what [Reader.SetMaxSkip] set) is refused at once with
// the same code, as a framing error (its body is not read).
func (r *Reader) Read() (Frame, error) {
	typ, body, err := r.ReadRaw()
	if err != nil {
		return nil, err
	}
	return r.decode(typ, body)
}

// decode decodes a frame ReadRaw returned, then gives back the buffer it
// was read into if it was grown for it: the frame does not alias it.
func (r *Reader) decode(typ FrameType, body []byte) (Frame, error) {
	f, err := DecodeFrame(typ, body)
	r.shrink()
	return f, err
}

// ReadIf is Read for a stream that carries frames of type want only: a
// frame of another type is not decoded (a body of many small elements
// decodes to many times its size) and is answered with a
// [CodeUnexpectedFrame] error, a framing error as Read's are.
func (r *Reader) ReadIf(want FrameType) (Frame, error) {
	typ, body, err := r.ReadRaw()
	if err != nil {
		return nil, err
	}
	if typ != want {
		r.shrink()
		return nil, &Error{Code: CodeUnexpectedFrame, Message: fmt.Sprintf("a %s frame where %s frames go", typ, want)}
	}
	return r.decode(typ, body)
}

// ReadRaw reads the next frame without decoding its body, for a caller
// that relays frames. The body is valid until the next call on r. Errors
// are those of [Reader.Read], less decoding ones.
func (r *Reader) ReadRaw() (FrameType, []byte, error) {
	r.shrink() // grown for a big frame
	if err := r.fill(4); err != nil {
		if err == io.EOF && r.end == r.start {
			return 0, nil, io.EOF
		}
		return 0, nil, r.readErr("header", err)
	}
	n := int(binary.BigEndian.Uint32(r.buf[r.start:]))
	if n == 0 {
		return 0, nil, &Error{Code: CodeMalformed, Message: "zero-length frame"}
	}
	if n > r.maxFrame {
		return 0, nil, r.oversized(n)
	}
	if more := 4 + n - keepBufSize - r.held; r.hold != nil && more > 0 {
		// All at once: a Holder that grants a request when nothing else
		// is held lets a frame larger than its bound through, alone.
		if !r.hold.Hold(more) {
			return 0, nil, fmt.Errorf("transport: reading a %d-byte frame: %w", n, ErrNotHeld)
		}
		r.held += more
	}
	if err := r.fill(4 + n); err != nil {
		return 0, nil, r.readErr(fmt.Sprintf("%d-byte frame", n), err)
	}
	typ := FrameType(r.buf[r.start+4])
	body := r.buf[r.start+frameHeaderLen : r.start+4+n : r.start+4+n]
	r.last = len(body)
	r.start += 4 + n
	if r.start == r.end {
		r.start, r.end = 0, 0
	}
	return typ, body, nil
}

// oversized handles a frame of length n over the maximum, whose header is
// buffered: a Publish is skipped (see [Reader.Read]), any other frame is a
// framing error.
func (r *Reader) oversized(n int) error {
	if err := r.fill(frameHeaderLen); err != nil {
		return r.readErr("header", err)
	}
	if FrameType(r.buf[r.start+4]) != FramePublish {
		return &Error{Code: CodeFrameTooLarge, Message: fmt.Sprintf("frame of %d bytes, limit %d", n, r.maxFrame)}
	}
	if !r.skips(n) {
		// Far over: refused at once, with the code a skipped one gets.
		return &Error{Code: CodePayloadTooLarge,
			Message: fmt.Sprintf("publish frame of %d bytes is far over the limit of %d; the stream is closed", n, r.maxFrame)}
	}
	// The Seq is the body's first field: an array header of up to 5 bytes,
	// then an integer of up to 9.
	if err := r.fill(frameHeaderLen + min(n-1, 14)); err != nil {
		return r.readErr(fmt.Sprintf("%d-byte frame", n), err)
	}
	seq := publishSeq(r.buf[r.start+frameHeaderLen : r.end])
	if err := r.discard(4 + n); err != nil {
		return r.readErr(fmt.Sprintf("%d-byte frame", n), err)
	}
	return &Error{Seq: seq, Code: CodePayloadTooLarge, cause: ErrSkipped,
		Message: fmt.Sprintf("publish frame of %d bytes is over the limit of %d: the record is larger than the node accepts", n, r.maxFrame)}
}

// publishSeq decodes the Seq at the start of a Publish body, or returns 0.
func publishSeq(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	skip := 0
	switch c := b[0]; {
	case c&0xf0 == 0x90:
		skip = 1
	case c == 0xdc:
		skip = 3
	case c == 0xdd:
		skip = 5
	default:
		return 0
	}
	if skip >= len(b) {
		return 0
	}
	d := decoder{b: b[skip:]}
	seq := d.uint64()
	if d.err != nil {
		return 0
	}
	return seq
}

// discard consumes the next n bytes of the stream without keeping them:
// what is buffered, then reads into the (reused) buffer.
func (r *Reader) discard(n int) error {
	k := min(n, r.end-r.start)
	r.start += k
	n -= k
	if r.start == r.end {
		r.start, r.end = 0, 0
	}
	for n > 0 {
		if r.buf == nil {
			r.buf = r.newBuf()
		}
		m, err := r.r.Read(r.buf[:min(n, len(r.buf))])
		n -= m
		if err != nil && n > 0 {
			return err
		}
	}
	return nil
}

// Ready reports whether a whole frame is buffered, so the next Read will
// not block on the underlying reader. A server answering pipelined frames
// buffers its answers while Ready and flushes when it is not.
func (r *Reader) Ready() bool {
	if r.end-r.start < 4 {
		return false
	}
	n := int(binary.BigEndian.Uint32(r.buf[r.start:]))
	if n == 0 || r.end-r.start >= 4+n {
		return true
	}
	// An oversized frame is refused at once, except a Publish not far
	// over, which is skipped as it arrives.
	return n > r.maxFrame && r.end-r.start >= frameHeaderLen &&
		(FrameType(r.buf[r.start+4]) != FramePublish || !r.skips(n))
}

// fill reads until at least need bytes are buffered from r.start. The
// buffer grows toward need only as bytes arrive, so a length prefix alone
// cannot make a Reader allocate.
func (r *Reader) fill(need int) error {
	if r.end-r.start >= need {
		return nil
	}
	if r.buf == nil {
		r.buf = r.newBuf()
	}
	if r.start > 0 && r.start+need > len(r.buf) {
		r.end = copy(r.buf, r.buf[r.start:r.end])
		r.start = 0
	}
	for r.end-r.start < need {
		if r.end == len(r.buf) { // full, and r.start is 0
			grown := make([]byte, min(need, 2*len(r.buf)))
			r.end = copy(grown, r.buf[:r.end])
			r.buf = grown
		}
		n, err := r.r.Read(r.buf[r.end:])
		r.end += n
		if err != nil {
			if r.end-r.start >= need {
				return nil // the error recurs on the next read
			}
			return err
		}
	}
	return nil
}

func (r *Reader) readErr(what string, err error) error {
	if err == io.EOF {
		return &Error{
			Code:    CodeMalformed,
			Message: fmt.Sprintf("stream ended inside a frame (%d of the %s's bytes)", r.end-r.start, what),
			cause:   io.ErrUnexpectedEOF,
		}
	}
	return fmt.Errorf("transport: reading frame %s: %w", what, err)
}

// Writer writes frames to a stream, each [Writer.Write] in one call to the
// underlying writer (on a QUIC stream: one STREAM frame when it fits a
// packet). [Writer.Buffer] and [Writer.Flush] put many frames, such as the
// acks for a batch of pipelined publishes, into one write.
//
// A Writer is not safe for concurrent use: give each stream one writing
// goroutine, or guard the Writer with a mutex.
type Writer struct {
	w        io.Writer
	maxFrame int
	buf      []byte
	frames   int // frames in buf
}

// NewWriter returns a Writer of frames to w that refuses to encode a frame
// over [DefaultMaxFrame]; see [Writer.SetMaxFrame].
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: w, maxFrame: DefaultMaxFrame}
}

// SetMaxFrame sets the largest frame length N (type byte plus body) the
// Writer encodes; n <= 0 means [DefaultMaxFrame]. Set it to the peer's
// limit so an oversized frame fails here, with [CodeFrameTooLarge] (a
// [Publish]: [CodePayloadTooLarge], as the peer would answer), and does not
// cost the stream.
func (w *Writer) SetMaxFrame(n int) {
	if n <= 0 {
		n = DefaultMaxFrame
	}
	w.maxFrame = n
}

// Write writes f, after any buffered frames, in one underlying write.
func (w *Writer) Write(f Frame) error {
	if err := w.Buffer(f); err != nil {
		return err
	}
	return w.Flush()
}

// WriteBatch writes fs, after any buffered frames, in one underlying write.
// If a frame fails to encode, nothing is written and the buffer is as it
// was before the call.
func (w *Writer) WriteBatch(fs ...Frame) error {
	mark, frames := len(w.buf), w.frames
	for _, f := range fs {
		if err := w.Buffer(f); err != nil {
			w.buf, w.frames = w.buf[:mark], frames
			return err
		}
	}
	return w.Flush()
}

// WriteEncoded writes frame, one frame as [AppendFrame] encoded it, after
// any buffered frames, in one underlying write: a frame sent on many
// streams (the control plane's map, to every broker) is encoded once.
// frame is only read. A frame over the Writer's limit is refused with
// [CodeFrameTooLarge], and nothing is written.
func (w *Writer) WriteEncoded(frame []byte) error {
	if len(frame) < 5 {
		return &Error{Code: CodeInvalid, Message: fmt.Sprintf("an encoded frame of %d bytes is shorter than its header", len(frame))}
	}
	if n := len(frame) - 4; n > w.maxFrame {
		return &Error{Code: CodeFrameTooLarge, Message: fmt.Sprintf("%s frame of %d bytes, limit %d", FrameType(frame[4]), n, w.maxFrame)}
	}
	if len(w.buf) == 0 {
		_, err := w.w.Write(frame)
		if err != nil {
			return fmt.Errorf("transport: writing frame: %w", err)
		}
		return nil
	}
	w.buf = append(w.buf, frame...)
	w.frames++
	return w.Flush()
}

// Buffer encodes f into the Writer's buffer without writing it. If f fails
// to encode, the buffer is unchanged.
func (w *Writer) Buffer(f Frame) error {
	mark := len(w.buf)
	buf, err := AppendFrame(w.buf, f)
	if err != nil {
		return err
	}
	if n := len(buf) - mark - 4; n > w.maxFrame {
		w.buf = buf[:mark]
		if f.Type() == FramePublish {
			// The same code the peer's Reader gives it (see Reader.Read).
			return &Error{Code: CodePayloadTooLarge, Message: fmt.Sprintf("publish frame of %d bytes is over the limit of %d: the record is too large", n, w.maxFrame)}
		}
		return &Error{Code: CodeFrameTooLarge, Message: fmt.Sprintf("%s frame of %d bytes, limit %d", f.Type(), n, w.maxFrame)}
	}
	w.buf = buf
	w.frames++
	return nil
}

// Release drops the Writer's buffer, if nothing is buffered in it and it
// is larger than a Reader's initial one: a stream that writes a large
// frame now and then and idles between (a subscription) does not keep up
// to keepBufSize for it meanwhile.
func (w *Writer) Release() {
	if w.frames == 0 && cap(w.buf) > readBufSize {
		w.buf = nil
	}
}

// Buffered returns the number of frames buffered and not yet written.
func (w *Writer) Buffered() int { return w.frames }

// Flush writes the buffered frames in one underlying write. On error the
// buffered frames are dropped: the stream is then unusable.
func (w *Writer) Flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.w.Write(w.buf)
	return w.written(err)
}

// TryFlush writes the buffered frames in one underlying write if that
// does not block, and reports whether it wrote them: on a QUIC stream
// (the underlying writer has quic-go's TryWriteAll) they are written
// only if the stream's flow-control window takes them all at once, and
// are otherwise left buffered, for a Flush by a goroutine that may
// block. Any other writer is flushed as by Flush. On error, as Flush.
func (w *Writer) TryFlush() (bool, error) {
	tw, ok := w.w.(interface{ TryWriteAll([]byte) error })
	if !ok || len(w.buf) == 0 {
		return true, w.Flush()
	}
	err := tw.TryWriteAll(w.buf)
	if errors.Is(err, quic.ErrWouldBlock) {
		return false, nil
	}
	return true, w.written(err)
}

// written empties the buffer after a write of its frames ended with err
// (nil: they were written; else they are dropped, as Flush says).
func (w *Writer) written(err error) error {
	frames := w.frames
	w.frames = 0
	if cap(w.buf) > keepBufSize {
		w.buf = nil
	} else {
		w.buf = w.buf[:0]
	}
	if err != nil {
		if frames == 1 {
			return fmt.Errorf("transport: writing frame: %w", err)
		}
		return fmt.Errorf("transport: writing %d frames: %w", frames, err)
	}
	return nil
}
