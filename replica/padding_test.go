package replica

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/felix-broker/felix/internal/tidseg"
)

// TestStoragePreallocatesTail: while open, the tail segment holds zeros
// after its entries and every segment tidwall left on a roll ends with its
// last entry; a copy taken then (as kill -9 leaves it) opens with every
// entry and no torn-tail warning; an uncommitted suffix replaced while the
// tail is preallocated (tidwall rewrites the tail) reads back right; and
// Close leaves no zeros.
func TestStoragePreallocatesTail(t *testing.T) {
	dir := t.TempDir()
	s, err := openStorage(dir, "orders/0", []uint64{1, 2, 3}, 4096, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	const n = 60
	for i := uint64(1); i <= n; i += 3 {
		if err := s.append([]*pb.Entry{testEntry(i, 1, val(i)), testEntry(i+1, 1, val(i+1)), testEntry(i+2, 1, val(i+2))}); err != nil {
			t.Fatal(err)
		}
	}
	last := s.last + 1 // one entry more: the loop's last batch may have left a new, empty tail
	if err := s.append([]*pb.Entry{testEntry(last, 1, val(last))}); err != nil {
		t.Fatal(err)
	}
	segs, _, err := tidseg.List(dir)
	if err != nil || len(segs) < 2 {
		t.Fatalf("segments %v, %v: the test wants several", segs, err)
	}
	for i, sg := range segs {
		data, _ := os.ReadFile(sg.Path)
		end := entriesEnd(t, data)
		if i < len(segs)-1 && end != len(data) {
			t.Fatalf("%s, left by a roll, has %d bytes after its entries", filepath.Base(sg.Path), len(data)-end)
		}
		if i == len(segs)-1 && (end == len(data) || !tidseg.ZeroTail(data[end:])) {
			t.Fatalf("the tail segment has %d bytes of entries and no zeros after them (%d bytes)", end, len(data))
		}
	}

	crashed := filepath.Join(t.TempDir(), "copy")
	if err := os.CopyFS(crashed, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	var warned bytes.Buffer
	c, err := openStorage(crashed, "orders/0", []uint64{1, 2, 3}, 4096, slog.New(slog.NewTextHandler(&warned, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	if c.last != last || warned.Len() > 0 {
		t.Fatalf("the copy of the open log: last index %d, want %d; logged %q", c.last, last, warned.String())
	}
	wantValues(t, c, 1, last, val)
	c.close()

	// Raft replaces the uncommitted suffix from last-1 on.
	if err := s.append([]*pb.Entry{testEntry(last-1, 2, "w1"), testEntry(last, 2, "w2"), testEntry(last+1, 2, "w3")}); err != nil {
		t.Fatal(err)
	}
	wantValues(t, s, 1, last+1, func(i uint64) string {
		if i >= last-1 {
			return fmt.Sprint("w", i-last+2)
		}
		return val(i)
	})
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	segs, _, _ = tidseg.List(dir)
	data, _ := os.ReadFile(segs[len(segs)-1].Path)
	if end := entriesEnd(t, data); end != len(data) {
		t.Fatalf("after Close the tail has %d bytes after its entries", len(data)-end)
	}
}

// val is entry i's value: long enough for several 4 KiB segments.
func val(i uint64) string { return fmt.Sprintf("v%d-%s", i, strings.Repeat("x", 150)) }

// entriesEnd returns where the entries of a segment's data end: at its
// end, or where only zeros follow.
func entriesEnd(t *testing.T, data []byte) int {
	t.Helper()
	end, zeros := tidseg.EntriesEnd(data)
	if !zeros {
		t.Fatalf("unparsable entry at %d", end)
	}
	return end
}

// wantValues checks that entries from..to of s hold the values want gives.
func wantValues(t *testing.T, s *storage, from, to uint64, want func(uint64) string) {
	t.Helper()
	ents, err := s.Entries(from, to+1, 1<<30)
	if err != nil || uint64(len(ents)) != to-from+1 {
		t.Fatalf("entries %d-%d: %d, %v", from, to, len(ents), err)
	}
	for _, e := range ents {
		_, recs, err := decodeBatch(e.GetData(), 0)
		if err != nil || len(recs) != 1 || string(recs[0].Value) != want(e.GetIndex()) {
			t.Fatalf("entry %d: %v, %v; want %q", e.GetIndex(), recs, err, want(e.GetIndex()))
		}
	}
}
