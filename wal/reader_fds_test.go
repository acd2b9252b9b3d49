package wal

import (
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/tidseg"
)

// slowFS counts the segment files open through it and makes each ReadAt
// of one take a millisecond (a disk without the data in page cache).
type slowFS struct {
	open, peak atomic.Int64
}

type slowFile struct {
	File
	fs  *slowFS
	seg bool
}

func (s *slowFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := osFS{}.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	base := name[strings.LastIndexByte(name, os.PathSeparator)+1:]
	seg := len(base) == 20 && flag == os.O_RDONLY
	if seg {
		n := s.open.Add(1)
		for p := s.peak.Load(); n > p && !s.peak.CompareAndSwap(p, n); p = s.peak.Load() {
		}
	}
	return &slowFile{File: f, fs: s, seg: seg}, nil
}

func (s *slowFS) OpenDir(name string) (File, error) { return osFS{}.OpenDir(name) }

func (f *slowFile) ReadAt(p []byte, off int64) (int, error) {
	if f.seg {
		time.Sleep(time.Millisecond)
	}
	return f.File.ReadAt(p, off)
}

func (f *slowFile) Close() error {
	if f.seg {
		f.fs.open.Add(-1)
	}
	return f.File.Close()
}

// TestReaderFilesBounded: 64 Readers in different old segments read
// at once; the segment files open for them at once stay at tidseg.FilesMax
// (what broker.fdsPerShard counts), whatever the number of readers (a
// review saw 64 open at once before).
func TestReaderFilesBounded(t *testing.T) {
	fs := &slowFS{}
	l, _ := testLog(t, t.TempDir(), Options{Name: "fds/0", TailRecords: 64, SegmentSize: 64 << 10, FS: fs})
	starts := fillCatchUp(t, l, 70)
	var wg sync.WaitGroup
	for k := range 64 {
		wg.Go(func() {
			r := l.NewReader()
			from := starts[k] + 5
			for range 20 {
				recs, err := r.Read(from, 1, 0)
				if err != nil || len(recs) != 1 {
					t.Errorf("Read(%d): %d records, %v", from, len(recs), err)
					return
				}
				from++
			}
		})
	}
	wg.Wait()
	t.Logf("segment files open for Readers at once: at most %d", fs.peak.Load())
	if p := fs.peak.Load(); p > tidseg.FilesMax {
		t.Fatalf("%d segment files open at once for Readers of one log; tidseg.FilesMax is %d", p, tidseg.FilesMax)
	}
}
