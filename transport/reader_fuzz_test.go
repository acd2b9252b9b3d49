package transport

import (
	"bytes"
	"errors"
	"testing"
	"testing/iotest"
)

// FuzzReader reads frames from arbitrary bytes with a small frame limit,
// so that the skipping of oversized publish frames is exercised: it must
// never panic, every error is typed or ends the input, and a skipped
// frame leaves the reader at the next frame.
func FuzzReader(f *testing.F) {
	pub := func(seq uint64, n int) []byte {
		b, _ := AppendFrame(nil, &Publish{Seq: seq, Stream: "s", Value: make([]byte, n)})
		return b
	}
	f.Add(pub(1, 10))
	f.Add(append(pub(1, 100), pub(2, 10)...))
	f.Add(append(append(pub(1, 500), pub(2, 10)...), pub(3, 1000)...))
	f.Add([]byte{0, 0, 0x10, 0, 1, 0x9a, 0xcf})
	f.Fuzz(func(t *testing.T, data []byte) {
		const max = 64
		r := NewReader(iotest.HalfReader(bytes.NewReader(data)), max)
		for range 1000 {
			_, err := r.Read()
			if err == nil {
				continue
			}
			var werr *Error
			if errors.Is(err, ErrSkipped) {
				if !errors.As(err, &werr) || werr.Code != CodePayloadTooLarge {
					t.Fatalf("skipped frame with %v", err)
				}
				continue
			}
			return
		}
	})
}
