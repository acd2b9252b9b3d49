package wal

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/felix-broker/felix/internal/tidseg"
)

// entryBounds returns the end position of each tidwall entry in data.
func entryBounds(t *testing.T, data []byte) []int {
	t.Helper()
	var ends []int
	for pos := 0; pos < len(data); {
		if tidseg.ZeroTail(data[pos:]) {
			break // preallocated: no entries from here (prealloc.go)
		}
		_, n, ok := nextEntry(data[pos:])
		if !ok {
			t.Fatalf("unparsable entry at %d", pos)
		}
		pos += n
		ends = append(ends, pos)
	}
	return ends
}

// rawEntries encodes records as tidwall entries, as a batch write would
// put them in the file, starting at offset first.
func rawEntries(recs []*Record, first uint64) (data []byte, ends []int) {
	for i, r := range recs {
		b, _, _ := appendRecord(nil, r, first+uint64(i), 1)
		data = binary.AppendUvarint(data, uint64(len(b)))
		data = append(data, b...)
		ends = append(ends, len(data))
	}
	return data, ends
}

func garble(b []byte) {
	for i := range b {
		b[i] = b[i]*31 + 0x5b
	}
}

// TestTornTail damages the tail segment at many byte positions and checks
// that Open repairs it: every acknowledged record entirely before the damage
// survives intact, nothing after it is returned, and appends continue.
func TestTornTail(t *testing.T) {
	const n = 30
	src := t.TempDir()
	opts := Options{SegmentSize: 1500, Name: "torn/0"}
	want := make([]*Record, n+3)
	for i := range want {
		want[i] = rec(i)
	}
	l, _ := testLog(t, src, opts)
	for i := range n {
		if off, err := l.Append(context.Background(), want[i]); err != nil || off != uint64(i) {
			t.Fatalf("Append %d = %d, %v", i, off, err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	segs, _, err := listSegments(src)
	if err != nil || len(segs) < 2 {
		t.Fatalf("want several segments, got %d, %v", len(segs), err)
	}
	tail := segs[len(segs)-1]
	tailName := filepath.Base(tail.Path)
	base := tail.Index - 1 // offset of the tail segment's first record
	orig, err := os.ReadFile(tail.Path)
	if err != nil {
		t.Fatal(err)
	}
	ends := entryBounds(t, orig)
	if len(ends) < 3 || base+uint64(len(ends)) != n {
		t.Fatalf("tail segment holds %d records from %d; want >= 3 ending at %d", len(ends), base, n)
	}
	// An extra batch that was being written, never acknowledged.
	extra, extraEnds := rawEntries(want[n:], n)

	// survivors counts entries of a file entirely before position p.
	survivors := func(ends []int, p int) int {
		k := 0
		for k < len(ends) && ends[k] <= p {
			k++
		}
		return k
	}

	type tc struct {
		name string
		file []byte
		want uint64 // NextOffset after repair
	}
	var cases []tc
	from := ends[len(ends)-4]
	if len(ends) < 4 {
		from = 0
	}
	for _, p := range append([]int{0, 1}, seq(from, len(orig))...) {
		cases = append(cases, tc{fmt.Sprintf("truncate@%d", p), append([]byte{}, orig[:p]...), base + uint64(survivors(ends, p))})
		g := append([]byte{}, orig...)
		garble(g[p:])
		cases = append(cases, tc{fmt.Sprintf("garble@%d", p), g, base + uint64(survivors(ends, p))})
	}
	all := append(append([]byte{}, orig...), extra...)
	allEnds := append(append([]int{}, ends...), shift(extraEnds, len(orig))...)
	for q := 1; q <= len(extra); q++ {
		p := len(orig) + q
		cases = append(cases, tc{fmt.Sprintf("partial-batch@%d", q), append([]byte{}, all[:p]...), base + uint64(survivors(allEnds, p))})
		if q%3 == 0 {
			g := append([]byte{}, all...)
			garble(g[p:])
			cases = append(cases, tc{fmt.Sprintf("garbled-batch@%d", q), g, base + uint64(survivors(allEnds, p))})
		}
	}
	wrongOffset, _ := rawEntries(want[:1], n+7)
	for name, junk := range map[string][]byte{
		"partial-length":    {0x80},
		"short-entry":       append(binary.AppendUvarint(nil, 100), make([]byte, 10)...),
		"complete-garbage":  append(binary.AppendUvarint(nil, 40), garbled(40)...),
		"zero-length-entry": {0x00},
		"wrong-offset":      wrongOffset,
		"zeros":             make([]byte, 4096),
	} {
		cases = append(cases, tc{"append-" + name, append(append([]byte{}, orig...), junk...), n})
	}

	for ci, c := range cases {
		dir := filepath.Join(t.TempDir(), "shard")
		if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, tailName), c.file, 0o640); err != nil {
			t.Fatal(err)
		}
		if c.want < n {
			// Acknowledged records are gone: that is not a crash. Open
			// refuses, naming the lost offsets, and changes nothing.
			checkLost(t, dir, opts, c.want, n)
			if got, err := os.ReadFile(filepath.Join(dir, tailName)); err != nil || !bytes.Equal(got, c.file) {
				t.Fatalf("%s: a refused Open changed the tail segment (%v)", c.name, err)
			}
			// Without the mark (a log written before it existed) the
			// tail is cut as it always was.
			if err := os.Remove(filepath.Join(dir, hwmName)); err != nil {
				t.Fatal(err)
			}
		}
		l, sink := testLog(t, dir, opts)
		if got := l.NextOffset(); got != c.want {
			t.Fatalf("%s: NextOffset %d after repair, want %d (log: %q)", c.name, got, c.want, sink.msgs)
		}
		if c.want < n && len(c.file) > 0 && sink.count(slogLevelWarn) == 0 && survivorsBytes(c.file) != len(c.file) {
			t.Fatalf("%s: repair was not logged", c.name)
		}
		for i, r := range readAll(t, l, 0) {
			if err := sameRecord(r, want[i]); err != nil {
				t.Fatalf("%s: offset %d: %v", c.name, i, err)
			}
		}
		off, err := l.Append(context.Background(), want[0])
		if err != nil || off != c.want {
			t.Fatalf("%s: Append after repair = %d, %v; want %d", c.name, off, err, c.want)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if ci%5 != 0 {
			continue
		}
		// The repaired log reopens cleanly with the new record.
		l2, sink2 := testLog(t, dir, opts)
		if l2.NextOffset() != c.want+1 || sink2.count(slogLevelWarn) != 0 {
			t.Fatalf("%s: second reopen: next %d, log %q", c.name, l2.NextOffset(), sink2.msgs)
		}
		if err := l2.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d damaged tails repaired", len(cases))
}

// survivorsBytes is the length of the longest prefix of complete entries.
func survivorsBytes(b []byte) int {
	pos := 0
	for pos < len(b) {
		_, n, ok := nextEntry(b[pos:])
		if !ok {
			break
		}
		pos += n
	}
	return pos
}

func seq(from, to int) []int {
	var s []int
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

func shift(s []int, by int) []int {
	out := make([]int, len(s))
	for i, v := range s {
		out[i] = v + by
	}
	return out
}

func garbled(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i)
	}
	garble(b)
	return b
}

// TestTornTailEmptiesSegment cuts every record of the tail segment: the log
// must end where the previous segment ends.
func TestTornTailEmptiesSegment(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentSize: 400}
	l, _ := testLog(t, dir, opts)
	for i := range 20 {
		if _, err := l.Append(context.Background(), rec(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	segs, _, _ := listSegments(dir)
	last := segs[len(segs)-1]
	if err := os.WriteFile(last.Path, garbled(200), 0o640); err != nil {
		t.Fatal(err)
	}
	l2, _ := testLog(t, dir, opts)
	if l2.NextOffset() != last.Index-1 {
		t.Fatalf("NextOffset %d, want %d", l2.NextOffset(), last.Index-1)
	}
	if off, err := l2.Append(context.Background(), rec(1)); err != nil || off != last.Index-1 {
		t.Fatalf("Append = %d, %v", off, err)
	}
	readAll(t, l2, 0)
}
