//go:build linux

package tidseg

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

func newParked(t testing.TB) *ParkedSyncer {
	t.Helper()
	s, err := NewParkedSyncer()
	if err != nil {
		t.Skipf("no AIO context here: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

// TestParkedSyncerSyncs: a parked fdatasync of a written file succeeds,
// again and again on one syncer (its iocb and eventfd are reused), and
// leaves the file as written.
func TestParkedSyncerSyncs(t *testing.T) {
	s := newParked(t)
	f, err := os.Create(filepath.Join(t.TempDir(), "seg"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := range 50 {
		if _, err := fmt.Fprintf(f, "record %d\n", i); err != nil {
			t.Fatal(err)
		}
		if err := s.Fdatasync(f); err != nil {
			t.Fatalf("fdatasync %d: %v", i, err)
		}
	}
	if s.off {
		t.Fatal("the kernel refused AIO fdatasync of a regular file: every call fell back to blocking")
	}
	data, err := os.ReadFile(f.Name())
	if err != nil || len(data) == 0 {
		t.Fatalf("read back %d bytes: %v", len(data), err)
	}
}

// TestParkedSyncerErrors: what fdatasync itself refuses comes back as an
// error, never as success. A pipe has no fsync: the kernel refuses the AIO
// request (EINVAL), the syncer falls back to the blocking call for good,
// which fails the same way. A closed file is a bad descriptor.
func TestParkedSyncerErrors(t *testing.T) {
	s := newParked(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := s.Fdatasync(w); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("fdatasync of a pipe: %v, want EINVAL", err)
	}
	if !s.off {
		t.Fatal("the syncer kept trying AIO after the kernel refused the operation")
	}

	s2 := newParked(t)
	f, err := os.Create(filepath.Join(t.TempDir(), "seg"))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := s2.Fdatasync(f); err == nil {
		t.Fatal("fdatasync of a closed file succeeded")
	}
}

// BenchmarkFdatasyncFiles commits to several files at once, one goroutine
// each (a broker's shards), with blocking, handed-off and parked
// fdatasync. Run it with -cpu 1 to see what a broker at GOMAXPROCS=1 gets:
// blocking, each fsync holds the only P until sysmon takes it back;
// handed off, the P goes on to the next file's goroutine at once; parked,
// they overlap in the kernel. b.N counts commits across all files.
func BenchmarkFdatasyncFiles(b *testing.B) {
	for _, files := range []int{1, 4, 16} {
		for _, mode := range []string{"blocking", "handoff", "parked"} {
			b.Run(fmt.Sprintf("files=%d/%s", files, mode), func(b *testing.B) {
				dir := b.TempDir()
				fs := make([]*os.File, files)
				for i := range fs {
					f, err := os.Create(filepath.Join(dir, fmt.Sprint(i)))
					if err != nil {
						b.Fatal(err)
					}
					defer f.Close()
					fs[i] = f
				}
				rec := make([]byte, 200)
				var next sync.Mutex
				left := b.N
				take := func() bool {
					next.Lock()
					defer next.Unlock()
					left--
					return left >= 0
				}
				b.ResetTimer()
				var wg sync.WaitGroup
				for _, f := range fs {
					var s *ParkedSyncer
					if mode == "parked" {
						s = newParked(b)
					}
					wg.Go(func() {
						for take() {
							if err := commitBy(mode, s, f, rec); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
			})
		}
	}
}

// commitBy appends rec to f and fdatasyncs it the way a benchmark's mode
// names: "parked" through s, "handoff" handing the P on, otherwise
// blocking with it.
func commitBy(mode string, s *ParkedSyncer, f *os.File, rec []byte) error {
	if _, err := f.Write(rec); err != nil {
		return err
	}
	switch mode {
	case "parked":
		return s.Fdatasync(f)
	case "handoff":
		return FdatasyncHandOff(f)
	default:
		return Fdatasync(f)
	}
}
