package wal

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestPreallocatedTail: after a commit the tail segment holds zeros
// written ahead of its data, which Size does not count; Close cuts them;
// a copy taken while the log is open (as kill -9 leaves it) opens with
// every record, the zeros cut without the torn-tail warning; and every
// segment tidwall left on a roll ends with its last entry.
func TestPreallocatedTail(t *testing.T) {
	for _, seg := range []int{4096, 1 << 20} { // rolls; one segment
		dir := t.TempDir()
		opts := Options{SegmentSize: seg, Name: "pre/0"}
		l, _ := testLog(t, dir, opts)
		const n = 100
		for i := range n {
			if _, err := l.Append(context.Background(), rec(i)); err != nil {
				t.Fatal(err)
			}
		}
		segs, _, err := listSegments(dir)
		if err != nil {
			t.Fatal(err)
		}
		tail := segs[len(segs)-1]
		data, err := os.ReadFile(tail.Path)
		if err != nil {
			t.Fatal(err)
		}
		ends := entryBounds(t, data)
		if end := ends[len(ends)-1]; end >= len(data) || !bytes.Equal(data[end:], make([]byte, len(data)-end)) {
			t.Fatalf("segment %d: tail of %d bytes has %d of data and no zeros after them", seg, len(data), end)
		}
		var files int64
		for _, s := range segs {
			files += s.Size
		}
		if pad := int64(len(data) - ends[len(ends)-1]); l.Size() != files-pad {
			t.Fatalf("segment %d: Size %d, want the files' %d less the %d zeros", seg, l.Size(), files, pad)
		}
		for _, s := range segs[:len(segs)-1] {
			d, _ := os.ReadFile(s.Path)
			if e := entryBounds(t, d); len(d) == 0 || e[len(e)-1] != len(d) {
				t.Fatalf("segment %d: %s, left by a roll, does not end with its last entry (%d bytes)", seg, filepath.Base(s.Path), len(d))
			}
		}

		crashed := filepath.Join(t.TempDir(), "shard")
		if err := os.CopyFS(crashed, os.DirFS(dir)); err != nil {
			t.Fatal(err)
		}
		c, sink := testLog(t, crashed, opts)
		if c.NextOffset() != n || sink.count(slogLevelWarn) != 0 {
			t.Fatalf("segment %d: the copy of the open log opened at %d with %d warnings (%q); want %d and none", seg, c.NextOffset(), sink.count(slogLevelWarn), sink.msgs, n)
		}
		for i, r := range readAll(t, c, 0) {
			if err := sameRecord(r, rec(i)); err != nil {
				t.Fatalf("segment %d: offset %d of the copy: %v", seg, i, err)
			}
		}
		if _, err := c.Append(context.Background(), rec(n)); err != nil {
			t.Fatalf("segment %d: append to the copy: %v", seg, err)
		}

		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		d, _ := os.ReadFile(tail.Path)
		if e := entryBounds(t, d); e[len(e)-1] != len(d) {
			t.Fatalf("segment %d: after Close the tail has %d bytes, %d of data", seg, len(d), e[len(e)-1])
		}
	}
}

// TestScanIgnoresPreallocatedZeros: a segment parsed by the damage reader
// whose last record is followed by preallocated zeros has no damage and
// no garbage (a crash can leave them on a segment tidwall left).
func TestScanIgnoresPreallocatedZeros(t *testing.T) {
	var recs []*Record
	for i := range 5 {
		recs = append(recs, rec(i))
	}
	data, _ := rawEntries(recs, 0)
	s := scanSegment("seg", append(data, make([]byte, 4096)...), 0, 5)
	if len(s.damaged) != 0 || s.garbage != 0 {
		t.Fatalf("records then zeros: damaged %v, garbage %d; want none", s.damaged, s.garbage)
	}
	s = scanSegment("seg", append(data, 1, 2, 3), 0, 5)
	if s.garbage != 3 {
		t.Fatalf("records then 3 stray bytes: garbage %d, want 3", s.garbage)
	}
}
