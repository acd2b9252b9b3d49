package transport

import (
	"errors"
	"reflect"
	"testing"
)

// TestCorruptErrorFields: a corrupt error carries its damaged range in
// trailing fields; a decoder that knows only the first five fields (an
// older peer) still decodes it, and errors without a range encode as
// before.
func TestCorruptErrorFields(t *testing.T) {
	want := &Error{Code: CodeCorrupt, Message: "orders/2: offsets 1012-1012 are damaged", From: 1012, To: 1012}
	got, err := DecodeFrame(FrameError, body(want))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v, want %#v", got, want)
	}
	if !errors.Is(got.(*Error), ErrCorrupt) || got.(*Error).Code.String() != "corrupt" {
		t.Fatalf("%v does not match ErrCorrupt", got)
	}

	// What a five-field decoder sees: the same frame cut to its first five
	// fields decodes the same, without the range.
	b := body(want)
	if b[0] != 0x97 {
		t.Fatalf("corrupt error encodes %d fields, want 7", b[0]&0x0f)
	}
	old := &Error{}
	d := &decoder{b: b}
	n := d.arrayHeader(5)
	old.Seq, old.Code, old.Message, old.Epoch, old.Owner = d.uint64(), ErrorCode(d.uint16()), d.str(), d.uint64(), d.str()
	d.skipN(n - 5)
	if d.err != nil || d.remaining() != 0 || old.Code != CodeCorrupt || old.Message != want.Message {
		t.Fatalf("five-field decode: %#v, err %v, %d bytes left", old, d.err, d.remaining())
	}

	// Without a range the frame has five fields, as before.
	if b := body(&Error{Code: CodeInternal, Message: "x"}); b[0] != 0x95 {
		t.Fatalf("error without a range encodes %d fields, want 5", b[0]&0x0f)
	}
}
