package bench

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The shared-disk floor (Floors.FsyncShared): write+fdatasyncs of three
// files at once on the data filesystem, as a local cluster's three
// replicas of a shard make them.

// sharedReplicas is the replicas whose fdatasyncs the shared-disk floor
// runs at once, and sharedQuorum the ones a commit waits for.
const (
	sharedReplicas = 3
	sharedQuorum   = 2
)

// measureShared takes warmup+n samples of the shared-disk floor, the
// first warmup unrecorded, over zeros written beforehand.
func (m *floorMeter) measureShared(warmup, n int, prog *progress) error {
	prog.phase(fmt.Sprintf("floor: %d write+fdatasyncs over zeros at once", len(m.shared)), warmup+n)
	if err := m.preallocShared(warmup + n); err != nil {
		return err
	}
	s := startSharedSyncer(m.shared, m.payload)
	defer s.stop()
	for i := range warmup + n {
		quorum, skew, err := s.sample(int64(i * len(m.payload)))
		if err != nil {
			return err
		}
		if i >= warmup {
			m.fsyncShared.add(quorum)
			m.sharedSkew.add(skew)
		}
		prog.add(1)
	}
	return nil
}

// preallocShared writes zeros for n payloads at the start of each shared
// file and fdatasyncs them, so that the samples write over them, as a
// replica's log does.
func (m *floorMeter) preallocShared(n int) error {
	zeros := make([]byte, n*len(m.payload))
	for _, f := range m.shared {
		if _, err := f.WriteAt(zeros, 0); err != nil {
			return fmt.Errorf("bench: shared-disk fsync floor: preallocate %s: %w", f.Name(), err)
		}
		if err := fdatasync(f); err != nil {
			return fmt.Errorf("bench: shared-disk fsync floor: fdatasync %s: %w", f.Name(), err)
		}
	}
	return nil
}

// sharedSyncer makes the shared-disk floor's write+fdatasyncs start
// together: one goroutine per file, each parked on one gate that a
// sample opens for all of them at once (startGate). Its owner
// (measureShared) starts it for the phase and stops it, which waits for
// its goroutines.
//
// While it runs, GOMAXPROCS is at least one per file and one for the
// owner: a goroutine in a syscall keeps its P until Go's sysmon takes it
// away, so at the bench's GOMAXPROCS of 2 the third goroutine waited for
// one of the first two's fdatasync (measured: it started 200-275 µs after
// the first; a goroutine started per sample, as before, 150-240 µs).
// With a P each and one futex wake, 27-47 µs p50 on 2 vCPUs: three
// threads on two CPUs cannot do better, and the skew is reported beside
// the floor.
type sharedSyncer struct {
	files     []*os.File
	payload   []byte
	gate      startGate
	at        atomic.Int64 // where the sample released next writes
	stopping  atomic.Bool
	results   chan sharedWrite
	wg        sync.WaitGroup
	prevProcs int
}

// sharedWrite is one file's part of a sample.
type sharedWrite struct {
	start, end time.Time // before its write, after its fdatasync
	err        error
}

func startSharedSyncer(files []*os.File, payload []byte) *sharedSyncer {
	s := &sharedSyncer{files: files, payload: payload, results: make(chan sharedWrite, len(files))}
	s.prevProcs = runtime.GOMAXPROCS(0)
	if s.prevProcs < len(files)+1 {
		runtime.GOMAXPROCS(len(files) + 1)
	}
	for _, f := range files {
		s.wg.Go(func() { s.writer(f) })
	}
	return s
}

// writer writes and fdatasyncs f at each opening of the gate, until stop.
func (s *sharedSyncer) writer(f *os.File) {
	var seen uint32
	for {
		seen = s.gate.wait(seen)
		if s.stopping.Load() {
			return
		}
		w := sharedWrite{start: time.Now()}
		_, w.err = f.WriteAt(s.payload, s.at.Load())
		if w.err == nil {
			w.err = fdatasync(f)
		}
		w.end = time.Now()
		s.results <- w
	}
}

// sample releases one write+fdatasync at at in every file, at once, and
// returns the time from the first write's start until sharedQuorum of
// them are done, and the skew between the first start and the last. It
// waits for every write before it returns.
func (s *sharedSyncer) sample(at int64) (quorum, skew time.Duration, err error) {
	s.at.Store(at)
	s.gate.open()
	writes := make([]sharedWrite, len(s.files))
	var errs []error
	for i := range writes {
		writes[i] = <-s.results
		if writes[i].err != nil {
			errs = append(errs, writes[i].err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return 0, 0, fmt.Errorf("bench: shared-disk fsync floor: %w", err)
	}
	byStart := func(a, b sharedWrite) int { return a.start.Compare(b.start) }
	first, last := slices.MinFunc(writes, byStart).start, slices.MaxFunc(writes, byStart).start
	slices.SortFunc(writes, func(a, b sharedWrite) int { return a.end.Compare(b.end) })
	return writes[sharedQuorum-1].end.Sub(first), last.Sub(first), nil
}

// stop ends the writers, waits for them and restores GOMAXPROCS (to
// its value, which then stays fixed rather than following the CPU quota
// as Go's default does: the bench is short-lived).
func (s *sharedSyncer) stop() {
	s.stopping.Store(true)
	s.gate.open()
	s.wg.Wait()
	if runtime.GOMAXPROCS(0) != s.prevProcs {
		runtime.GOMAXPROCS(s.prevProcs)
	}
}

// startGate releases every goroutine parked in wait at once.
type startGate struct {
	gen atomic.Uint32 // bumped by each opening
}

// wait parks until the gate has opened since the opening seen (0 at
// first) and returns the latest opening. An opening between two calls is
// not missed: it returns at once.
func (g *startGate) wait(seen uint32) uint32 {
	for {
		if v := g.gen.Load(); v != seen {
			return v
		}
		futexWait(&g.gen, seen)
	}
}

// open releases every waiter.
func (g *startGate) open() {
	g.gen.Add(1)
	futexWakeAll(&g.gen)
}
