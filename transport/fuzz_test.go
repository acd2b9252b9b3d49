package transport

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
)

// FuzzDecodeFrame decodes arbitrary bodies of every frame type: no panic,
// only typed errors, and whatever decodes re-encodes to the same frame.
func FuzzDecodeFrame(f *testing.F) {
	for _, tc := range sampleFrames() {
		b, err := AppendFrame(nil, tc.f)
		if err != nil {
			f.Fatal(err)
		}
		if len(b) > 4096 {
			continue // keep the corpus small
		}
		f.Add(b[4], b[5:])
	}
	f.Add(byte(FramePublish), []byte{0x9a, 0x01, 0xdb, 0xff, 0xff, 0xff, 0xff})
	f.Add(byte(FrameMap), []byte{0x91, 0x81, 0xa5, 'n', 'o', 'd', 'e', 's', 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add(byte(99), []byte{0x90})
	// A Register whose Features is nil, and one whose features are not
	// strings.
	f.Add(byte(FrameRegister), []byte{0x94, 0xa1, 'n', 0xa1, 'a', 0xa0, 0xc0})
	f.Add(byte(FrameRegister), []byte{0x94, 0xa1, 'n', 0xa1, 'a', 0xa0, 0x92, 0x01, 0xc0})

	f.Fuzz(func(t *testing.T, typ byte, body []byte) {
		got, err := DecodeFrame(FrameType(typ), body)
		if err != nil {
			var werr *Error
			if !errors.As(err, &werr) || (werr.Code != CodeMalformed && werr.Code != CodeUnknownFrame) {
				t.Fatalf("DecodeFrame error %v (%T), want malformed or unknown_frame", err, err)
			}
			return
		}
		if got.Type() != FrameType(typ) {
			t.Fatalf("decoded %v from a %v frame", got.Type(), FrameType(typ))
		}
		b, err := AppendFrame(nil, got)
		if err != nil {
			t.Fatalf("re-encoding %#v: %v", got, err)
		}
		again, err := DecodeFrame(FrameType(b[4]), b[5:])
		if err != nil {
			t.Fatalf("decoding re-encoded %#v: %v", got, err)
		}
		if !reflect.DeepEqual(got, again) {
			t.Fatalf("re-encoding changed the frame:\n%#v\n%#v", got, again)
		}
		// The same bytes through a Reader, in a stream.
		stream := append(frame(FrameType(typ), body), b...)
		r := NewReader(bytes.NewReader(stream), 0)
		for range 2 {
			if _, err := r.Read(); err != nil {
				t.Fatalf("Reader: %v", err)
			}
		}
		if _, err := r.Read(); err != io.EOF {
			t.Fatalf("Reader at end: %v", err)
		}
	})
}
