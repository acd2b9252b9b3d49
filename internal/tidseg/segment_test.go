package tidseg

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	tidwall "github.com/tidwall/wal"
)

// TestFollowRollMatchesTidwall writes batches of random entries through
// tidwall and checks, after each, that FollowRoll named the segment tidwall
// really writes to and its size, and that the files are named and framed as
// List and NextEntry read them. A tidwall upgrade that changes its roll or
// layout fails here.
func TestFollowRollMatchesTidwall(t *testing.T) {
	for _, segSize := range []int{64, 300, 4096} {
		dir := t.TempDir()
		tw, err := tidwall.Open(dir, Options(segSize))
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(uint64(segSize), 1))
		var tail Segment
		segs, _, err := List(dir)
		if err != nil || len(segs) != 1 {
			t.Fatalf("new log: segments %v, %v", segs, err)
		}
		tail = segs[0]
		next := uint64(1)
		var want [][]byte
		for range 200 {
			var b tidwall.Batch
			var sizes []int
			for range 1 + rng.IntN(5) {
				data := bytes.Repeat([]byte{byte(next)}, rng.IntN(200))
				b.Write(next, data)
				want = append(want, data)
				sizes = append(sizes, EntrySize(len(data)))
				next++
			}
			first := next - uint64(len(sizes))
			if err := tw.WriteBatch(&b); err != nil {
				t.Fatal(err)
			}
			started, size, written := FollowRoll(tail.Size, int64(segSize), first, sizes)
			var sum int64
			for _, s := range sizes {
				sum += int64(s)
			}
			if written != sum {
				t.Fatalf("written %d, sizes add up to %d", written, sum)
			}
			segs, _, err := List(dir)
			if err != nil {
				t.Fatal(err)
			}
			last := segs[len(segs)-1]
			if started != 0 && last.Index != started || started == 0 && last.Index != tail.Index {
				t.Fatalf("segment size %d, batch at %d: FollowRoll says tail starts at %d (0: unchanged from %d), tidwall's tail starts at %d",
					segSize, first, started, tail.Index, last.Index)
			}
			if last.Size != size {
				t.Fatalf("segment size %d, batch at %d: FollowRoll says tail is %d bytes, it is %d", segSize, first, size, last.Size)
			}
			tail = last
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		// Every entry reads back from the files as NextEntry splits them.
		segs, _, err = List(dir)
		if err != nil {
			t.Fatal(err)
		}
		i := 0
		for _, s := range segs {
			if filepath.Base(s.Path) != Name(s.Index) || s.Index != uint64(i+1) {
				t.Fatalf("segment %s: index %d, expected %d", s.Path, s.Index, i+1)
			}
			data, err := os.ReadFile(s.Path)
			if err != nil {
				t.Fatal(err)
			}
			for pos := 0; pos < len(data); i++ {
				e, n, ok := NextEntry(data[pos:])
				if !ok || !bytes.Equal(e, want[i]) {
					t.Fatalf("entry %d in %s: %v %q, want %q", i+1, s.Path, ok, e, want[i])
				}
				pos += n
			}
		}
		if i != len(want) {
			t.Fatalf("read %d entries back, wrote %d", i, len(want))
		}
	}
}

func TestValidPrefixAndCut(t *testing.T) {
	var data []byte
	for i := range 5 {
		data = append(data, byte(3))
		data = append(data, byte(i), byte(i), byte(i))
	}
	full := len(data)
	data = append(data, 10, 1, 2) // incomplete: 10 bytes announced, 2 there
	errBad := errors.New("bad entry")
	check := func(e []byte, index uint64) error {
		if uint64(e[0])+7 != index {
			return errBad
		}
		return nil
	}
	keep, n, reason := ValidPrefix(data, 7, check)
	if keep != full || n != 5 || reason != "incomplete entry" {
		t.Fatalf("ValidPrefix = %d, %d, %q; want %d, 5, incomplete entry", keep, n, reason, full)
	}
	keep, n, reason = ValidPrefix(data, 8, check) // every index off by one
	if keep != 0 || n != 0 || reason != errBad.Error() {
		t.Fatalf("ValidPrefix at a wrong index = %d, %d, %q", keep, n, reason)
	}

	path := filepath.Join(t.TempDir(), Name(7))
	if err := os.WriteFile(path, data, 0o640); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := Cut(f, int64(full)); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, data[:full]) {
		t.Fatalf("after Cut: %v, %d bytes, want %d", err, len(got), full)
	}
	if err := SyncDir(filepath.Dir(path)); err != nil {
		t.Fatal(err)
	}
}

func TestSettleLeavesAPlainLog(t *testing.T) {
	dir := t.TempDir()
	tw, err := tidwall.Open(dir, Options(64))
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 10; i++ {
		if err := tw.Write(i, bytes.Repeat([]byte{1}, 40)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	// A truncation that left its marker: tidwall's .START file names the
	// segment that is the new start, written before the old ones go.
	segs, pending, err := List(dir)
	if err != nil || pending || len(segs) < 3 {
		t.Fatalf("before: %d segments, pending %v, %v", len(segs), pending, err)
	}
	data, err := os.ReadFile(segs[2].Path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(segs[2].Path+".START", data, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, pending, _ := List(dir); !pending {
		t.Fatal("List does not see the .START file")
	}
	after, err := Settle(dir, Options(64))
	if err != nil {
		t.Fatal(err)
	}
	if _, pending, _ := List(dir); pending {
		t.Fatal("Settle left the .START file")
	}
	if len(after) != len(segs)-2 || after[0].Index != segs[2].Index {
		t.Fatalf("after Settle: %d segments from %d; want %d from %d", len(after), after[0].Index, len(segs)-2, segs[2].Index)
	}
}
