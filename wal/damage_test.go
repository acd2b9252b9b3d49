package wal

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

const damageRecords = 300

// damageFixture writes damageRecords records over many small segments
// once, closes the log, and returns the directory's files; each case copies
// them.
var damageFixture = sync.OnceValues(func() (map[string][]byte, error) {
	dir, err := os.MkdirTemp("", "wal-damage")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	l, err := Open(dir, Options{SegmentSize: 2048, Name: "orders/2"})
	if err != nil {
		return nil, err
	}
	errs := make(chan error, damageRecords)
	for i := range damageRecords {
		l.AppendAsync(rec(i), func(_ uint64, _ int64, err error) { errs <- err })
	}
	for range damageRecords {
		if err := <-errs; err != nil {
			return nil, err
		}
	}
	if err := l.Close(); err != nil {
		return nil, err
	}
	files := map[string][]byte{}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		files[e.Name()] = b
	}
	return files, nil
})

// damageDir copies the fixture into a new directory and returns it with
// its segments in order.
func damageDir(t *testing.T) (string, []segmentFile) {
	t.Helper()
	files, err := damageFixture()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	segs, _, err := listSegments(dir)
	if err != nil || len(segs) < 6 {
		t.Fatalf("want at least 6 segments, got %d (%v)", len(segs), err)
	}
	return dir, segs
}

// entryAt returns where the k-th entry of a segment starts, the size of
// its length prefix and its total size.
func entryAt(t *testing.T, data []byte, k int) (pos, prefix, size int) {
	t.Helper()
	for i := 0; ; i++ {
		_, n, ok := nextEntry(data[pos:])
		if !ok {
			t.Fatalf("segment has no entry %d", k)
		}
		if i == k {
			_, prefix = uvarintPrefix(data[pos:])
			return pos, prefix, n
		}
		pos += n
	}
}

func editFile(t *testing.T, path string, edit func([]byte) []byte) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, edit(data), 0o640); err != nil {
		t.Fatal(err)
	}
}

// readAround reads the whole log from 0 with read, n records a time, the
// way a subscriber that skips damage would: on a *CorruptError it notes
// the range and goes on at To+1.
func readAround(t *testing.T, l *Log, read readFunc, n int) (got map[uint64]Record, damaged [][2]uint64) {
	t.Helper()
	got = map[uint64]Record{}
	for from := uint64(0); from < l.NextOffset(); {
		recs, err := read(from, n, 0)
		var ce *CorruptError
		switch {
		case errors.As(err, &ce):
			if !errors.Is(err, ErrCorrupt) || ce.Shard != "orders/2" || ce.Offset != from || ce.From > from || ce.To < from {
				t.Fatalf("Read(%d): %+v: want shard orders/2 and a range holding %d", from, ce, from)
			}
			damaged = append(damaged, [2]uint64{ce.From, ce.To})
			from = ce.To + 1
			continue
		case err != nil:
			t.Fatalf("Read(%d): %v", from, err)
		case len(recs) == 0:
			t.Fatalf("Read(%d) returned nothing below NextOffset %d", from, l.NextOffset())
		}
		for _, r := range recs {
			if r.Offset != from {
				t.Fatalf("Read returned offset %d, want %d", r.Offset, from)
			}
			got[r.Offset] = r
			from++
		}
	}
	return got, damaged
}

// checkServed asserts that every record outside the damaged ranges was
// served, right, and that the damaged ranges are exactly want: read
// through a Reader (by file position) one record a time and 13, and
// through Log.Read; the first meets the damage itself (the wal's parsed
// segments then serve the damaged ones to all).
func checkServed(t *testing.T, l *Log, want [][2]uint64) {
	t.Helper()
	for _, r := range []struct {
		name string
		read readFunc
		n    int
	}{{"Reader", l.NewReader().Read, 1}, {"Reader", l.NewReader().Read, 13}, {"Log.Read", l.Read, 13}} {
		checkServedBy(t, l, want, r.read, r.n, r.name)
	}
}

func checkServedBy(t *testing.T, l *Log, want [][2]uint64, read readFunc, n int, name string) {
	t.Helper()
	got, damaged := readAround(t, l, read, n)
	if !slices.Equal(damaged, want) {
		t.Fatalf("%s, %d records a read: damaged ranges %v, want %v", name, n, damaged, want)
	}
	in := func(o uint64) bool {
		for _, r := range want {
			if o >= r[0] && o <= r[1] {
				return true
			}
		}
		return false
	}
	for o := range uint64(damageRecords) {
		r, ok := got[o]
		switch {
		case in(o) && ok:
			t.Fatalf("%s, %d records a read: damaged offset %d was served", name, n, o)
		case !in(o) && !ok:
			t.Fatalf("%s, %d records a read: intact offset %d was not served", name, n, o)
		case ok:
			if err := sameRecord(r, rec(int(o))); err != nil {
				t.Fatalf("%s, %d records a read: offset %d: %v", name, n, o, err)
			}
		}
	}
}

func TestDamageServedAround(t *testing.T) {
	type edit struct {
		seg  int // index into the segment list
		k    int // entry within the segment
		what string
	}
	cases := []struct {
		name  string
		edits []edit
	}{
		{"length prefix low bit", []edit{{1, 3, "prefix^01"}}},
		{"length prefix high bit", []edit{{1, 3, "prefix^40"}}},
		{"length prefix continuation bit", []edit{{1, 3, "prefix^80"}}},
		{"length prefix of a segment's first record", []edit{{2, 0, "prefix^20"}}},
		{"length prefix of a segment's last record", []edit{{2, -1, "prefix^08"}}},
		{"header", []edit{{1, 5, "header"}}},
		{"payload", []edit{{1, 2, "payload"}}},
		{"garbage appended", []edit{{2, 0, "garbage"}}},
		{"truncated inside a record", []edit{{1, 4, "truncate"}}},
		{"truncated at a record boundary", []edit{{3, 2, "cut"}}},
		{"damage in two segments", []edit{{1, 1, "prefix^10"}, {3, 2, "payload"}}},
		{"two records of one segment", []edit{{2, 1, "header"}, {2, 4, "prefix^02"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir, segs := damageDir(t)
			var want [][2]uint64
			for _, e := range tc.edits {
				seg := segs[e.seg]
				base, end := seg.Index-1, segs[e.seg+1].Index-1
				k := e.k
				if k < 0 {
					k = int(end-base) - 1
				}
				off := base + uint64(k)
				editFile(t, seg.Path, func(data []byte) []byte {
					pos, prefix, size := entryAt(t, data, k)
					switch e.what {
					case "prefix^01", "prefix^02", "prefix^08", "prefix^10", "prefix^20", "prefix^40", "prefix^80":
						var bit byte
						fmt.Sscanf(e.what, "prefix^%x", &bit)
						data[pos] ^= bit
						want = append(want, [2]uint64{off, off})
					case "header":
						data[pos+prefix+timestampAt+2] ^= 0x04
						want = append(want, [2]uint64{off, off})
					case "payload":
						data[pos+size-1] ^= 0x40
						want = append(want, [2]uint64{off, off})
					case "garbage":
						data = append(data, 0x05, 0xff, 0x00, 0x13, 0x37, 0x80, 0x80)
					case "truncate":
						data = data[:pos+size/2]
						want = append(want, [2]uint64{off, end - 1})
					case "cut":
						data = data[:pos]
						want = append(want, [2]uint64{off, end - 1})
					}
					return data
				})
			}
			l, sink := testLog(t, dir, Options{SegmentSize: 2048, Name: "orders/2"})
			if l.NextOffset() != damageRecords {
				t.Fatalf("NextOffset %d after reopen, want %d", l.NextOffset(), damageRecords)
			}
			checkServed(t, l, want)
			if len(want) > 0 && sink.count(slogLevelWarn) == 0 {
				t.Error("damage was not logged")
			}
			// A second pass is served from the parsed segments just the same.
			checkServed(t, l, want)
		})
	}
}

// TestDamageRandomBitFlips flips one random bit of an older segment at a
// time: whatever it hits (length prefix or record), exactly the record
// holding that byte is reported damaged, and every other record is served.
func TestDamageRandomBitFlips(t *testing.T) {
	rng := rand.New(rand.NewPCG(12, 0))
	trials := 60
	if testing.Short() {
		trials = 10
	}
	for range trials {
		dir, segs := damageDir(t)
		i := 1 + rng.IntN(len(segs)-2)
		seg := segs[i]
		var at int
		var off uint64
		editFile(t, seg.Path, func(data []byte) []byte {
			at = rng.IntN(len(data))
			// The record holding byte at, found before the flip.
			for k, pos := 0, 0; ; k++ {
				_, n, ok := nextEntry(data[pos:])
				if !ok {
					t.Fatal("fixture segment does not parse")
				}
				if at < pos+n {
					off = seg.Index - 1 + uint64(k)
					break
				}
				pos += n
			}
			data[at] ^= 1 << rng.IntN(8)
			return data
		})
		t.Logf("segment %d byte %d: offset %d", i, at, off)
		l, err := Open(dir, Options{SegmentSize: 2048, Name: "orders/2", Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		checkServed(t, l, [][2]uint64{{off, off}})
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDamageInTailSegment: a flipped bit in an acknowledged record of the
// last segment costs that record, as in an earlier segment; it once made
// Open refuse the shard (the repair took it for a torn write below the
// high-water mark), and AcceptLoss then cut the intact records after it.
// Damage to the last acknowledged record cannot be told from a shifted
// framing: Open refuses it, and AcceptLoss costs exactly that record.
func TestDamageInTailSegment(t *testing.T) {
	opts := Options{SegmentSize: 2048, Name: "orders/2"}
	for _, what := range []string{"payload", "header"} {
		t.Run(what, func(t *testing.T) {
			dir, segs := damageDir(t)
			tail := segs[len(segs)-1]
			base := tail.Index - 1
			editFile(t, tail.Path, func(data []byte) []byte {
				pos, prefix, size := entryAt(t, data, 1)
				if what == "payload" {
					data[pos+size-1] ^= 0x40
				} else {
					data[pos+prefix+timestampAt+2] ^= 0x04
				}
				return data
			})
			l, _ := testLog(t, dir, opts)
			if l.NextOffset() != damageRecords {
				t.Fatalf("NextOffset %d after reopen, want %d", l.NextOffset(), damageRecords)
			}
			checkServed(t, l, [][2]uint64{{base + 1, base + 1}})
		})
	}
	t.Run("last record", func(t *testing.T) {
		dir, segs := damageDir(t)
		editFile(t, segs[len(segs)-1].Path, func(data []byte) []byte {
			ends := entryBounds(t, data)
			data[ends[len(ends)-1]-1] ^= 0x40
			return data
		})
		checkLost(t, dir, opts, damageRecords-1, damageRecords)
		checkServed(t, acceptLoss(t, dir, opts), [][2]uint64{{damageRecords - 1, damageRecords - 1}})
	})
}

// TestCommitClockIgnoresADamagedTimestamp: the commit clock (timestamps
// never go back) is seeded at Open from the last record that verifies.
// Seeded from a damaged header's timestamp, far in the future, it once
// stamped every later record with that time, and age retention then kept
// them forever.
func TestCommitClockIgnoresADamagedTimestamp(t *testing.T) {
	opts := Options{SegmentSize: 512, Name: "clock/0"}
	// A log whose last append rolled to a new segment: the tail is empty
	// and the last record ends an earlier segment (repair leaves it).
	var dir string
	var segs []segmentFile
	for n := 5; ; n++ {
		if n == 200 {
			t.Fatal("no log size leaves an empty tail segment")
		}
		dir = t.TempDir()
		writeLog(t, dir, opts, n)
		var err error
		if segs, _, err = listSegments(dir); err != nil {
			t.Fatal(err)
		}
		if len(segs) > 1 && segs[len(segs)-1].Size == 0 {
			break
		}
	}
	editFile(t, segs[len(segs)-2].Path, func(data []byte) []byte {
		ends := entryBounds(t, data)
		last := 0
		if len(ends) > 1 {
			last = ends[len(ends)-2]
		}
		_, prefix := uvarintPrefix(data[last:])
		binary.LittleEndian.PutUint64(data[last+prefix+timestampAt:], uint64(time.Now().Add(100*24*time.Hour).UnixNano()))
		return data
	})
	l, _ := testLog(t, dir, opts)
	off, err := l.Append(context.Background(), rec(0))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := l.Read(off, 1, 0)
	if err != nil || len(recs) != 1 {
		t.Fatalf("Read(%d) = %d records, %v", off, len(recs), err)
	}
	if ts := time.Unix(0, recs[0].Timestamp); time.Until(ts) > time.Hour {
		t.Fatalf("record appended now has timestamp %v, from the damaged record before it", ts)
	}
}

// TestRetentionPastEmptiedSegment: retention by size whose cut falls at
// a segment that damage emptied (a file of zero bytes). tidwall's
// TruncateFront panics on it: at Open's pass, or in the retention
// goroutine, where the panic ends the process.
func TestRetentionPastEmptiedSegment(t *testing.T) {
	dir, segs := damageDir(t)
	if err := os.Truncate(segs[2].Path, 0); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, s := range segs[2:] {
		total += s.Size
	}
	total -= segs[2].Size // now 0 bytes
	// Keep all but the first two segments: the cut is segs[2]'s first offset.
	l, _ := testLog(t, dir, Options{SegmentSize: 2048, Name: "orders/2", RetentionBytes: total})
	if first, want := l.FirstOffset(), segs[3].Index-1; first != want {
		t.Fatalf("FirstOffset %d after the pass, want %d (the emptied segment's offsets %d-%d dropped with it)", first, want, segs[2].Index-1, want-1)
	}
	recs, err := l.Read(l.FirstOffset(), 1, 0)
	if err != nil || len(recs) != 1 || sameRecord(recs[0], rec(int(l.FirstOffset()))) != nil {
		t.Fatalf("Read(%d) = %v, %v", l.FirstOffset(), recs, err)
	}
}
