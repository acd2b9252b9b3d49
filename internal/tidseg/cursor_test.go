package tidseg

import (
	"bytes"
	"testing"

	tidwall "github.com/tidwall/wal"
)

// entryTaker takes the entries a cursor reads, up to want, checking that
// each holds its index's content (entryData).
type entryTaker struct {
	t    *testing.T
	want int
	got  []uint64
}

func (e *entryTaker) More(bool) int { return e.want - len(e.got) }

func (e *entryTaker) Take(entry []byte, index uint64) (bool, error) {
	if !bytes.Equal(entry, entryData(index)) {
		e.t.Fatalf("entry %d: %d bytes, not its content", index, len(entry))
	}
	e.got = append(e.got, index)
	return true, nil
}

// entryData is entry i's content: 100 bytes, but every tenth entry 20 KB.
func entryData(i uint64) []byte {
	n := 100
	if i%10 == 0 {
		n = 20 << 10
	}
	return bytes.Repeat([]byte{byte(i)}, n)
}

// TestCursorReadsOnAcrossSizesAndFiles: a Cursor placed anywhere reads
// every entry on, one or a few a read, across segment files, also an
// entry far larger than those it read before (read whole once its length
// is known: the cursor gave up on it, and its caller read the rest of the
// segment another way).
func TestCursorReadsOnAcrossSizesAndFiles(t *testing.T) {
	dir := t.TempDir()
	tw, err := tidwall.Open(dir, Options(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	const n = 400
	for i := uint64(1); i <= n; i++ {
		if err := tw.Write(i, entryData(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	var files Files
	files.Init(dir, OSFile)
	defer files.Drop(true)
	for _, start := range []uint64{1, 5, 11, 150, 399} {
		for _, per := range []int{1, 3} {
			var c Cursor
			if err := c.Place(&files, start); err != nil {
				t.Fatalf("Place(%d): %v", start, err)
			}
			next := start
			for next <= n {
				tk := entryTaker{t: t, want: per}
				if err := c.ReadOn(&files, n+1, &tk); err != nil {
					t.Fatalf("from %d, %d a read: ReadOn at %d: %v", start, per, next, err)
				}
				if len(tk.got) == 0 {
					t.Fatalf("from %d, %d a read: ReadOn at %d took nothing", start, per, next)
				}
				for _, i := range tk.got {
					if i != next {
						t.Fatalf("from %d: entry %d read, want %d", start, i, next)
					}
					next++
				}
				if !c.At(next) {
					t.Fatalf("cursor not at %d after reading up to it", next)
				}
			}
		}
	}
}
