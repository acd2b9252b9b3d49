package wal

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// readOnTo reads [from, to) through read, n records a time, and checks each
// record's offset and content (catchUpValue).
func readOnTo(t *testing.T, read readFunc, from, to uint64, n int) {
	t.Helper()
	for from < to {
		recs, err := read(from, n, 0)
		if err != nil {
			t.Fatalf("Read(%d): %v", from, err)
		}
		if len(recs) == 0 {
			t.Fatalf("Read(%d) returned nothing below %d", from, to)
		}
		for _, r := range recs {
			if r.Offset != from || string(r.Value) != string(catchUpValue(from)) {
				t.Fatalf("Read returned offset %d (value naming %x), want %d", r.Offset, r.Value[:8], from)
			}
			from++
		}
	}
}

// TestReaderAcrossRetention: retention drops segments under Readers placed
// in them, and rewrites the segment it cuts inside. A Reader whose next
// record was dropped gets an *OutOfRangeError, as Log.Read gives; one past
// the cut reads every record on, right, to the end.
func TestReaderAcrossRetention(t *testing.T) {
	l, _ := testLog(t, t.TempDir(), Options{SegmentSize: 16 << 10, TailRecords: 16,
		RetentionBytes: 100<<10 + 5000, RetentionCheck: time.Hour})
	starts := fillCatchUp(t, l, 12)
	readers := make([]*Reader, len(starts)-1)
	next := make([]uint64, len(readers))
	for k := range readers {
		// Placed near the end of segment k, where a cut inside it falls
		// before them.
		readers[k], next[k] = l.NewReader(), starts[k+1]-3
		readOnTo(t, readers[k].Read, next[k], next[k]+1, 1)
		next[k]++
	}
	// The first segment's file is kept open for readers now; retention
	// removes it, and the Log closes it.
	readOnTo(t, readers[0].Read, next[0], next[0]+1, 1)
	next[0]++
	dropped, err := l.EnforceRetention(time.Now())
	if err != nil || dropped == 0 {
		t.Fatalf("EnforceRetention dropped %d records: %v", dropped, err)
	}
	if held := deletedHeld(t, l.dir); len(held) > 0 {
		t.Fatalf("after retention the process holds removed segment files open: %v", held)
	}
	first, end := l.FirstOffset(), l.NextOffset()
	rewritten := false // a reader is placed in the segment cut inside, past the cut
	for k := range readers {
		rewritten = rewritten || starts[k] < first && next[k] >= first
	}
	if !rewritten {
		t.Fatalf("cut at %d: no reader is placed past it in the segment it rewrote (segments start at %v)", first, starts)
	}
	var out, on int
	for k, r := range readers {
		if next[k] < first {
			_, err := r.Read(next[k], 1, 0)
			var oe *OutOfRangeError
			if !errors.As(err, &oe) || !errors.Is(err, ErrOutOfRange) || oe.First != first {
				t.Fatalf("reader %d at %d, below the first offset %d: %v, want an *OutOfRangeError", k, next[k], first, err)
			}
			out++
			continue
		}
		readOnTo(t, r.Read, next[k], end, 1+k%3)
		on++
	}
	t.Logf("cut at %d: %d readers out of range, %d read on", first, out, on)
	if out == 0 || on == 0 {
		t.Fatalf("cut at %d: %d readers out of range, %d read on: want some of each", first, out, on)
	}
}

// TestReaderFallsBackOnFaults: a Reader whose segment files cannot be
// opened or read (FaultFS) serves every record all the same, through
// Log.Read's path.
func TestReaderFallsBackOnFaults(t *testing.T) {
	for _, op := range []Op{OpOpen, OpRead} {
		t.Run(op.String(), func(t *testing.T) {
			var armed atomic.Bool
			var hits atomic.Int64
			fs := &FaultFS{Inject: func(o Op, path string) bool {
				fail := o == op && armed.Load() && !strings.HasSuffix(path, hwmName)
				if fail {
					hits.Add(1)
				}
				return fail
			}}
			l, _ := testLog(t, t.TempDir(), Options{SegmentSize: 16 << 10, TailRecords: 16, FS: fs})
			starts := fillCatchUp(t, l, 5)
			armed.Store(true)
			readOnTo(t, l.NewReader().Read, starts[1]+5, starts[3]+5, 1)
			armed.Store(false)
			if hits.Load() == 0 {
				t.Fatalf("no %s of a segment file was failed", op)
			}
		})
	}
}

// TestReaderLargeRecords: records larger than a Reader's 64 KiB pread,
// among small ones, are read whole, and a Reader placed after them steps
// over them by their length: placed at every offset, it reads each record
// right.
func TestReaderLargeRecords(t *testing.T) {
	l, _ := testLog(t, t.TempDir(), Options{SegmentSize: 512 << 10, TailRecords: 1})
	value := func(i int) []byte {
		size := []int{10, 200 << 10, 300, 70 << 10, 1}[i%5]
		return bytes.Repeat([]byte{byte('a' + i%26)}, size)
	}
	const n = 40
	for i := range n {
		if _, err := l.Append(context.Background(), &Record{Key: []byte(strconv.Itoa(i)), Value: value(i)}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(recs []Record, from uint64) {
		t.Helper()
		for j, r := range recs {
			if want := from + uint64(j); r.Offset != want || string(r.Key) != strconv.Itoa(int(want)) || !bytes.Equal(r.Value, value(int(want))) {
				t.Fatalf("Read(%d): record %d is offset %d key %q (%d bytes), want offset %d", from, j, r.Offset, r.Key, len(r.Value), want)
			}
		}
	}
	for from := range uint64(n - 1) {
		r := l.NewReader()
		for _, k := range []int{1, 3} {
			recs, err := r.Read(from, k, 0)
			if err != nil || len(recs) == 0 {
				t.Fatalf("Read(%d, %d): %d records, %v", from, k, len(recs), err)
			}
			check(recs, from)
			from += uint64(len(recs))
			if from >= n {
				break
			}
		}
	}
}

// TestReaderFilesClosedOnClose: the segment files a Log keeps open for
// its Readers are closed by Close, and a read after Close opens none.
func TestReaderFilesClosedOnClose(t *testing.T) {
	if _, err := os.ReadDir("/proc/self/fd"); err != nil {
		t.Skip("no /proc/self/fd here")
	}
	dir := t.TempDir()
	l, _ := testLog(t, dir, Options{SegmentSize: 16 << 10, TailRecords: 16})
	starts := fillCatchUp(t, l, 4)
	a, b := l.NewReader(), l.NewReader()
	readOnTo(t, a.Read, starts[0], starts[0]+3, 1)
	readOnTo(t, b.Read, starts[2], starts[2]+3, 1)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Read(starts[0]+3, 1, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Read after Close: %v, want ErrClosed", err)
	}
	if held := heldUnder(dir, ""); len(held) > 0 {
		t.Fatalf("after Close the process holds files of the log open: %v", held)
	}
}

// deletedHeld returns the files of dir that this process holds open and
// that were removed (Linux: /proc/self/fd), nil elsewhere.
func deletedHeld(t *testing.T, dir string) []string {
	t.Helper()
	return heldUnder(dir, " (deleted)")
}

// heldUnder returns the files of dir this process holds open whose
// /proc/self/fd link ends with suffix (Linux), nil elsewhere.
func heldUnder(dir, suffix string) []string {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	var held []string
	for _, fd := range fds {
		p, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && strings.HasPrefix(p, dir) && strings.HasSuffix(p, suffix) {
			held = append(held, p)
		}
	}
	return held
}
