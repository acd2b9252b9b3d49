package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/felix-broker/felix/shardmap"
)

func TestAppendDecodeRoundTrip(t *testing.T) {
	for _, tc := range sampleFrames() {
		t.Run(tc.name, func(t *testing.T) {
			prefix := []byte("prefix")
			b, err := AppendFrame(bytes.Clone(prefix), tc.f)
			if err != nil {
				t.Fatalf("AppendFrame: %v", err)
			}
			if !bytes.HasPrefix(b, prefix) {
				t.Fatalf("AppendFrame clobbered dst")
			}
			b = b[len(prefix):]
			if n := binary.BigEndian.Uint32(b); int(n) != len(b)-4 {
				t.Fatalf("length prefix %d, frame has %d bytes after it", n, len(b)-4)
			}
			if typ := FrameType(b[4]); typ != tc.f.Type() {
				t.Fatalf("type byte %v, want %v", typ, tc.f.Type())
			}
			got, err := DecodeFrame(FrameType(b[4]), b[5:])
			if err != nil {
				t.Fatalf("DecodeFrame: %v", err)
			}
			if !reflect.DeepEqual(got, tc.f) {
				t.Fatalf("round trip:\n got %#v\nwant %#v", got, tc.f)
			}
			// The body is standard msgpack: a generic decoder reads it
			// as one array.
			var generic []any
			if err := msgpack.Unmarshal(b[5:], &generic); err != nil {
				t.Fatalf("body is not a msgpack array: %v", err)
			}
		})
	}
}

func TestDecodedFrameDoesNotAliasBody(t *testing.T) {
	p := &Publish{Stream: "orders", Key: []byte("key"), Value: []byte("value")}
	b, _ := AppendFrame(nil, p)
	got, err := DecodeFrame(FramePublish, b[5:])
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = 0
	}
	if !reflect.DeepEqual(got, p) {
		t.Fatalf("decoded frame changed with its input: %#v", got)
	}
	// Appending to a decoded slice must not overwrite a neighbouring field.
	gp := got.(*Publish)
	_ = append(gp.Key, "XXXXXXXX"...)
	if string(gp.Value) != "value" {
		t.Fatalf("append to Key overwrote Value: %q", gp.Value)
	}
}

func TestReaderWriterRoundTrip(t *testing.T) {
	frames := sampleFrames()
	var stream bytes.Buffer
	w := NewWriter(&stream)
	// Write, Buffer+Flush, and WriteBatch all produce the same bytes.
	for i, tc := range frames {
		var err error
		switch i % 3 {
		case 0:
			err = w.Write(tc.f)
		case 1:
			if err = w.Buffer(tc.f); err == nil && w.Buffered() != 1 {
				t.Fatalf("Buffered = %d, want 1", w.Buffered())
			}
			if err == nil {
				err = w.Flush()
			}
		case 2:
			err = w.WriteBatch(tc.f)
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
	}
	data := stream.Bytes()
	readers := map[string]io.Reader{
		"whole":    bytes.NewReader(data),
		"one-byte": iotest.OneByteReader(bytes.NewReader(data)),
		"half":     iotest.HalfReader(bytes.NewReader(data)),
		// io.EOF returned together with the last bytes.
		"data-err": iotest.DataErrReader(bytes.NewReader(data)),
	}
	for name, src := range readers {
		t.Run(name, func(t *testing.T) {
			r := NewReader(src, 0)
			for _, tc := range frames {
				got, err := r.Read()
				if err != nil {
					t.Fatalf("%s: Read: %v", tc.name, err)
				}
				if !reflect.DeepEqual(got, tc.f) {
					t.Fatalf("%s:\n got %#v\nwant %#v", tc.name, got, tc.f)
				}
			}
			if _, err := r.Read(); err != io.EOF {
				t.Fatalf("Read at end = %v, want io.EOF", err)
			}
		})
	}
}

// countingWriter counts Write calls.
type countingWriter struct {
	bytes.Buffer
	writes int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.writes++
	return c.Buffer.Write(p)
}

func TestWriterOneWritePerBatch(t *testing.T) {
	var cw countingWriter
	w := NewWriter(&cw)
	for i := range 100 {
		if err := w.Buffer(&Ack{Seq: uint64(i), Stream: "s", Owner: "n1"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteBatch(&Ack{Seq: 100}, &Ack{Seq: 101}); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(&Ack{Seq: 102}); err != nil {
		t.Fatal(err)
	}
	if cw.writes != 3 {
		t.Fatalf("%d underlying writes, want 3", cw.writes)
	}
	r := NewReader(&cw.Buffer, 0)
	for i := range 103 {
		f, err := r.Read()
		if err != nil {
			t.Fatal(err)
		}
		if got := f.(*Ack).Seq; got != uint64(i) {
			t.Fatalf("ack %d has Seq %d", i, got)
		}
	}
}

func TestWriterLimits(t *testing.T) {
	var cw countingWriter
	w := NewWriter(&cw)
	w.SetMaxFrame(1000)
	if err := w.Buffer(&Ack{Seq: 1}); err != nil {
		t.Fatal(err)
	}
	// A publish over the limit is a record over it: payload_too_large, as
	// the peer's Reader would answer; any other frame is frame_too_large.
	err := w.Write(&Publish{Value: make([]byte, 1000)})
	if !errors.Is(err, ErrPayloadTooLarge) {
		t.Fatalf("oversized publish Write = %v, want payload_too_large", err)
	}
	err = w.Write(&Records{Records: []Record{{Value: make([]byte, 1000)}}})
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("oversized records Write = %v, want frame_too_large", err)
	}
	// A frame failing to encode leaves the batch as it was.
	err = w.WriteBatch(&Ack{Seq: 2}, (*Publish)(nil))
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("WriteBatch with nil frame = %v, want invalid", err)
	}
	if _, err := AppendFrame(nil, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("AppendFrame(nil) = %v, want invalid", err)
	}
	if w.Buffered() != 1 || cw.writes != 0 {
		t.Fatalf("after failures: %d buffered, %d writes; want 1, 0", w.Buffered(), cw.writes)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	f, err := NewReader(&cw.Buffer, 0).Read()
	if err != nil || f.(*Ack).Seq != 1 {
		t.Fatalf("read back %v, %v; want ack 1", f, err)
	}
}

// TestWriterWriteEncoded checks that a frame encoded once is written
// whole, after what is buffered and in one write, reads back as the frame
// it was, and is refused when over the limit, with nothing written.
func TestWriterWriteEncoded(t *testing.T) {
	frame, err := AppendFrame(nil, &Ack{Seq: 7, Stream: "s", Owner: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	var cw countingWriter
	w := NewWriter(&cw)
	if err := w.WriteEncoded(frame); err != nil {
		t.Fatal(err)
	}
	if err := w.Buffer(&Ack{Seq: 8}); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteEncoded(frame); err != nil {
		t.Fatal(err)
	}
	if cw.writes != 2 || w.Buffered() != 0 {
		t.Fatalf("%d writes, %d buffered; want 2, 0", cw.writes, w.Buffered())
	}
	w.SetMaxFrame(len(frame) - 5)
	if err := w.WriteEncoded(frame); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("oversized WriteEncoded = %v, want frame_too_large", err)
	}
	if err := w.WriteEncoded(frame[:4]); !errors.Is(err, ErrInvalid) {
		t.Fatalf("WriteEncoded of a bare length = %v, want invalid", err)
	}
	if cw.writes != 2 {
		t.Fatalf("refused frames were written: %d writes", cw.writes)
	}
	r := NewReader(&cw.Buffer, 0)
	for _, want := range []uint64{7, 8, 7} {
		f, err := r.Read()
		if err != nil || f.(*Ack).Seq != want {
			t.Fatalf("read back %v, %v; want ack %d", f, err, want)
		}
	}
}

func TestWriterError(t *testing.T) {
	boom := errors.New("boom")
	w := NewWriter(errWriter{boom})
	if err := w.Write(&Credit{Records: 1}); !errors.Is(err, boom) {
		t.Fatalf("Write = %v, want wrapping boom", err)
	}
	if w.Buffered() != 0 {
		t.Fatalf("failed flush kept %d frames", w.Buffered())
	}
}

// TestWriterTryFlush: TryFlush writes the buffered frames in one write
// when a QUIC stream would take them at once, leaves them buffered for
// Flush when it would block, and is Flush on any other writer.
func TestWriterTryFlush(t *testing.T) {
	tw := &tryWriter{block: true}
	w := NewWriter(tw)
	if err := w.Buffer(&Credit{Records: 1}); err != nil {
		t.Fatal(err)
	}
	if err := w.Buffer(&Credit{Records: 2}); err != nil {
		t.Fatal(err)
	}
	if ok, err := w.TryFlush(); ok || err != nil || w.Buffered() != 2 || len(tw.writes) != 0 {
		t.Fatalf("TryFlush on a stream that would block = %v, %v; %d frames buffered, %d writes; want false, nil, 2, 0", ok, err, w.Buffered(), len(tw.writes))
	}
	tw.block = false
	if ok, err := w.TryFlush(); !ok || err != nil || w.Buffered() != 0 || len(tw.writes) != 1 {
		t.Fatalf("TryFlush on a stream that takes it = %v, %v; %d frames buffered, %d writes; want true, nil, 0, 1", ok, err, w.Buffered(), len(tw.writes))
	}
	r := NewReader(bytes.NewReader(tw.writes[0]), 0)
	for want := uint32(1); want <= 2; want++ {
		f, err := r.Read()
		if c, ok := f.(*Credit); err != nil || !ok || c.Records != want {
			t.Fatalf("frame %d written: %+v, %v", want, f, err)
		}
	}
	var plain bytes.Buffer
	w = NewWriter(&plain)
	if err := w.Buffer(&Credit{Records: 3}); err != nil {
		t.Fatal(err)
	}
	if ok, err := w.TryFlush(); !ok || err != nil || plain.Len() == 0 {
		t.Fatalf("TryFlush on a plain writer = %v, %v, %d bytes written; want it flushed", ok, err, plain.Len())
	}
}

// tryWriter has quic-go's TryWriteAll, which would block while block.
type tryWriter struct {
	block  bool
	writes [][]byte
}

func (w *tryWriter) Write(p []byte) (int, error) { panic("a blocking write") }

func (w *tryWriter) TryWriteAll(p []byte) error {
	if w.block {
		return quic.ErrWouldBlock
	}
	w.writes = append(w.writes, bytes.Clone(p))
	return nil
}

type errWriter struct{ err error }

func (e errWriter) Write(p []byte) (int, error) { return 0, e.err }

// frame builds raw frame bytes: length N = 1+len(body), type, body.
func frame(typ FrameType, body []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(1+len(body)))
	return append(append(b, byte(typ)), body...)
}

func body(f Frame) []byte {
	b, err := AppendFrame(nil, f)
	if err != nil {
		panic(err)
	}
	return b[5:]
}

// stopReader yields data, then fails the test if read further.
type stopReader struct {
	t    *testing.T
	data []byte
}

func (s *stopReader) Read(p []byte) (int, error) {
	if len(s.data) == 0 {
		s.t.Fatal("Reader read past the frame header of an oversized frame")
	}
	n := copy(p, s.data)
	s.data = s.data[n:]
	return n, nil
}

func TestReaderBadInput(t *testing.T) {
	pub := body(&Publish{Stream: "s", Value: []byte("v")})
	tests := []struct {
		name  string
		input []byte
		code  ErrorCode
		eof   bool // wraps io.ErrUnexpectedEOF
	}{
		{"truncated header", []byte{0, 0}, CodeMalformed, true},
		{"truncated body", frame(FramePublish, pub)[:8], CodeMalformed, true},
		{"declared max, little sent", append(binary.BigEndian.AppendUint32(nil, DefaultMaxFrame), 1, 0x9a, 0x01), CodeMalformed, true},
		{"header only", frame(FramePublish, pub)[:4], CodeMalformed, true},
		{"zero-length frame", []byte{0, 0, 0, 0}, CodeMalformed, false},
		{"type byte only", frame(FramePublish, nil), CodeMalformed, false},
		{"unknown type", frame(99, pub), CodeUnknownFrame, false},
		{"unknown type zero", frame(0, nil), CodeUnknownFrame, false},
		{"malformed body", frame(FramePublish, []byte{0xc1, 0xc1}), CodeMalformed, false},
		{"body not an array", frame(FrameAck, []byte{0x01}), CodeMalformed, false},
		{"trailing bytes", frame(FramePublish, append(bytes.Clone(pub), 0x00)), CodeMalformed, false},
		{"too few fields", frame(FramePublish, []byte{0x93, 0x01, 0xa0, 0x00}), CodeMalformed, false},
		{"negative seq", frame(FramePublish, append([]byte{0x9a, 0xff}, pub[2:]...)), CodeMalformed, false},
		{"shard overflows int32", frame(FrameAck, []byte{0x98, 0x00, 0xa0, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0xa0, 0xa0, 0xc2}), CodeMalformed, false},
		{"string where int", frame(FrameCredit, []byte{0x91, 0xa1, 'x'}), CodeMalformed, false},
		{"credit overflows uint32", frame(FrameCredit, []byte{0x91, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0}), CodeMalformed, false},
		{"huge array header", frame(FramePublish, []byte{0xdd, 0xff, 0xff, 0xff, 0xff, 0x00}), CodeMalformed, false},
		{"huge str32", frame(FramePublish, []byte{0x9a, 0x01, 0xdb, 0xff, 0xff, 0xff, 0xff, 'a'}), CodeMalformed, false},
		{"huge bin32", frame(FramePublish, []byte{0x9a, 0x01, 0xa0, 0x00, 0xc6, 0xff, 0xff, 0xff, 0xf0, 'a'}), CodeMalformed, false},
		{"huge header map", frame(FramePublish, []byte{0x9a, 0x01, 0xa0, 0x00, 0xc0, 0xc0, 0xdf, 0xff, 0xff, 0xff, 0xff, 0xa0}), CodeMalformed, false},
		{"huge records array", frame(FrameRecords, []byte{0x93, 0xa0, 0x00, 0xdd, 0x7f, 0xff, 0xff, 0xff, 0x97}), CodeMalformed, false},
		{"records count over bytes", frame(FrameRecords, append([]byte{0x93, 0xa0, 0x00, 0xdc, 0x00, 0x20}, bytes.Repeat([]byte{0x90}, 40)...)), CodeMalformed, false},
		{"huge streams in response", frame(FrameResponse, []byte{0x92, 0xdd, 0x0f, 0xff, 0xff, 0xff, 0xc0, 0xc0}), CodeMalformed, false},
		{"huge map in map update", frame(FrameMap, []byte{0x91, 0xdf, 0x0f, 0xff, 0xff, 0xff, 0xa0}), CodeMalformed, false},
		{"huge ext in trailing field", frame(FrameCredit, []byte{0x92, 0x01, 0xc9, 0xff, 0xff, 0xff, 0xff, 0x01}), CodeMalformed, false},
		{"deep nesting", frame(FrameMap, append([]byte{0x91, 0x81, 0xa1, 'x'}, bytes.Repeat([]byte{0x91}, 100000)...)), CodeMalformed, false},
		{"reserved code 0xc1", frame(FrameCredit, []byte{0x92, 0x01, 0xc1}), CodeMalformed, false},
		{"map update wrong type", frame(FrameMap, []byte{0x91, 0xa3, 'a', 'b', 'c'}), CodeMalformed, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := NewReader(bytes.NewReader(tc.input), 0).Read()
			runtime.ReadMemStats(&after)
			var werr *Error
			if !errors.As(err, &werr) {
				t.Fatalf("Read = %v (%T), want *Error", err, err)
			}
			if werr.Code != tc.code {
				t.Fatalf("code %v (%v), want %v", werr.Code, err, tc.code)
			}
			if got := errors.Is(err, io.ErrUnexpectedEOF); got != tc.eof {
				t.Fatalf("errors.Is(err, io.ErrUnexpectedEOF) = %v, want %v (%v)", got, tc.eof, err)
			}
			// Garbage must not make the decoder allocate much beyond the
			// input and the reader's buffer.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
				t.Fatalf("decoding %d bytes of garbage allocated %d bytes", len(tc.input), alloc)
			}
		})
	}
}

func TestReaderFrameTooLarge(t *testing.T) {
	const max = 1024
	for _, n := range []uint32{max + 1, 1<<32 - 1} {
		// The body of a frame over the limit is never read; a publish far
		// over it is refused as payload_too_large, any other frame as
		// frame_too_large.
		for typ, want := range map[FrameType]*Error{FrameAck: ErrFrameTooLarge, FrameRecords: ErrFrameTooLarge, FramePublish: ErrPayloadTooLarge} {
			if typ == FramePublish && n/skipFactor <= max {
				continue // skipped, not refused: see TestReaderSkipsOversizedPublish
			}
			hdr := append(binary.BigEndian.AppendUint32(nil, n), byte(typ))
			_, err := NewReader(&stopReader{t: t, data: hdr}, max).Read()
			if !errors.Is(err, want) || errors.Is(err, ErrSkipped) {
				t.Fatalf("%v frame of length %d: Read = %v, want %v, not skipped", typ, n, err, want)
			}
		}
	}
	// Exactly the limit is fine.
	b := frame(FrameRecords, body(&Records{Records: []Record{{Value: make([]byte, 1000)}}}))
	r := NewReader(bytes.NewReader(b), len(b)-4)
	if _, err := r.Read(); err != nil {
		t.Fatalf("frame at the limit: %v", err)
	}
	if _, err := NewReader(bytes.NewReader(b), len(b)-5).Read(); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("frame one over the limit: %v", err)
	}
}

// TestReaderSkipsOversizedPublish: a publish over the limit, from one byte
// to four times over, is answered payload_too_large with its Seq, its body
// is dropped without being buffered, and the frames after it read fine.
func TestReaderSkipsOversizedPublish(t *testing.T) {
	const max = 64 << 10
	for _, over := range []int{1, max, 2 * max} {
		big := body(&Publish{Seq: 1<<40 + 7, Stream: "s", Value: make([]byte, max+over)})
		var in []byte
		in = append(in, frame(FramePublish, body(&Publish{Seq: 1, Stream: "s"}))...)
		in = append(in, frame(FramePublish, big)...)
		in = append(in, frame(FramePublish, body(&Publish{Seq: 3, Stream: "s"}))...)
		// One byte per Read at the boundaries would be slow; iotest's
		// half reader splits reads so the skip crosses many of them.
		r := NewReader(iotest.HalfReader(bytes.NewReader(in)), max)
		f, err := r.Read()
		if err != nil || f.(*Publish).Seq != 1 {
			t.Fatalf("first publish: %v, %v", f, err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err = r.Read()
		runtime.ReadMemStats(&after)
		var werr *Error
		if !errors.As(err, &werr) || werr.Code != CodePayloadTooLarge || werr.Seq != 1<<40+7 || !errors.Is(err, ErrSkipped) {
			t.Fatalf("%d over: Read = %#v, want payload_too_large for Seq %d, skipped", over, err, uint64(1<<40+7))
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 2*readBufSize {
			t.Fatalf("skipping a %d-byte frame allocated %d bytes", len(big), alloc)
		}
		f, err = r.Read()
		if err != nil || f.(*Publish).Seq != 3 {
			t.Fatalf("publish after the skipped one: %v, %v", f, err)
		}
	}
	// SetMaxSkip skips further: a publish 16 times over, refused at once
	// by default, is skipped up to the length set, and the stream goes on.
	big := frame(FramePublish, body(&Publish{Seq: 5, Stream: "s", Value: make([]byte, 16*max)}))
	in := append(big, frame(FramePublish, body(&Publish{Seq: 6, Stream: "s"}))...)
	if _, err := NewReader(bytes.NewReader(in), max).Read(); !errors.Is(err, ErrPayloadTooLarge) || errors.Is(err, ErrSkipped) {
		t.Fatalf("16 times over, by default: Read = %v, want payload_too_large, not skipped", err)
	}
	for _, skip := range []int{len(big) - 5, len(big) - 4} {
		r := NewReader(iotest.HalfReader(bytes.NewReader(in)), max)
		r.SetMaxSkip(skip)
		_, err := r.Read()
		if skip < len(big)-4 {
			if errors.Is(err, ErrSkipped) {
				t.Fatalf("a frame of %d bytes skipped past SetMaxSkip(%d)", len(big)-4, skip)
			}
			continue
		}
		var werr *Error
		if !errors.As(err, &werr) || werr.Seq != 5 || !errors.Is(err, ErrSkipped) {
			t.Fatalf("16 times over, SetMaxSkip(%d): Read = %v, want payload_too_large for Seq 5, skipped", skip, err)
		}
		if f, err := r.Read(); err != nil || f.(*Publish).Seq != 6 {
			t.Fatalf("publish after the skipped one: %v, %v", f, err)
		}
	}
	// A stream that ends inside the skipped body is malformed.
	in = frame(FramePublish, body(&Publish{Seq: 9, Value: make([]byte, 2*max)}))[:max+100]
	if _, err := NewReader(bytes.NewReader(in), max).Read(); !errors.Is(err, ErrMalformed) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated oversized publish: %v, want malformed (unexpected EOF)", err)
	}
}

func TestPublishFrameLimit(t *testing.T) {
	const record = 1 << 20
	limit := PublishFrameLimit(record, 64)
	h := map[string]string{}
	hb := 0
	for i := range 64 {
		k := fmt.Sprintf("k%02d", i)
		h[k] = strings.Repeat("v", 100)
		hb += len(k) + 100
	}
	pid := strings.Repeat("p", 128)
	full := &Publish{Seq: 1<<64 - 1, Stream: strings.Repeat("s", 128), Shard: -1, Key: make([]byte, 1000),
		Value: make([]byte, record-1000-hb-len(pid)), Headers: h, ProducerID: pid, ProducerSeq: 1<<64 - 1,
		Epoch: 1<<64 - 1, Via: strings.Repeat("n", 128)}
	if n := len(body(full)) + 1; n > limit {
		t.Fatalf("a publish of a %d-byte record is a %d-byte frame, over the derived limit %d", record, n, limit)
	}
	recs := &Records{Stream: full.Stream, Shard: 1<<31 - 1, Records: []Record{{Offset: 1<<64 - 1, Timestamp: -1,
		Key: full.Key, Value: full.Value, Headers: h, ProducerID: pid, ProducerSeq: 1<<64 - 1}}}
	if n := len(body(recs)) + 1; n > limit {
		t.Fatalf("a records frame of one %d-byte record is %d bytes, over the derived limit %d", record, n, limit)
	}
}

// RecordLen and RecordsRoom bound a Records frame's length: records
// whose RecordLen sum to RecordsRoom fit the limit, whatever the sizes of
// their fields' encodings.
func TestRecordsFrameBound(t *testing.T) {
	headers := func(n, size int) map[string]string {
		h := make(map[string]string, n)
		for i := range n {
			h[fmt.Sprintf("%0*d", size, i)] = strings.Repeat("v", size)
		}
		return h
	}
	longest := Record{Offset: 1<<64 - 1, Timestamp: -1 << 63, Key: make([]byte, 70000), Value: make([]byte, 70000),
		Headers: headers(17, 70000), ProducerID: strings.Repeat("p", 70000), ProducerSeq: 1<<64 - 1}
	for _, tc := range []struct {
		name    string
		stream  string
		records []Record
	}{
		{"empty", "s", []Record{{}}},
		{"small", "orders", []Record{{Offset: 1, Timestamp: 1, Key: []byte("k"), Value: []byte("v"), Headers: map[string]string{"a": "b"}}}},
		{"longest fields", strings.Repeat("s", 300), []Record{longest, longest}},
		{"many headers", "s", []Record{{Offset: 1 << 40, Headers: headers(70000, 1)}}},
		{"many records", "s", make([]Record, 70000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &Records{Stream: tc.stream, Shard: -1 << 31, Records: tc.records}
			sum := 0
			for i := range f.Records {
				r := &f.Records[i]
				size := len(r.Key) + len(r.Value) + len(r.ProducerID)
				for k, v := range r.Headers {
					size += len(k) + len(v)
				}
				sum += RecordLen(size, len(r.Headers))
			}
			// The frame fits a limit of n and no less: so must the bound.
			n := len(body(f)) + 1
			if room := RecordsRoom(n, f.Stream); sum < room {
				t.Fatalf("a records frame of %d bytes: its records' RecordLen sum to %d, less than RecordsRoom(%d) = %d", n, sum, n, room)
			}
		})
	}
}

func TestReaderPassesStreamErrors(t *testing.T) {
	boom := errors.New("stream reset")
	_, err := NewReader(iotest.ErrReader(boom), 0).Read()
	if !errors.Is(err, boom) {
		t.Fatalf("Read = %v, want wrapping %v", err, boom)
	}
	var werr *Error
	if errors.As(err, &werr) {
		t.Fatalf("a stream error must not look like a wire error: %v", err)
	}
}

func TestReaderReadyAndRaw(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	if err := w.WriteBatch(&Credit{Records: 1}, &Credit{Records: 2}); err != nil {
		t.Fatal(err)
	}
	buf.Write(frame(FrameCredit, body(&Credit{Records: 3}))[:6]) // partial
	r := NewReader(&buf, 0)
	if r.Ready() {
		t.Fatal("Ready before any read")
	}
	typ, b, err := r.ReadRaw()
	if err != nil || typ != FrameCredit || !bytes.Equal(b, body(&Credit{Records: 1})) {
		t.Fatalf("ReadRaw = %v, %x, %v", typ, b, err)
	}
	if !r.Ready() {
		t.Fatal("second frame buffered but not Ready")
	}
	if r.LastSize() != len(b) {
		t.Fatalf("LastSize %d after a frame body of %d bytes", r.LastSize(), len(b))
	}
	if _, err := r.Read(); err != nil {
		t.Fatal(err)
	}
	if want := len(body(&Credit{Records: 2})); r.LastSize() != want {
		t.Fatalf("LastSize %d after a frame body of %d bytes", r.LastSize(), want)
	}
	if r.Ready() {
		t.Fatal("Ready with a partial frame buffered")
	}
}

func TestReaderReleasesBigBuffer(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.Write(&Publish{Value: make([]byte, 1<<20)})
	w.Write(&Credit{Records: 1})
	r := NewReader(&buf, 0)
	for range 2 {
		if _, err := r.Read(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Read(); err != io.EOF {
		t.Fatal(err)
	}
	if len(r.buf) > keepBufSize {
		t.Fatalf("reader kept a %d-byte buffer", len(r.buf))
	}
}

func TestVersionTolerance(t *testing.T) {
	// A Publish without Created (a client's, an earlier peer's) has ten
	// fields; a forwarder's has eleven.
	if b := body(&Publish{Seq: 1, Stream: "s"}); b[0] != 0x9a {
		t.Fatalf("a Publish without Created starts 0x%02x, want 0x9a (10 elements)", b[0])
	}
	fwd := &Publish{Seq: 1, Stream: "s", Epoch: 7, Via: "n1", Created: 5}
	if got, err := DecodeFrame(FramePublish, body(fwd)); err != nil || !reflect.DeepEqual(got, fwd) {
		t.Fatalf("forward with Created: got %#v, %v; want %#v", got, err, fwd)
	}
	// A newer peer's Publish with two more fields decodes; the extra
	// fields are ignored.
	want := &Publish{Seq: 1, Stream: "s", Value: []byte("v"), Created: 3}
	b := body(want)
	b[0] = 0x9d // 13 elements
	b = append(b, 0xa3, 'n', 'e', 'w', 0x92, 0x01, 0x02)
	got, err := DecodeFrame(FramePublish, b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v, want %#v", got, want)
	}
	// An Ack without Epoch has the nine fields of earlier versions; an
	// earlier client's decoder (eight required, the rest skipped) reads
	// one with it.
	if b := body(&Ack{Seq: 1, Duplicate: true}); b[0] != 0x99 {
		t.Fatalf("an Ack without Epoch starts 0x%02x, want 0x99 (9 elements)", b[0])
	}
	ab := body(&Ack{Seq: 1, Stream: "s", Offset: 4, Epoch: 12})
	if ab[0] != 0x9a {
		t.Fatalf("an Ack with Epoch starts 0x%02x, want 0x9a (10 elements)", ab[0])
	}
	d := &decoder{b: ab}
	n := d.arrayHeader(8)
	if seq, stream, _, off := d.uint64(), d.str(), d.int32(), d.uint64(); seq != 1 || stream != "s" || off != 4 {
		t.Fatalf("an earlier decoder read %d %q offset %d", seq, stream, off)
	}
	_, _, _, _ = d.int64(), d.str(), d.str(), d.bool()
	if d.skipN(n - 8); d.err != nil || d.off != len(ab) {
		t.Fatalf("an earlier decoder skipping Duplicate and Epoch: %v at %d of %d", d.err, d.off, len(ab))
	}
	// A Subscribe without Created (an earlier client's) has five fields.
	if b := body(&Subscribe{Stream: "s"}); b[0] != 0x95 {
		t.Fatalf("a Subscribe without Created starts 0x%02x, want 0x95 (5 elements)", b[0])
	}
	// One with Epoch sends Created too, even if 0 (seven fields); one
	// with Created alone, six.
	if b := body(&Subscribe{Stream: "s", Epoch: 3}); b[0] != 0x97 || b[len(b)-2] != 0 || b[len(b)-1] != 3 {
		t.Fatalf("a Subscribe with Epoch alone: % x, want 7 elements ending 0, 3", b)
	}
	if b := body(&Subscribe{Stream: "s", Created: 3}); b[0] != 0x96 {
		t.Fatalf("a Subscribe with Created alone starts 0x%02x, want 0x96 (6 elements)", b[0])
	}
	// One with Cluster sends Created and Epoch too (eight fields); an
	// earlier broker skips it.
	sb := body(&Subscribe{Stream: "s", Cluster: "c1"})
	if sb[0] != 0x98 {
		t.Fatalf("a Subscribe with Cluster starts 0x%02x, want 0x98 (8 elements)", sb[0])
	}
	d = &decoder{b: sb}
	n = d.arrayHeader(5)
	if stream := d.str(); stream != "s" {
		t.Fatalf("an earlier decoder read stream %q", stream)
	}
	_, _, _, _, _, _ = d.int32(), d.uint8(), d.uint64(), d.uint32(), d.uint64(), d.uint64()
	if d.skipN(n - 7); d.err != nil || d.off != len(sb) {
		t.Fatalf("an earlier decoder skipping Cluster: %v at %d of %d", d.err, d.off, len(sb))
	}
	// A Raft frame has two fields unless it opens a duplex stream; an
	// earlier broker reads a duplex one as a plain one.
	if b := body(&Raft{From: "n1"}); b[0] != 0x92 {
		t.Fatalf("a Raft frame without Duplex starts 0x%02x, want 0x92 (2 elements)", b[0])
	}
	if b := body(&Raft{From: "n1", Duplex: true}); b[0] != 0x93 || b[len(b)-1] != 0xc3 {
		t.Fatalf("a duplex Raft frame: % x, want 3 elements ending in true", b)
	}
	// A record with an extra field too.
	rb := body(&Records{Stream: "s", Records: []Record{{Offset: 1}}})
	i := bytes.IndexByte(rb, 0x97)
	rb = append(rb[:i:i], append([]byte{0x98}, append(rb[i+1:], 0xc3)...)...)
	gotR, err := DecodeFrame(FrameRecords, rb)
	if err != nil {
		t.Fatal(err)
	}
	if r := gotR.(*Records); len(r.Records) != 1 || r.Records[0].Offset != 1 {
		t.Fatalf("got %#v", r)
	}
}

// TestRequestMoveFields: a Request's Admit and Move are trailing fields,
// sent only when set. A request with neither has the four fields of
// earlier versions; one with Move but no Admit sends Admit as nil to keep
// Move's position; a sender of five fields (no Move) decodes with Move
// nil, and a Response with Moved is read by an earlier peer as one
// without.
func TestRequestMoveFields(t *testing.T) {
	if b := body(&Request{Op: "stream.info"}); b[0] != 0x94 {
		t.Fatalf("a Request without Admit or Move starts 0x%02x, want 0x94 (4 elements)", b[0])
	}
	if b := body(&Request{Op: "replica.admit", Admit: &ReplicaAdmit{Shard: 1}}); b[0] != 0x95 {
		t.Fatalf("a Request with Admit starts 0x%02x, want 0x95 (5 elements)", b[0])
	}
	move := &Request{Op: "stream.move", Stream: shardmap.StreamConfig{Name: "orders"}, Move: &ReplicaMove{Shard: 2, From: "n1", To: "n3"}}
	var generic []any
	if err := msgpack.Unmarshal(body(move), &generic); err != nil {
		t.Fatal(err)
	}
	if len(generic) != 6 || generic[4] != nil {
		t.Fatalf("a Request with Move but no Admit: %d elements %v; want 6, Admit nil", len(generic), generic)
	}
	elems := rawElems(t, body(move))
	var mv ReplicaMove
	if err := msgpack.Unmarshal(elems[5], &mv); err != nil || mv != *move.Move {
		t.Fatalf("Move encoded as %+v (%v), want %+v", mv, err, *move.Move)
	}

	// An earlier sender's five fields (Admit, no Move).
	five := append([]byte{0x95}, bytes.Join(append(elems[:4:4], []byte{0xc0}), nil)...)
	got, err := DecodeFrame(FrameRequest, five)
	if err != nil {
		t.Fatal(err)
	}
	if r := got.(*Request); r.Move != nil || r.Admit != nil || r.Op != "stream.move" || r.Stream.Name != "orders" {
		t.Fatalf("five fields decoded as %#v", r)
	}
	// A newer sender's ninth field is skipped (the seventh, NodeID, and
	// the eighth, ID, empty here).
	nine := append(append([]byte{0x99}, body(move)[1:]...), 0xa0, 0xa0, 0xa3, 'n', 'e', 'w')
	if got, err := DecodeFrame(FrameRequest, nine); err != nil || !reflect.DeepEqual(got, move) {
		t.Fatalf("nine fields: %#v, %v; want %#v", got, err, move)
	}

	// A Response with Moved has six fields, Ctl and Replicas nil; without
	// the sixth it is the Response it was.
	resp := &Response{Streams: []shardmap.StreamConfig{{Name: "orders", Shards: 1}}, Moved: &ReplicaMove{From: "n1", To: "n2"}}
	rb := body(resp)
	if rb[0] != 0x96 {
		t.Fatalf("a Response with Moved starts 0x%02x, want 0x96 (6 elements)", rb[0])
	}
	old := append([]byte{0x95}, bytes.Join(rawElems(t, rb)[:5], nil)...)
	got, err = DecodeFrame(FrameResponse, old)
	if err != nil {
		t.Fatal(err)
	}
	if r := got.(*Response); r.Moved != nil || len(r.Streams) != 1 || r.Ctl != nil || r.Replicas != nil {
		t.Fatalf("five fields of a Response decoded as %#v", r)
	}
}

// TestMapUpdateFeaturesField: a MapUpdate's Features (the sending ctl's,
// on a registration stream) is a trailing field, sent only when set: one
// without it has the single field of earlier versions, an earlier
// decoder (one field required, the rest skipped) reads one with it as
// the same map, a sender of one field decodes with Features nil, and a
// newer sender's fourth field is skipped.
func TestMapUpdateFeaturesField(t *testing.T) {
	mp := &shardmap.Map{Epoch: 7, Nodes: []shardmap.Node{{ID: "n1", Addr: "a", Live: true}}}
	if b := body(&MapUpdate{Map: mp}); b[0] != 0x91 {
		t.Fatalf("a MapUpdate without Features starts 0x%02x, want 0x91 (1 element)", b[0])
	}
	if b := body(&MapUpdate{Map: mp, Features: []string{}}); b[0] != 0x91 {
		t.Fatalf("a MapUpdate with empty Features starts 0x%02x, want 0x91 (1 element)", b[0])
	}
	with := &MapUpdate{Map: mp, Features: []string{FeatureHeartbeatAcks, "later"}}
	b := body(with)
	if b[0] != 0x92 {
		t.Fatalf("a MapUpdate with Features starts 0x%02x, want 0x92 (2 elements)", b[0])
	}
	d := &decoder{b: b}
	n := d.arrayHeader(1)
	var old *shardmap.Map
	d.msgpack(&old)
	if d.skipN(n - 1); d.err != nil || d.off != len(b) || old.Epoch != 7 || len(old.Nodes) != 1 {
		t.Fatalf("an earlier decoder read %+v, %v at %d of %d", old, d.err, d.off, len(b))
	}
	one := append([]byte{0x91}, rawElems(t, b)[0]...)
	if got, err := DecodeFrame(FrameMap, one); err != nil || got.(*MapUpdate).Features != nil || got.(*MapUpdate).Map.Epoch != 7 {
		t.Fatalf("one field decoded as %#v, %v", got, err)
	}
	four := append(append([]byte{0x94}, b[1:]...), 0x00, 0xa3, 'n', 'e', 'w') // LeaseTTL 0, then a field of a later version
	if got, err := DecodeFrame(FrameMap, four); err != nil || !reflect.DeepEqual(got, with) {
		t.Fatalf("four fields: %#v, %v; want %#v", got, err, with)
	}
}

// TestMapUpdateLeaseTTLField: a MapUpdate's LeaseTTL (the sending ctl's
// broker lease) is a trailing field after Features, sent only when set
// (Features then as an empty list if there are none): a MapUpdate
// without it encodes as before, an earlier decoder (the map and
// Features read, the rest skipped) reads one with it as the same map and
// features, and it decodes back exactly.
func TestMapUpdateLeaseTTLField(t *testing.T) {
	mp := &shardmap.Map{Epoch: 7, Nodes: []shardmap.Node{{ID: "n1", Addr: "a", Live: true}}}
	if b := body(&MapUpdate{Map: mp, Features: []string{FeatureHeartbeatAcks}}); b[0] != 0x92 {
		t.Fatalf("a MapUpdate with Features and no LeaseTTL starts 0x%02x, want 0x92 (2 elements)", b[0])
	}
	for _, with := range []*MapUpdate{
		{Map: mp, Features: []string{FeatureHeartbeatAcks}, LeaseTTL: 3 * time.Second},
		{Map: mp, LeaseTTL: 300 * time.Millisecond}, // no features: an empty list before it
		{Map: mp, LeaseTTL: math.MaxInt64},
	} {
		b := body(with)
		if b[0] != 0x93 {
			t.Fatalf("a MapUpdate with LeaseTTL %v starts 0x%02x, want 0x93 (3 elements)", with.LeaseTTL, b[0])
		}
		d := &decoder{b: b}
		n := d.arrayHeader(1)
		var old *shardmap.Map
		d.msgpack(&old)
		features := d.strs()
		if d.skipN(n - 2); d.err != nil || d.off != len(b) || old.Epoch != 7 || !slices.Equal(features, with.Features) && len(features)+len(with.Features) > 0 {
			t.Fatalf("an earlier decoder read %+v, features %q, %v at %d of %d", old, features, d.err, d.off, len(b))
		}
		if got, err := DecodeFrame(FrameMap, b); err != nil || !reflect.DeepEqual(got, with) {
			t.Fatalf("decoded %#v, %v; want %#v", got, err, with)
		}
	}
}

// rawElems splits the msgpack array b into its encoded elements.
func rawElems(t *testing.T, b []byte) [][]byte {
	t.Helper()
	var raw []msgpack.RawMessage
	if err := msgpack.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	out := make([][]byte, len(raw))
	for i, r := range raw {
		out[i] = r
		if len(r) == 0 {
			out[i] = []byte{0xc0} // RawMessage holds nil as nothing
		}
	}
	return out
}

// TestRequestNodeIDField: a Request's NodeID (cluster.remove) is its
// seventh field, sent only when set, with Admit and Move as nil before
// it; a sender of six fields decodes with NodeID "", and a newer sender's
// eighth field is skipped.
func TestRequestNodeIDField(t *testing.T) {
	if b := body(&Request{Op: "stream.move", Move: &ReplicaMove{From: "n1"}}); b[0] != 0x96 {
		t.Fatalf("a Request with Move but no NodeID starts 0x%02x, want 0x96 (6 elements)", b[0])
	}
	remove := &Request{Op: "cluster.remove", Principal: "alice", NodeID: "n2"}
	b := body(remove)
	if b[0] != 0x97 {
		t.Fatalf("a Request with NodeID starts 0x%02x, want 0x97 (7 elements)", b[0])
	}
	var generic []any
	if err := msgpack.Unmarshal(b, &generic); err != nil {
		t.Fatal(err)
	}
	if generic[4] != nil || generic[5] != nil || generic[6] != "n2" {
		t.Fatalf("a Request with NodeID only: %v; want Admit and Move nil, then the node id", generic)
	}
	if got, err := DecodeFrame(FrameRequest, b); err != nil || !reflect.DeepEqual(got, remove) {
		t.Fatalf("round trip: %#v, %v; want %#v", got, err, remove)
	}

	// An earlier sender's six fields (no NodeID).
	elems := rawElems(t, b)
	six := append([]byte{0x96}, bytes.Join(elems[:6], nil)...)
	got, err := DecodeFrame(FrameRequest, six)
	if err != nil {
		t.Fatal(err)
	}
	if r := got.(*Request); r.NodeID != "" || r.Move != nil || r.Op != "cluster.remove" || r.Principal != "alice" {
		t.Fatalf("six fields decoded as %#v", r)
	}
	// A newer sender's ninth field is skipped.
	nine := append(append([]byte{0x99}, b[1:]...), 0xa0, 0x81, 0xa1, 'k', 0x01)
	if got, err := DecodeFrame(FrameRequest, nine); err != nil || !reflect.DeepEqual(got, remove) {
		t.Fatalf("nine fields: %#v, %v; want %#v", got, err, remove)
	}
	// A node id that is not a string is malformed.
	bad := append(append([]byte{0x97}, bytes.Join(elems[:6], nil)...), 0x07)
	if _, err := DecodeFrame(FrameRequest, bad); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a node id of 7: %v, want malformed", err)
	}
}

// TestRequestIDField: a Request's ID is its eighth field, sent only when
// set, with Admit and Move nil and NodeID "" before it; a decoder of seven
// fields (an earlier ctl) skips it, and a sender of seven decodes with ID "".
func TestRequestIDField(t *testing.T) {
	create := &Request{Op: "stream.create", Stream: shardmap.StreamConfig{Name: "orders", Shards: 2}, ID: "4f1c-9a"}
	b := body(create)
	if b[0] != 0x98 {
		t.Fatalf("a Request with an ID starts 0x%02x, want 0x98 (8 elements)", b[0])
	}
	var generic []any
	if err := msgpack.Unmarshal(b, &generic); err != nil {
		t.Fatal(err)
	}
	if generic[4] != nil || generic[5] != nil || generic[6] != "" || generic[7] != "4f1c-9a" {
		t.Fatalf("a Request with an ID only: %v; want Admit and Move nil, NodeID empty, then the id", generic)
	}
	if got, err := DecodeFrame(FrameRequest, b); err != nil || !reflect.DeepEqual(got, create) {
		t.Fatalf("round trip: %#v, %v; want %#v", got, err, create)
	}
	if b := body(&Request{Op: "stream.create"}); b[0] != 0x94 {
		t.Fatalf("a Request without an ID starts 0x%02x, want 0x94 as before", b[0])
	}
	elems := rawElems(t, b)
	seven := append([]byte{0x97}, bytes.Join(elems[:7], nil)...)
	got, err := DecodeFrame(FrameRequest, seven)
	if err != nil {
		t.Fatal(err)
	}
	if r := got.(*Request); r.ID != "" || r.Op != "stream.create" || r.Stream.Name != "orders" {
		t.Fatalf("seven fields decoded as %#v", r)
	}
	for id, ok := range map[string]bool{"": true, "a-Z_09": true, strings.Repeat("x", MaxIDLen): true,
		strings.Repeat("x", MaxIDLen+1): false, "a b": false, "a/b": false, "é": false} {
		if ValidID(id) != ok {
			t.Errorf("ValidID(%q) = %v, want %v", id, !ok, ok)
		}
	}
}

// TestRegisterFeaturesField: a Register's Features is its fourth field,
// sent only when not empty, so a Register without it is the three fields
// of earlier versions; the decoder of an earlier ctl (three fields
// required, the rest skipped) reads one with Features, and this decoder
// reads an earlier broker's three fields with Features nil and skips a
// newer sender's fifth.
func TestRegisterFeaturesField(t *testing.T) {
	if b := body(&Register{NodeID: "n1", Addr: "a:1"}); b[0] != 0x93 {
		t.Fatalf("a Register without Features starts 0x%02x, want 0x93 (3 elements)", b[0])
	}
	if b := body(&Register{NodeID: "n1", Addr: "a:1", Features: []string{}}); b[0] != 0x93 {
		t.Fatalf("a Register with empty Features starts 0x%02x, want 0x93 (3 elements)", b[0])
	}
	reg := &Register{NodeID: "n1", Addr: "10.0.0.1:7400", Admin: "10.0.0.1:8400", Features: Features()}
	b := body(reg)
	if b[0] != 0x94 {
		t.Fatalf("a Register with Features starts 0x%02x, want 0x94 (4 elements)", b[0])
	}
	var generic []any
	if err := msgpack.Unmarshal(b, &generic); err != nil {
		t.Fatal(err)
	}
	if got, ok := generic[3].([]any); !ok || fmt.Sprint(got) != fmt.Sprint(Features()) {
		t.Fatalf("Features encoded as %#v, want %q", generic[3], Features())
	}
	if got, err := DecodeFrame(FrameRegister, b); err != nil || !reflect.DeepEqual(got, reg) {
		t.Fatalf("round trip: %#v, %v; want %#v", got, err, reg)
	}

	// The decoder of an earlier version, as it was.
	decodeEarlier := func(b []byte) (*Register, error) {
		d := &decoder{b: b}
		r := new(Register)
		n := d.arrayHeader(3)
		r.NodeID = d.str()
		r.Addr = d.str()
		r.Admin = d.str()
		d.skipN(n - 3)
		if d.err == nil && d.off != len(d.b) {
			d.fail("%d bytes after the body", len(d.b)-d.off)
		}
		if d.err != nil {
			return nil, d.err
		}
		return r, nil
	}
	if got, err := decodeEarlier(b); err != nil || !reflect.DeepEqual(got, &Register{NodeID: reg.NodeID, Addr: reg.Addr, Admin: reg.Admin}) {
		t.Fatalf("an earlier ctl decodes a Register with Features as %#v, %v", got, err)
	}

	// An earlier broker's three fields.
	elems := rawElems(t, b)
	three := append([]byte{0x93}, bytes.Join(elems[:3], nil)...)
	got, err := DecodeFrame(FrameRegister, three)
	if err != nil {
		t.Fatal(err)
	}
	if r := got.(*Register); r.Features != nil || r.NodeID != "n1" || r.Admin != reg.Admin {
		t.Fatalf("three fields decoded as %#v", r)
	}
	// A newer sender's sixth field is skipped (the fifth, Cluster, empty).
	six := append(append([]byte{0x96}, b[1:]...), 0xa0, 0x81, 0xa1, 'k', 0x01)
	if got, err := DecodeFrame(FrameRegister, six); err != nil || !reflect.DeepEqual(got, reg) {
		t.Fatalf("six fields: %#v, %v; want %#v", got, err, reg)
	}
	// Cluster, the fifth field, sent only when set, with Features as an
	// empty list before it when there are none.
	withCluster := &Register{NodeID: "n1", Addr: "10.0.0.1:7400", Cluster: "C1"}
	cb := body(withCluster)
	if cb[0] != 0x95 {
		t.Fatalf("a Register with a cluster starts 0x%02x, want 0x95 (5 elements)", cb[0])
	}
	if got, err := DecodeFrame(FrameRegister, cb); err != nil || !reflect.DeepEqual(got, withCluster) {
		t.Fatalf("round trip with a cluster: %#v, %v; want %#v", got, err, withCluster)
	}
	// Features sent as nil, or empty, read as none.
	for _, last := range []byte{0xc0, 0x90} {
		nilFeatures := append(append([]byte{0x94}, bytes.Join(elems[:3], nil)...), last)
		if got, err := DecodeFrame(FrameRegister, nilFeatures); err != nil || got.(*Register).Features != nil {
			t.Fatalf("Features 0x%02x: %#v, %v; want nil", last, got, err)
		}
	}
	// Features that are not strings are malformed.
	bad := append(append([]byte{0x94}, bytes.Join(elems[:3], nil)...), 0x91, 0x07)
	if _, err := DecodeFrame(FrameRegister, bad); !errors.Is(err, ErrMalformed) {
		t.Fatalf("features [7]: %v, want malformed", err)
	}
}

func TestErrors(t *testing.T) {
	err := error(&Error{Seq: 1, Code: CodeNotOwner, Message: "shard x/1 is owned by n2", Epoch: 4, Owner: "n2"})
	if got, want := err.Error(), "felix: not_owner: shard x/1 is owned by n2"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if got, want := ErrUnavailable.Error(), "felix: unavailable"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	wrapped := fmt.Errorf("publishing to x: %w", err)
	if !errors.Is(wrapped, ErrNotOwner) {
		t.Error("errors.Is(wrapped not-owner, ErrNotOwner) = false")
	}
	if errors.Is(wrapped, ErrUnavailable) {
		t.Error("errors.Is(not-owner, ErrUnavailable) = true")
	}
	var werr *Error
	if !errors.As(wrapped, &werr) || werr.Owner != "n2" || werr.Epoch != 4 {
		t.Errorf("errors.As lost fields: %#v", werr)
	}
	for code := CodeMalformed; code <= CodeReplaced; code++ {
		if s := code.String(); strings.HasPrefix(s, "code_") || s != strings.ToLower(s) {
			t.Errorf("code %d has name %q", code, s)
		}
	}
	if got := ErrorCode(999).String(); got != "code_999" {
		t.Errorf("unknown code name %q", got)
	}
	if got := FrameType(200).String(); got != "frame_200" {
		t.Errorf("unknown frame type name %q", got)
	}
	cause := errors.New("disk full")
	e := Errorf(CodeInternal, "appending to x/1: %w", cause)
	if !errors.Is(e, cause) || !errors.Is(e, ErrInternal) || e.Message != "appending to x/1: disk full" {
		t.Errorf("Errorf = %#v", e)
	}
	if got := ErrorFrom(cause); got.Code != CodeInternal || !errors.Is(got, cause) {
		t.Errorf("ErrorFrom(plain) = %#v", got)
	}
	if got := ErrorFrom(wrapped); got != err {
		t.Errorf("ErrorFrom(wrapped *Error) = %#v, want the *Error", got)
	}
	if ErrorFrom(nil) != nil {
		t.Error("ErrorFrom(nil) != nil")
	}
	if !(&Error{Code: CodeTimeout}).Timeout() || ErrInternal.Timeout() {
		t.Error("Timeout() wrong")
	}
}

// TestHeadersDecodeBounded: a header map declaring many entries that are
// all one key is malformed, and no map is sized for the declared count.
// It was accepted as one header in a map sized for 500,000 (about 40 MiB
// per 1 MB record, kept by the shard's in-memory tail).
func TestHeadersDecodeBounded(t *testing.T) {
	pub := body(&Publish{Stream: "s", Value: []byte("v"), Headers: map[string]string{"": ""}})
	one := []byte{0x81, 0xa0, 0xa0}
	at := bytes.Index(pub, one)
	if at < 0 {
		t.Fatal("header map not found in the encoded publish")
	}
	const n = 100_000
	dup := binary.BigEndian.AppendUint32([]byte{0xdf}, n)
	dup = append(dup, bytes.Repeat([]byte{0xa0, 0xa0}, n)...)
	b := append(append(bytes.Clone(pub[:at]), dup...), pub[at+len(one):]...)
	var err error
	allocated := testing.Benchmark(func(tb *testing.B) {
		tb.ReportAllocs()
		for range tb.N {
			_, err = DecodeFrame(FramePublish, b)
		}
	}).AllocedBytesPerOp()
	if !errors.Is(err, ErrMalformed) {
		t.Fatalf("a header given %d times: %v, want malformed", n, err)
	}
	if allocated > 2*int64(len(b)) { // a copy of the body at most, not a map for every entry
		t.Fatalf("decoding a %d-byte body allocated %d bytes", len(b), allocated)
	}
}

// TestReadIfDoesNotDecodeOthers: a frame of a type the stream does not
// carry is refused unexpected_frame without being decoded: a Records
// frame of many empty records decodes to many times its size.
func TestReadIfDoesNotDecodeOthers(t *testing.T) {
	recs := &Records{Stream: "s", Records: make([]Record, 20_000)}
	raw, err := AppendFrame(nil, recs)
	if err != nil {
		t.Fatal(err)
	}
	raw = append(raw, frame(FrameCredit, body(&Credit{Records: 7}))...)
	r := NewReader(bytes.NewReader(raw), 0)
	var got error
	allocated := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			r = NewReader(bytes.NewReader(raw), 0)
			_, got = r.ReadIf(FrameCredit)
		}
	}).AllocedBytesPerOp()
	if !errors.Is(got, ErrUnexpectedFrame) {
		t.Fatalf("a Records frame read as Credit: %v, want unexpected_frame", got)
	}
	if allocated > 4*int64(len(raw)) { // the read buffer, not the decoded records
		t.Fatalf("refusing a %d-byte frame allocated %d bytes", len(raw), allocated)
	}
	if f, err := r.ReadIf(FrameCredit); err != nil || f.(*Credit).Records != 7 {
		t.Fatalf("the Credit frame after it: %v, %v", f, err)
	}
}

// TestHeartbeatReplicasField: a Heartbeat's Replicas is its third field,
// sent only when set, so one without it is the two fields of earlier
// versions; the decoder of an earlier ctl (two fields required, the rest
// skipped) reads one with it, and a report listing more than
// MaxUnreadyReported replicas is malformed.
func TestHeartbeatReplicasField(t *testing.T) {
	if b := body(&Heartbeat{NodeID: "n1", Epoch: 4}); b[0] != 0x92 {
		t.Fatalf("a Heartbeat without Replicas starts 0x%02x, want 0x92 (2 elements)", b[0])
	}
	hb := &Heartbeat{NodeID: "n1", Epoch: 4, Replicas: &ReplicaReport{Applied: 4, Unready: []shardmap.ShardID{{Stream: "s", Shard: 1}}}}
	b := body(hb)
	if b[0] != 0x93 {
		t.Fatalf("a Heartbeat with Replicas starts 0x%02x, want 0x93 (3 elements)", b[0])
	}
	d := &decoder{b: b} // an earlier ctl's decoder, as it was
	n := d.arrayHeader(2)
	if id, epoch := d.str(), d.uint64(); id != "n1" || epoch != 4 {
		t.Fatalf("an earlier decoder read %q, %d", id, epoch)
	}
	if d.skipN(n - 2); d.err != nil || d.off != len(b) {
		t.Fatalf("an earlier decoder skipping Replicas: %v at %d of %d", d.err, d.off, len(b))
	}

	over := &Heartbeat{NodeID: "n1", Replicas: &ReplicaReport{Unready: make([]shardmap.ShardID, MaxUnreadyReported+1)}}
	if _, err := DecodeFrame(FrameHeartbeat, body(over)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a report of %d unready replicas decoded: %v", MaxUnreadyReported+1, err)
	}
}
