package wal

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
)

// checkLost opens dir and wants a *LostRecordsError for offsets [from, to).
func checkLost(t *testing.T, dir string, opts Options, from, to uint64) {
	t.Helper()
	opts.Logger = slog.New(slog.DiscardHandler)
	l, err := Open(dir, opts)
	if err == nil {
		next := l.NextOffset()
		_ = l.Close()
		t.Fatalf("Open succeeded with NextOffset %d; want lost records %d-%d", next, from, to-1)
	}
	var lost *LostRecordsError
	if !errors.As(err, &lost) || !errors.Is(err, ErrLostRecords) || lost.From != from || lost.To != to {
		t.Fatalf("Open = %v; want *LostRecordsError for offsets [%d, %d)", err, from, to)
	}
}

// writeLog appends n records of rec(i) to a new log in dir and closes it.
func writeLog(t *testing.T, dir string, opts Options, n int) {
	t.Helper()
	l, _ := testLog(t, dir, opts)
	for i := range n {
		if off, err := l.Append(context.Background(), rec(i)); err != nil || off != uint64(i) {
			t.Fatalf("Append %d = %d, %v", i, off, err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// acceptLoss opens dir with Options.AcceptLoss; the accepted loss is
// logged as an error, which the test expects.
func acceptLoss(t *testing.T, dir string, opts Options) *Log {
	t.Helper()
	opts.AcceptLoss = true
	l, sink := testLog(t, dir, opts)
	sink.mu.Lock()
	sink.counts = nil
	sink.mu.Unlock()
	return l
}

func tailSegment(t *testing.T, dir string) segmentFile {
	t.Helper()
	segs, _, err := listSegments(dir)
	if err != nil || len(segs) == 0 {
		t.Fatalf("list segments: %d, %v", len(segs), err)
	}
	return segs[len(segs)-1]
}

// TestLostRecordsRefusedThenAccepted truncates the tail segment inside
// acknowledged records: Open refuses and names the range; with AcceptLoss
// it continues at the old high-water mark, the lost offsets read as corrupt
// and are never reused, also after another reopen.
func TestLostRecordsRefusedThenAccepted(t *testing.T) {
	const n = 40
	dir := t.TempDir()
	opts := Options{SegmentSize: 1500, Name: "lost/0"}
	writeLog(t, dir, opts, n)
	tail := tailSegment(t, dir)
	data, err := os.ReadFile(tail.Path)
	if err != nil {
		t.Fatal(err)
	}
	ends := entryBounds(t, data)
	if len(ends) < 4 {
		t.Fatalf("tail segment holds %d records; want at least 4", len(ends))
	}
	kept := tail.Index - 1 + 1 // one record survives, the next is cut mid-record
	if err := os.WriteFile(tail.Path, data[:ends[0]+3], 0o640); err != nil {
		t.Fatal(err)
	}
	checkLost(t, dir, opts, kept, n)
	checkLost(t, dir, opts, kept, n) // still refused: nothing was changed

	accept := opts
	accept.AcceptLoss = true
	l, sink := testLog(t, dir, accept)
	if l.NextOffset() != n {
		t.Fatalf("NextOffset %d after accepting the loss, want %d", l.NextOffset(), n)
	}
	if sink.count(slogLevelError) != 1 {
		t.Fatalf("want one error line for the accepted loss, got %q", sink.msgs)
	}
	sink.mu.Lock()
	sink.counts = nil // the error line was expected
	sink.mu.Unlock()
	for off := kept; off < n; off++ {
		if _, err := l.Read(off, 1, 0); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Read(%d) in the lost range = %v; want ErrCorrupt", off, err)
		}
	}
	recs, err := l.Read(0, int(kept), 0)
	if err != nil || uint64(len(recs)) != kept {
		t.Fatalf("Read before the lost range = %d records, %v", len(recs), err)
	}
	for i, r := range recs {
		if err := sameRecord(r, rec(i)); err != nil {
			t.Fatalf("offset %d: %v", i, err)
		}
	}
	if off, err := l.Append(context.Background(), rec(n)); err != nil || off != n {
		t.Fatalf("Append after accepting the loss = %d, %v; want %d", off, err, n)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	// The markers are part of the log now: a plain reopen is clean.
	l2, sink2 := testLog(t, dir, opts)
	if l2.NextOffset() != n+1 || sink2.count(slogLevelWarn) != 0 {
		t.Fatalf("reopen: NextOffset %d, log %q; want %d and no warning", l2.NextOffset(), sink2.msgs, n+1)
	}
	if recs, err := l2.Read(n, 1, 0); err != nil || len(recs) != 1 || sameRecord(recs[0], rec(n)) != nil {
		t.Fatalf("Read(%d) after reopen = %v, %v", n, recs, err)
	}
}

// TestLostRecordsOtherDamage: a tail cut at a record boundary, and a
// missing tail segment, are losses too.
func TestLostRecordsOtherDamage(t *testing.T) {
	const n = 40
	opts := Options{SegmentSize: 1500, Name: "lost/1"}
	for _, c := range []struct {
		name   string
		damage func(t *testing.T, tail segmentFile, data []byte, ends []int) uint64 // returns the new end
	}{
		{"boundary", func(t *testing.T, tail segmentFile, data []byte, ends []int) uint64 {
			if err := os.WriteFile(tail.Path, data[:ends[1]], 0o640); err != nil {
				t.Fatal(err)
			}
			return tail.Index - 1 + 2
		}},
		{"segment-removed", func(t *testing.T, tail segmentFile, _ []byte, _ []int) uint64 {
			if err := os.Remove(tail.Path); err != nil {
				t.Fatal(err)
			}
			return tail.Index - 1
		}},
		{"all-segments-removed", func(t *testing.T, tail segmentFile, _ []byte, _ []int) uint64 {
			segs, _, _ := listSegments(filepath.Dir(tail.Path))
			for _, s := range segs {
				if err := os.Remove(s.Path); err != nil {
					t.Fatal(err)
				}
			}
			return 0
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeLog(t, dir, opts, n)
			tail := tailSegment(t, dir)
			data, err := os.ReadFile(tail.Path)
			if err != nil {
				t.Fatal(err)
			}
			end := c.damage(t, tail, data, entryBounds(t, data))
			checkLost(t, dir, opts, end, n)
			l := acceptLoss(t, dir, opts)
			if off, err := l.Append(context.Background(), rec(0)); err != nil || off != n {
				t.Fatalf("Append after accepting the loss = %d, %v; want %d", off, err, n)
			}
		})
	}
}

// TestHWMCoversAcksBeforeClose: the mark is written before each ack, so a
// copy of a log that is still open (as a kill -9 would leave it) already
// knows every acknowledged record.
func TestHWMCoversAcksBeforeClose(t *testing.T) {
	const n = 25
	dir := t.TempDir()
	opts := Options{SegmentSize: 1500, Name: "open/0"}
	l, _ := testLog(t, dir, opts)
	for i := range n {
		if _, err := l.Append(context.Background(), rec(i)); err != nil {
			t.Fatal(err)
		}
	}
	crashed := filepath.Join(t.TempDir(), "shard")
	if err := os.CopyFS(crashed, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	tail := tailSegment(t, crashed)
	data, _ := os.ReadFile(tail.Path)
	ends := entryBounds(t, data)
	if err := os.WriteFile(tail.Path, data[:ends[len(ends)-1]-1], 0o640); err != nil { // cut the last acked record
		t.Fatal(err)
	}
	checkLost(t, crashed, opts, n-1, n)
}

// TestHWMDamagedOrMissing: without a mark (an old log) or with both slots
// damaged, Open behaves as before the mark existed (the damaged case with
// a warning); with one slot damaged, the other, older mark is used.
func TestHWMDamagedOrMissing(t *testing.T) {
	const n = 30
	opts := Options{SegmentSize: 1500, Name: "hwm/0"}
	cut := func(t *testing.T, dir string) uint64 { // cut the tail's last two records
		tail := tailSegment(t, dir)
		data, _ := os.ReadFile(tail.Path)
		ends := entryBounds(t, data)
		if err := os.WriteFile(tail.Path, data[:ends[len(ends)-3]+1], 0o640); err != nil {
			t.Fatal(err)
		}
		return tail.Index - 1 + uint64(len(ends)) - 2
	}
	hwmPath := func(dir string) string { return filepath.Join(dir, hwmName) }

	t.Run("missing", func(t *testing.T) {
		dir := t.TempDir()
		writeLog(t, dir, opts, n)
		end := cut(t, dir)
		if err := os.Remove(hwmPath(dir)); err != nil {
			t.Fatal(err)
		}
		l, sink := testLog(t, dir, opts)
		if l.NextOffset() != end || sink.count(slogLevelWarn) != 1 { // the torn-tail cut only
			t.Fatalf("NextOffset %d, log %q; want %d and one warning", l.NextOffset(), sink.msgs, end)
		}
		if _, err := os.Stat(hwmPath(dir)); err != nil {
			t.Fatalf("the mark was not written anew: %v", err)
		}
	})
	t.Run("both-slots-damaged", func(t *testing.T) {
		dir := t.TempDir()
		writeLog(t, dir, opts, n)
		end := cut(t, dir)
		if err := os.WriteFile(hwmPath(dir), garbled(hwmSlot+hwmRecord), 0o640); err != nil {
			t.Fatal(err)
		}
		l, sink := testLog(t, dir, opts)
		if l.NextOffset() != end || sink.count(slogLevelWarn) != 2 { // damaged mark, torn-tail cut
			t.Fatalf("NextOffset %d, log %q; want %d and two warnings", l.NextOffset(), sink.msgs, end)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l2, sink2 := testLog(t, dir, opts) // the mark was rewritten
		if l2.NextOffset() != end || sink2.count(slogLevelWarn) != 0 {
			t.Fatalf("reopen: NextOffset %d, log %q", l2.NextOffset(), sink2.msgs)
		}
	})
	t.Run("newer-slot-damaged", func(t *testing.T) {
		dir := t.TempDir()
		writeLog(t, dir, opts, n)
		b, err := os.ReadFile(hwmPath(dir))
		if err != nil {
			t.Fatal(err)
		}
		m0, g0, ok0 := decodeHWM(b[:hwmRecord])
		m1, g1, ok1 := decodeHWM(b[hwmSlot : hwmSlot+hwmRecord])
		n0, n1 := m0.next, m1.next
		if !ok0 || !ok1 {
			t.Fatalf("slots valid: %v %v", ok0, ok1)
		}
		older, at := n1, 0 // damage the newer slot
		if g1 > g0 {
			older, at = n0, hwmSlot
		}
		if max(n0, n1) != n || older >= n {
			t.Fatalf("marks %d (gen %d) and %d (gen %d); want %d and one below", n0, g0, n1, g1, n)
		}
		b[at+5] ^= 0x10
		if err := os.WriteFile(hwmPath(dir), b, 0o640); err != nil {
			t.Fatal(err)
		}
		end := cut(t, dir)
		checkLost(t, dir, opts, end, older)
	})
}

// BenchmarkHWMWrite is the commit path's cost of the mark: one write of
// the mark into the page cache per batch.
func BenchmarkHWMWrite(b *testing.B) {
	h, _, _, err := openHWM(osFS{}, benchDir(b))
	if err != nil {
		b.Fatal(err)
	}
	defer h.f.Close()
	b.ReportAllocs()
	var next uint64
	for b.Loop() {
		next++
		if err := h.write(next); err != nil {
			b.Fatal(err)
		}
	}
}

// TestOpenSyncsRecordsPastTheMark: records a crash left past the mark
// (written, never fdatasynced, never acknowledged) are fdatasynced by Open
// before it serves them and its new mark covers them. Open once served
// them and made the mark durable with no fdatasync of the segment, so a
// power loss could take back records subscribers had read and leave the
// segments ending below the mark.
func TestOpenSyncsRecordsPastTheMark(t *testing.T) {
	const n = 10
	dir := t.TempDir()
	writeLog(t, dir, Options{}, n)
	tail := tailSegment(t, dir)
	extra, _ := rawEntries([]*Record{rec(n), rec(n + 1), rec(n + 2)}, n)
	f, err := os.OpenFile(tail.Path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(extra); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	var syncs atomic.Int64
	fs := &FaultFS{Inject: func(op Op, path string) bool {
		if op == OpSync && path == tail.Path {
			syncs.Add(1)
		}
		return false
	}}
	l, _ := testLog(t, dir, Options{FS: fs})
	if l.NextOffset() != n+3 || syncs.Load() == 0 {
		t.Fatalf("Open took the log to offset %d with %d fdatasyncs of the tail segment; want %d and at least one", l.NextOffset(), syncs.Load(), n+3)
	}
	if recs, err := l.Read(n, 3, 0); err != nil || len(recs) != 3 {
		t.Fatalf("Read(%d) = %d records, %v", n, len(recs), err)
	}
}

// TestMissingFirstSegmentsAreLost: the first segment files gone, where no
// retention cut: Open refuses the log, the records lost at its front (it
// served the rest as if retention had dropped them, and said nothing);
// with AcceptLoss it opens from the first segment left, and says so, and
// opens so from then on.
func TestMissingFirstSegmentsAreLost(t *testing.T) {
	dir, segs := damageDir(t)
	for _, s := range segs[:2] {
		if err := os.Remove(s.Path); err != nil {
			t.Fatal(err)
		}
	}
	opts := Options{SegmentSize: 2048, Name: "orders/2"}
	quiet := opts
	quiet.Logger = slog.New(slog.DiscardHandler)
	l, err := Open(dir, quiet)
	var lost *LostRecordsError
	if !errors.As(err, &lost) || !errors.Is(err, ErrLostRecords) || !lost.Front || lost.From != 0 || lost.To != segs[2].Index-1 {
		if err == nil {
			_ = l.Close()
		}
		t.Fatalf("Open without the first two segments = %v; want the records [0, %d) lost at the front", err, segs[2].Index-1)
	}
	l = acceptLoss(t, dir, opts)
	if l.FirstOffset() != segs[2].Index-1 {
		t.Fatalf("accepted: FirstOffset %d, want %d", l.FirstOffset(), segs[2].Index-1)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, _ = testLog(t, dir, opts)
	if l.FirstOffset() != segs[2].Index-1 {
		t.Fatalf("reopened after the accepted loss: FirstOffset %d, want %d", l.FirstOffset(), segs[2].Index-1)
	}
}

// TestRetentionKeepsTheFirstOffset: a log that retention cut reopens
// without a word, and so does one whose recorded first offset is above
// its segments' (a crash between the record and the cut); a segment lost
// after the cut is found, from the offset retention had kept.
func TestRetentionKeepsTheFirstOffset(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentSize: 2048, Name: "keep/0"}
	writeLog(t, dir, opts, 300)
	cutOpts := opts
	cutOpts.RetentionBytes = 6 << 10
	l, _ := testLog(t, dir, cutOpts)
	first := l.FirstOffset()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if first == 0 {
		t.Fatal("retention cut nothing")
	}

	// The first offset recorded above the segments' own.
	h, _, _, err := openHWM(osFS{}, dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.setFirst(first + 20); err != nil {
		t.Fatal(err)
	}
	_ = h.f.Close()
	l, sink := testLog(t, dir, opts)
	if l.FirstOffset() != first || sink.count(slogLevelWarn) != 0 {
		t.Fatalf("reopened: FirstOffset %d (want %d), log %q", l.FirstOffset(), first, sink.msgs)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	segs, _, err := listSegments(dir)
	if err != nil || len(segs) < 2 {
		t.Fatalf("%d segments, %v", len(segs), err)
	}
	if err := os.Remove(segs[0].Path); err != nil {
		t.Fatal(err)
	}
	quiet := opts
	quiet.Logger = slog.New(slog.DiscardHandler)
	l, err = Open(dir, quiet)
	var lost *LostRecordsError
	if !errors.As(err, &lost) || !lost.Front || lost.From != first || lost.To != segs[1].Index-1 {
		if err == nil {
			_ = l.Close()
		}
		t.Fatalf("Open without the segment retention kept first = %v; want the records [%d, %d) lost at the front", err, first, segs[1].Index-1)
	}
}

// TestMarkOfTheEarlierFormat: a mark file written before the first offset
// was kept opens as before (no check of the front), and is written anew
// in the new format.
func TestMarkOfTheEarlierFormat(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentSize: 2048, Name: "old/0"}
	writeLog(t, dir, opts, 100)
	b := make([]byte, hwmSlot+hwmRecordV1)
	copy(b, hwmMagicV1[:])
	binary.LittleEndian.PutUint64(b[4:], 100)
	binary.LittleEndian.PutUint64(b[12:], 7)
	binary.LittleEndian.PutUint32(b[20:], crc32.Checksum(b[:20], castagnoli))
	if err := os.WriteFile(filepath.Join(dir, hwmName), b, 0o640); err != nil {
		t.Fatal(err)
	}
	m, _, ok := decodeHWM(b)
	if !ok || m.next != 100 || m.hasFirst {
		t.Fatalf("earlier format decoded as %+v, %v", m, ok)
	}
	l, sink := testLog(t, dir, opts)
	if l.NextOffset() != 100 || sink.count(slogLevelWarn) != 0 {
		t.Fatalf("NextOffset %d, log %q", l.NextOffset(), sink.msgs)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	_, mark, state, err := openHWM(osFS{}, dir)
	if err != nil || state != hwmValid || !mark.hasFirst || mark.next != 100 || mark.first != 0 {
		t.Fatalf("mark after the reopen: %+v (state %d, %v); want next 100, first 0, new format", mark, state, err)
	}
}
