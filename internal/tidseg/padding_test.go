package tidseg

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestPadding: zeros are written ahead of a batch only when it would come
// within PadLow of their end, PadChunk past the tail's data, never past
// the segment size nor for a batch that leaves the segment; Cut truncates
// to the data and forgets them; EntriesEnd finds where entries end.
func TestPadding(t *testing.T) {
	const seg = 1 << 20
	f, err := os.Create(filepath.Join(t.TempDir(), "seg"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var p Padding
	size := func() int64 { s, _ := FileSize(f); return s }

	if err := p.Extend(f, 0, seg, []int{100}); err != nil || size() != PadChunk {
		t.Fatalf("first batch: file %d bytes, %v; want %d", size(), err, PadChunk)
	}
	if err := p.Extend(f, 100, seg, []int{100}); err != nil || size() != PadChunk {
		t.Fatalf("a batch far from the zeros' end wrote more: file %d, %v", size(), err)
	}
	near := int64(PadChunk - PadLow + 1)
	if err := p.Extend(f, near, seg, []int{10}); err != nil || size() != near+PadChunk {
		t.Fatalf("a batch near the zeros' end: file %d, %v; want %d", size(), err, near+PadChunk)
	}
	if p.Size(near) != near+PadChunk || p.Extra(near) != PadChunk {
		t.Fatalf("Size %d, Extra %d", p.Size(near), p.Extra(near))
	}
	if err := p.Extend(f, seg-PadLow, seg, []int{10}); err != nil || size() != seg {
		t.Fatalf("near the segment's end: file %d, %v; want the segment size %d", size(), err, seg)
	}
	var q Padding
	if err := q.Extend(f, seg-10, seg, []int{20}); err != nil || q.Extra(0) != 0 {
		t.Fatalf("a batch that leaves the segment was preallocated for: %d, %v", q.Extra(0), err)
	}

	if err := p.Cut(f, 1234); err != nil || size() != 1234 || p.Extra(0) != 0 {
		t.Fatalf("Cut: file %d, extra %d, %v; want 1234 and none", size(), p.Extra(0), err)
	}
	if err := p.Cut(f, 10); err != nil || size() != 1234 {
		t.Fatalf("Cut with no zeros left changed the file: %d, %v", size(), err)
	}
	// A wrong count of the entries' bytes never cuts one.
	if _, err := f.WriteAt([]byte{7}, 2000); err != nil {
		t.Fatal(err)
	}
	p.Found(PadChunk)
	if err := p.Cut(f, 1000); !errors.Is(err, ErrNotZeros) || size() != 2001 {
		t.Fatalf("Cut over a non-zero byte = %v, file %d; want ErrNotZeros and the file untouched (2001 bytes)", err, size())
	}

	entry := func(s string) []byte { return append(binary.AppendUvarint(nil, uint64(len(s))), s...) }
	data := append(entry("a"), entry("bb")...)
	for _, tc := range []struct {
		data  []byte
		end   int
		zeros bool
	}{
		{data, len(data), true},
		{append(bytes.Clone(data), make([]byte, 50)...), len(data), true},
		{append(bytes.Clone(data), 9, 'x'), len(data), false}, // a torn entry
		{nil, 0, true},
	} {
		if end, zeros := EntriesEnd(tc.data); end != tc.end || zeros != tc.zeros {
			t.Errorf("EntriesEnd(%q) = %d, %v; want %d, %v", tc.data, end, zeros, tc.end, tc.zeros)
		}
	}
	if end, left := TailEnd(100, 1000, []int{300, 700, 50}); end != 1100 || !left {
		t.Errorf("TailEnd = %d, %v; want 1100, true", end, left)
	}
	if end, left := TailEnd(1200, 1000, []int{10}); end != 1200 || !left {
		t.Errorf("TailEnd over the segment size = %d, %v; want 1200, true", end, left)
	}
}
