package tidseg

import (
	"bytes"
	"fmt"
	"testing"
	"time"
	"unsafe"

	tidwall "github.com/tidwall/wal"
)

// tailCache returns tidwall's cache of tw's tail segment, as PresizeTail
// finds it.
func tailCache(t testing.TB, tw *tidwall.Log) []byte {
	t.Helper()
	if !tailLayout.ok {
		t.Fatal("tidwall's Log.segments or segment.ebuf is not where PresizeTail looks")
	}
	segs := *(*[]unsafe.Pointer)(unsafe.Add(unsafe.Pointer(tw), tailLayout.segments))
	return *(*[]byte)(unsafe.Add(segs[len(segs)-1], tailLayout.entries))
}

// TestTailLayout checks PresizeTail against the tidwall this module
// builds with: it finds the tail's cache (an upgrade that moves it fails
// here), gives it the room asked for with the entries kept, and tidwall
// then appends into that room, across reads, without growing it, until
// it rolls to a new tail, which is tidwall's own again.
func TestTailLayout(t *testing.T) {
	const segSize = 4096
	tw, err := tidwall.Open(t.TempDir(), Options(segSize))
	if err != nil {
		t.Fatal(err)
	}
	defer tw.Close()
	entry := func(i uint64) []byte { return bytes.Repeat([]byte{byte(i)}, 100) }
	write := func(i uint64) {
		t.Helper()
		if err := tw.Write(i, entry(i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := uint64(1); i <= 3; i++ {
		write(i)
	}
	if !PresizeTail(tw, TailRoom(segSize)) {
		t.Fatal("PresizeTail did not find the tail's cache")
	}
	cache := tailCache(t, tw)
	if cap(cache) != TailRoom(segSize) || len(cache) != 3*101 {
		t.Fatalf("tail cache len %d cap %d, want len %d cap %d", len(cache), cap(cache), 3*101, TailRoom(segSize))
	}
	at := unsafe.SliceData(cache)
	i := uint64(4)
	for ; len(tailCache(t, tw)) < segSize-101; i++ {
		write(i)
		if got := unsafe.SliceData(tailCache(t, tw)); got != at {
			t.Fatalf("entry %d: tidwall moved the presized cache", i)
		}
	}
	for j := uint64(1); j < i; j++ {
		got, err := tw.Read(j)
		if err != nil || !bytes.Equal(got, entry(j)) {
			t.Fatalf("read %d: %v, %d bytes", j, err, len(got))
		}
	}
	if !PresizeTail(tw, 10) || unsafe.SliceData(tailCache(t, tw)) != at {
		t.Fatal("PresizeTail replaced a cache that had the room")
	}
	for ; unsafe.SliceData(tailCache(t, tw)) == at; i++ {
		write(i) // until tidwall rolls
	}
	if c := tailCache(t, tw); cap(c) >= segSize {
		t.Fatalf("new tail's cache has cap %d: not tidwall's own", cap(c))
	}
	if got, err := tw.Read(i - 1); err != nil || !bytes.Equal(got, entry(i-1)) {
		t.Fatalf("read %d after the roll: %v", i-1, err)
	}
}

// BenchmarkTailCache writes a 1 MiB segment of 173-byte entries (a
// 128-byte record with wal's framing) one entry per write, as a log at
// light load does, with tidwall's own growth of the tail's cache and
// presized; worst-µs is the slowest write of the segment, where a commit
// met a growth (tidwall's writes, no fsync: NoSync).
func BenchmarkTailCache(b *testing.B) {
	const segSize = 1 << 20
	data := bytes.Repeat([]byte{7}, 173)
	for _, presized := range []bool{false, true} {
		b.Run(fmt.Sprintf("presized=%v", presized), func(b *testing.B) {
			var worst time.Duration
			for b.Loop() {
				b.StopTimer()
				tw, err := tidwall.Open(b.TempDir(), Options(segSize))
				if err != nil {
					b.Fatal(err)
				}
				if presized {
					PresizeTail(tw, TailRoom(segSize))
				}
				b.StartTimer()
				for i := uint64(1); i <= uint64(segSize/(len(data)+2)); i++ {
					began := time.Now()
					if err := tw.Write(i, data); err != nil {
						b.Fatal(err)
					}
					worst = max(worst, time.Since(began))
				}
				b.StopTimer()
				tw.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(worst.Microseconds()), "worst-µs")
		})
	}
}

// TestPresizerPresizesFastLogsOnly: a log's first roll after it opens
// keeps tidwall's growth, as does a roll more than PresizeWithin after
// the one before (a slow log); a roll within it presizes.
func TestPresizerPresizesFastLogsOnly(t *testing.T) {
	var p Presizer
	at := time.Now()
	for i, c := range []struct {
		after time.Duration
		want  bool
	}{
		{0, false}, // the first roll: no segment filled in this run yet
		{6 * time.Second, true},
		{PresizeWithin - time.Millisecond, true},
		{PresizeWithin + time.Millisecond, false},
		{time.Second, true},
		{time.Minute, false},
	} {
		at = at.Add(c.after)
		if got := p.Rolled(at); got != c.want {
			t.Errorf("roll %d, %v after the one before: presize %v, want %v", i, c.after, got, c.want)
		}
	}
}
