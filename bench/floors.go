package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/transport"
)

// Floors are the machine's floors, measured in the same run as the
// scenarios: what a durable publish cannot beat on this machine. Each
// floor's percentiles are the median over batches of floorBatch samples
// (Max the largest sample, Count all), as a scenario's are the median
// over its trials.
type Floors struct {
	// Fsync is write+fdatasync of one payload appended to a file on the
	// brokers' data filesystem.
	Fsync Percentiles `json:"fsync"`
	// FsyncPrealloc is write+fdatasync of one payload over zeros written
	// (and fdatasynced) beforehand, as a shard log writes into its
	// preallocated tail segment (package wal, prealloc.go): the file's
	// size does not change, so the fdatasync writes no inode. It is
	// what Felix pays (replicas preallocate the same way), and the
	// targets use it when it was measured (TargetFsync).
	FsyncPrealloc Percentiles `json:"fsync_prealloc"`
	// TargetFsync names the fsync floor the targets and every row's
	// P50FloorRatio and P99FloorRatio use: "fsync_prealloc", or "fsync"
	// (the plain append) only when the preallocated one was not measured.
	TargetFsync string `json:"target_fsync,omitempty"`
	// RTT is the echo of one payload-sized frame over QUIC between the
	// bench and an echo process (two processes, as client and broker are;
	// on a local cluster the echo runs at the brokers' GOMAXPROCS).
	RTT Percentiles `json:"rtt"`
	// RTTIdle is the same echo sent after IdleGapUS with nothing sent
	// (the gap between records of the open-loop rows): what waking idle
	// CPUs and sleeping threads adds to a round trip on this machine,
	// with no Felix code in it.
	RTTIdle   Percentiles `json:"rtt_idle"`
	IdleGapUS float64     `json:"rtt_idle_gap_us"`
	// FsyncIdle is FsyncPrealloc's write+fdatasync taken after IdleGapUS
	// with nothing written, as a shard log's commit at light load is:
	// what an idle machine adds to a commit (on a VM, a halted vCPU's
	// wake-up when the disk completes), with no Felix code in it.
	FsyncIdle Percentiles `json:"fsync_idle"`
	// FsyncShared, measured when replication factor 3 runs, is the shared
	// disk's floor for a replicated commit: write+fdatasync of one payload
	// over zeros written beforehand (as replicas write, see FsyncPrealloc)
	// in each of three files of the data filesystem at once (one
	// goroutine each, as the three brokers of a local cluster do, all
	// released together), from the first write until the second
	// fdatasync is done, as a commit needs the leader's and one
	// follower's. Its excess over the targets' fsync floor is what
	// sharing one disk (and one filesystem journal) costs a replicated
	// record here; machines of their own would overlap the fdatasyncs.
	FsyncShared *Percentiles `json:"fsync_shared,omitempty"`
	// FsyncSharedSkew is how far apart FsyncShared's three writes
	// started (the last start minus the first): how nearly "at once"
	// they were. On 2 CPUs three threads cannot all run at once; at the
	// bench's GOMAXPROCS of 2 the third once started 200-275 µs after
	// the first (see sharedSyncer).
	FsyncSharedSkew *Percentiles `json:"fsync_shared_start_skew,omitempty"`
	// FsyncDir and FsyncFS say where the fsync floor was measured.
	FsyncDir string `json:"fsync_dir"`
	FsyncFS  string `json:"fsync_fs"`

	// fsyncHist is the targets' fsync floor's samples (TargetFsync),
	// rttHist RTT's: the plot's floor curves.
	fsyncHist, rttHist *hdrhistogram.Histogram
}

// targetFsync returns the fsync floor the targets use and its JSON name:
// FsyncPrealloc, what a shard log's commit and a replica's append pay
// (both write over zeros written ahead: package wal, internal/tidseg),
// when it was measured; else Fsync, the plain append, which also writes
// the inode and costs more (110 against 76 µs p50 in one run): a floor
// Felix beats is no floor.
func (f Floors) targetFsync() (Percentiles, string) {
	if f.FsyncPrealloc.Count > 0 {
		return f.FsyncPrealloc, "fsync_prealloc"
	}
	return f.Fsync, "fsync"
}

// floorBatch is the samples in a batch of a floor: a floor's percentiles
// are each the median over its batches' (Max the largest sample, Count
// all of them), as a scenario's are the median over its trials, so that
// one bad stretch of a few hundred samples raises one batch's p99 and not
// the floor's. With the default --floor-count of 2000, 8 batches: 4 taken
// before the scenarios and 4 after. A batch's p99 is its third largest
// sample (a trial's of 2000 records, its 20th).
const floorBatch = 250

// floorSamples are one floor's samples, in the order they were taken.
type floorSamples struct {
	d []time.Duration
}

func (s *floorSamples) add(d time.Duration) { s.d = append(s.d, d) }

// percentiles cuts the samples, in the order taken, into max(1,
// n/floorBatch) batches of (nearly) equal size and returns the median
// over the batches of each percentile (see floorBatch).
func (s *floorSamples) percentiles() Percentiles {
	n := len(s.d)
	if n == 0 {
		return Percentiles{}
	}
	k := max(1, n/floorBatch)
	batches := make([]Percentiles, k)
	for j := range k {
		h := newHist()
		for _, d := range s.d[j*n/k : (j+1)*n/k] {
			record(h, d)
		}
		batches[j] = percentilesOf(h)
	}
	return medianPercentiles(batches)
}

// hist returns every sample in one histogram (the plot's floor curves).
func (s *floorSamples) hist() *hdrhistogram.Histogram {
	h := newHist()
	for _, d := range s.d {
		record(h, d)
	}
	return h
}

// floorMeter measures the floors. It holds an open file on the data disk
// and an echo process with a connection to it, so the floors can be
// sampled more than once in a run (before and after the scenarios).
type floorMeter struct {
	dir     string
	payload []byte
	file    *os.File
	pre     *os.File   // the preallocated file of FsyncPrealloc
	shared  []*os.File // the three files of the shared-disk floor, if measured

	echo    *exec.Cmd
	exited  chan struct{} // closed when echo has been waited for
	stderr  *capped
	conn    *quic.Conn
	stream  *quic.Stream
	r       *transport.Reader
	w       *transport.Writer
	pubEcho *transport.Publish

	fsync, fsyncPre, fsyncIdle, rtt, rttIdle *floorSamples
	fsyncShared, sharedSkew                  *floorSamples // nil unless shared
	idleGap                                  time.Duration // before each sample of rttIdle
}

// startFloors opens the fsync file in dataDir and starts the echo process
// (binary's hidden `echo` command) with a certificate made in workDir;
// the idle round trips are taken idleGap apart. With shared, it also
// opens the shared-disk floor's files. procs is the GOMAXPROCS the echo
// process runs with, that of the brokers whose round trip it stands for
// (0: the bench's environment decides, as for the brokers).
func startFloors(ctx context.Context, binary, workDir, dataDir string, size int, idleGap time.Duration, shared bool, procs int) (_ *floorMeter, err error) {
	m := &floorMeter{dir: dataDir, payload: make([]byte, size), fsync: &floorSamples{}, fsyncPre: &floorSamples{}, fsyncIdle: &floorSamples{},
		rtt: &floorSamples{}, rttIdle: &floorSamples{}, idleGap: idleGap}
	defer func() {
		if err != nil {
			m.close()
		}
	}()
	m.file, err = os.CreateTemp(dataDir, "felix-bench-fsync-*")
	if err != nil {
		return nil, fmt.Errorf("bench: fsync floor: create a file in %s: %w", dataDir, err)
	}
	m.pre, err = os.CreateTemp(dataDir, "felix-bench-fsync-prealloc-*")
	if err != nil {
		return nil, fmt.Errorf("bench: fsync floor: create a file in %s: %w", dataDir, err)
	}
	if shared {
		m.fsyncShared, m.sharedSkew = &floorSamples{}, &floorSamples{}
		for range sharedReplicas {
			f, err := os.CreateTemp(dataDir, "felix-bench-fsync-shared-*")
			if err != nil {
				return nil, fmt.Errorf("bench: shared-disk fsync floor: create a file in %s: %w", dataDir, err)
			}
			m.shared = append(m.shared, f)
		}
	}

	certDir := filepath.Join(workDir, "echo-certs")
	if err := transport.GenerateDevCerts(certDir, "echo"); err != nil {
		return nil, fmt.Errorf("bench: RTT floor: certificates for the echo process: %w", err)
	}
	ca, err := transport.LoadCA(filepath.Join(certDir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("bench: RTT floor: %w", err)
	}
	// The echo server, like a broker, accepts only clients with a
	// certificate: present the dev PKI's admin certificate, so the floor
	// pays the same handshake and path as the scenarios.
	cert, err := transport.LoadKeyPair(filepath.Join(certDir, transport.DevAdminName+".crt"), filepath.Join(certDir, transport.DevAdminName+".key"))
	if err != nil {
		return nil, fmt.Errorf("bench: RTT floor: %w", err)
	}
	addr, err := m.startEcho(ctx, binary, certDir, procs)
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m.conn, err = transport.Dial(dctx, addr, transport.ClientTLS(ca, &cert, "", transport.ALPNClient), transport.Config{})
	if err != nil {
		return nil, fmt.Errorf("bench: RTT floor: dial the echo process at %s: %w", addr, err)
	}
	m.stream, err = m.conn.OpenStreamSync(dctx)
	if err != nil {
		return nil, fmt.Errorf("bench: RTT floor: open a stream to the echo process: %w", err)
	}
	m.r, m.w = transport.NewReader(m.stream, 0), transport.NewWriter(m.stream)
	m.pubEcho = &transport.Publish{Stream: "bench-echo", Shard: 0, Value: m.payload}
	return m, nil
}

// startEcho starts `binary echo`, at GOMAXPROCS procs when above 0, and
// returns the address it printed.
func (m *floorMeter) startEcho(ctx context.Context, binary, certDir string, procs int) (string, error) {
	cmd := exec.Command(binary, "echo", "--certs", certDir, "--id", "echo", "--listen", "127.0.0.1:0")
	cmd.SysProcAttr = dieWithParent()
	if procs > 0 {
		cmd.Env = append(os.Environ(), "GOMAXPROCS="+strconv.Itoa(procs))
	}
	m.stderr = &capped{max: 4096}
	cmd.Stderr = m.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", fmt.Errorf("bench: RTT floor: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("bench: RTT floor: start the echo process (%s echo): %w", binary, err)
	}
	m.echo, m.exited = cmd, make(chan struct{})
	lines := make(chan string, 1)
	go func() { // ends at the first line or when the process exits
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- line
		io.Copy(io.Discard, stdout) // the pipe must be drained before Wait
		cmd.Wait()
		close(m.exited)
	}()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	var line string
	select {
	case line = <-lines:
	case <-timeout.C:
	case <-ctx.Done():
	}
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if !ok {
		return "", fmt.Errorf("bench: RTT floor: the echo process (%s echo) did not print \"listening ADDR\" (got %q; its stderr: %s)",
			binary, line, m.stderr.String())
	}
	return addr, nil
}

// measure takes n samples of each floor after warmup unrecorded ones.
func (m *floorMeter) measure(warmup, n int, prog *progress) error {
	prog.phase("floor: write+fdatasync", warmup+n)
	if err := m.writeSyncs(m.file, m.fsync, warmup, n, prog, false); err != nil {
		return err
	}
	prog.phase("floor: write+fdatasync over preallocated zeros", warmup+n)
	// Zeros for the back-to-back samples, then for the idle ones.
	if _, err := m.pre.WriteAt(make([]byte, (warmup+2*n)*len(m.payload)), 0); err != nil {
		return fmt.Errorf("bench: fsync floor: preallocate %s: %w", m.pre.Name(), err)
	}
	if err := fdatasync(m.pre); err != nil {
		return fmt.Errorf("bench: fsync floor: fdatasync %s: %w", m.pre.Name(), err)
	}
	if err := m.writeSyncs(m.pre, m.fsyncPre, warmup, n, prog, true); err != nil {
		return err
	}
	prog.phase("floor: write+fdatasync over zeros after idle", n)
	for i := range n {
		time.Sleep(m.idleGap)
		if err := m.writeSync(m.pre, m.fsyncIdle, int64((warmup+n+i)*len(m.payload))); err != nil {
			return err
		}
		prog.add(1)
	}
	if len(m.shared) > 0 {
		if err := m.measureShared(warmup, n, prog); err != nil {
			return err
		}
	}
	prog.phase("floor: QUIC round trip", warmup+n)
	for i := range warmup + n {
		if err := m.echo1(m.rtt, i >= warmup); err != nil {
			return err
		}
		prog.add(1)
	}
	prog.phase("floor: QUIC round trip after idle", n)
	for range n {
		time.Sleep(m.idleGap)
		if err := m.echo1(m.rttIdle, true); err != nil {
			return err
		}
		prog.add(1)
	}
	return nil
}

// writeSyncs times warmup+n writes of the payload to f, each followed by
// an fdatasync, into h (all but the warmup): appended, or, with over,
// written over what f holds at the payload's place.
func (m *floorMeter) writeSyncs(f *os.File, h *floorSamples, warmup, n int, prog *progress, over bool) error {
	for i := range warmup + n {
		at := int64(-1)
		if over {
			at = int64(i * len(m.payload))
		}
		keep := h
		if i < warmup {
			keep = nil
		}
		if err := m.writeSync(f, keep, at); err != nil {
			return err
		}
		prog.add(1)
	}
	return nil
}

// writeSync times one write of the payload to f and its fdatasync, into
// h unless it is nil: appended when at < 0, else written at at.
func (m *floorMeter) writeSync(f *os.File, h *floorSamples, at int64) error {
	t0 := time.Now()
	var err error
	if at >= 0 {
		_, err = f.WriteAt(m.payload, at)
	} else {
		_, err = f.Write(m.payload)
	}
	if err != nil {
		return fmt.Errorf("bench: fsync floor: write %s: %w", f.Name(), err)
	}
	if err := fdatasync(f); err != nil {
		return fmt.Errorf("bench: fsync floor: fdatasync %s: %w", f.Name(), err)
	}
	if h != nil {
		h.add(time.Since(t0))
	}
	return nil
}

// echo1 takes one round trip to the echo process, into h if keep.
func (m *floorMeter) echo1(h *floorSamples, keep bool) error {
	t0 := time.Now()
	if err := m.w.Write(m.pubEcho); err != nil {
		return fmt.Errorf("bench: RTT floor: write to the echo process: %w", err)
	}
	if _, err := m.r.Read(); err != nil {
		return fmt.Errorf("bench: RTT floor: read from the echo process: %w", err)
	}
	if keep {
		h.add(time.Since(t0))
	}
	return nil
}

// floors returns what was measured so far.
func (m *floorMeter) floors() Floors {
	f := Floors{
		Fsync: m.fsync.percentiles(), FsyncPrealloc: m.fsyncPre.percentiles(), FsyncIdle: m.fsyncIdle.percentiles(), RTT: m.rtt.percentiles(),
		RTTIdle: m.rttIdle.percentiles(), IdleGapUS: float64(m.idleGap.Microseconds()),
		FsyncDir: m.dir, FsyncFS: fsType(m.dir),
		fsyncHist: m.fsync.hist(), rttHist: m.rtt.hist(),
	}
	if len(m.fsyncPre.d) > 0 { // the targets' fsync floor
		f.fsyncHist = m.fsyncPre.hist()
	}
	if m.fsyncShared != nil {
		shared, skew := m.fsyncShared.percentiles(), m.sharedSkew.percentiles()
		f.FsyncShared, f.FsyncSharedSkew = &shared, &skew
	}
	return f
}

// close closes the connection, stops the echo process and removes the
// fsync file.
func (m *floorMeter) close() error {
	var errs []error
	if m.stream != nil {
		m.stream.Close()
	}
	if m.conn != nil {
		m.conn.CloseWithError(0, "bench done")
	}
	if m.echo != nil {
		m.echo.Process.Signal(syscall.SIGTERM)
		select {
		case <-m.exited:
		case <-time.After(5 * time.Second):
			m.echo.Process.Kill()
			<-m.exited
		}
	}
	for _, f := range append([]*os.File{m.file, m.pre}, m.shared...) {
		if f != nil {
			errs = append(errs, f.Close(), os.Remove(f.Name()))
		}
	}
	return errors.Join(errs...)
}

// capped keeps the first max bytes written to it: a child's stderr for an
// error message, without growing without bound.
type capped struct {
	max int
	mu  sync.Mutex // Write runs on exec's copying goroutine
	buf bytes.Buffer
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.max - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (c *capped) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.TrimSpace(c.buf.String())
}
