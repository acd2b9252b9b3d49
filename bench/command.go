package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/shardmap"
)

// Command is `felixctl bench`: kong fills it from the command line. Mount
// it as a field of the application's CLI, tagged cmd:"":
//
//	Bench bench.Command `cmd:"" help:"Measure latency and throughput against the floors."`
type Command struct {
	Local bool `help:"Start a local cluster (control plane in-process, brokers as processes of this executable) and bench it. Without it the bench runs against the cluster felixctl finds like every other command (--cluster, --broker, --context, ./felix-cluster.json), as a principal allowed to create, publish to and subscribe to the bench's streams."`

	// The existing cluster to bench, without --local: a connection file,
	// or one broker with the cluster CA and a client certificate.
	// felixctl fills them from its discovery (its global flags); they are
	// not flags of their own.
	Cluster string `kong:"-"`
	Broker  string `kong:"-"`
	CA      string `kong:"-"`
	Cert    string `kong:"-"`
	Key     string `kong:"-"`
	// Source names the cluster in the report when given by Broker
	// ("felix-cluster.json", "context prod").
	Source string `kong:"-"`

	Brokers     int    `help:"Brokers of the local cluster." default:"3"`
	BrokerProcs int    `help:"With --local: GOMAXPROCS of each broker process (0: a share of the CPUs when the brokers outnumber them, else Go's default; -1: Go's default)." default:"0"`
	Dir         string `help:"With --local: where the cluster lives (default: a temporary directory, removed afterwards). Otherwise: a directory on the brokers' data disk, where the fsync floor is measured (default: the system temp dir)." type:"path" placeholder:"DIR"`
	Keep        bool   `help:"With --local: keep the cluster's directory (data, broker logs) after the run."`

	Scenarios []string `help:"Scenarios to run, of direct, forwarded, e2e, throughput and fanout." default:"direct,forwarded,e2e,throughput,fanout" sep:","`
	Size      int      `help:"Payload bytes of each record." default:"128"`
	Trials    int      `help:"Trials per scenario; percentiles are the median over them." default:"3"`
	Count     int      `help:"Measured records per trial in closed loop (direct, forwarded, e2e, fanout)." default:"2000"`
	Warmup    int      `help:"Records per trial sent before measuring, in closed loop." default:"200"`

	Rate         int           `help:"Open loop: records per second for direct and forwarded at a fixed rate, latency from the intended send time; 0 skips open loop." default:"1000"`
	OpenDuration time.Duration `help:"Open loop: length of each trial." default:"2s"`

	Publishers int           `help:"Throughput: concurrent publishers (one QUIC stream each)." default:"64"`
	Window     int           `help:"Throughput: records in flight per publisher (1 is closed loop)." default:"32"`
	Shards     []int         `help:"Throughput: shards of the stream (default: 2 per broker). Several (--shards 6,96,768) make a sweep: the throughput scenario runs over each, on a stream of its own deleted afterwards, and the report gives acked records/s, records per fsync, the largest broker's RSS and the memory per idle shard for each." sep:","`
	Duration   time.Duration `help:"Throughput: measured length of each trial." default:"3s"`
	TPWarmup   time.Duration `name:"throughput-warmup" help:"Throughput: warm-up before each trial." default:"500ms"`

	Load         []float64     `help:"Latency under load: after the throughput scenario (over the first --shards), open loop over its publishers at these percentages of the acked records/s it measured, one row each; empty (--load \"\") skips them." default:"10,50,80" sep:","`
	LoadDuration time.Duration `help:"Latency under load: length of each trial at each percentage." default:"2s"`

	Subscribers int   `help:"Fanout: subscribers of the one stream." default:"8"`
	Replicas    []int `help:"Replication factors of the bench streams, each 1 or 3 (each shard a raft group on three brokers; direct then publishes to the shard's raft leader, forwarded through a follower). Every scenario runs at the first; at each other one direct and forwarded run again in closed loop, and throughput over the first --shards with its load rows (--load), next to the first's rows, with their targets (3 is skipped, with a note, on fewer than three brokers)." default:"1,3" sep:","`
	FloorCount  int   `help:"Samples of each floor (fsync, QUIC round trip back to back and after the open-loop gap idle; with replication factor 3, three fsyncs at once), taken half before and half after the scenarios; each percentile is the median over batches of 250 samples, as a scenario's is over its trials." default:"2000"`

	AB    string `name:"ab" help:"With --local: compare this build with another felixctl (or felix) executable (cluster A runs this build, cluster B runs FELIX), side by side in one run: direct and forwarded closed loop with records alternating between them, throughput in alternating trials; every figure as the ratio B/A. Give a felixctl built like this one: on identical code a felix executable's brokers measured 5% slower (code layout)." type:"path" placeholder:"FELIX"`
	ABRev string `name:"ab-rev" help:"With --local: --ab with felixctl built from git revision REV of the repository around the working directory (exported with git archive into a temporary directory; the working tree is not touched)." placeholder:"REV"`

	Telemetry bool `help:"With --local: measure what telemetry costs: run direct and forwarded on two local clusters, one with no telemetry and one tracing every publish (spans dropped in-process) and recording metrics, alternating record by record, and report the p50s and their ratio."`

	// JSON writes the report as JSON instead of a table (felixctl's
	// global --json).
	JSON     bool   `kong:"-"`
	Output   string `short:"o" help:"Write the report to FILE instead of standard output." type:"path" placeholder:"FILE"`
	Plot     string `help:"Draw latency percentile curves of the scenarios to FILE (.svg or .png)." type:"path" placeholder:"FILE"`
	Progress bool   `help:"Show a progress bar on standard error (when it is a terminal)." default:"true" negatable:""`
	// CPUProfile profiles the bench process alone: the brokers of a
	// local cluster are processes of their own (FELIX_PPROF serves
	// theirs on their admin listeners).
	CPUProfile string `name:"cpu-profile" help:"Write the CPU profile of the bench process itself (its publishers and subscribers: the client side) to FILE, for go tool pprof." type:"path" placeholder:"FILE"`
	Trace      string `help:"Write a Go execution trace of the bench process itself to FILE, for go tool trace (a broker's is on its admin listener with FELIX_PPROF, /debug/pprof/trace; the timestamps of processes on one machine compare)." type:"path" placeholder:"FILE"`

	// Binary is the felix executable run as brokers and as the echo
	// process: default this executable (felixctl carries hidden `broker`
	// and `echo` commands). Tests point it at a built felix binary.
	Binary string `hidden:"" help:"Executable to run as brokers and echo (default: this one)." type:"path"`
}

// settings are the resolved knobs the scenarios read.
type settings struct {
	size, trials, count, warmup int
	rate                        int
	openDuration                time.Duration
	loadDuration                time.Duration
	publishers, window          int
	duration, throughputWarmup  time.Duration
	subscribers                 int
	replicas                    int // of the bench streams of the pass under way
}

// Validate checks the flags; kong calls it after parsing (and prefixes
// its error with the command's name).
//
// It checks the flags only: which cluster to bench (Cluster, Broker, set
// by felixctl's discovery after parsing) is checked by Execute.
func (c *Command) Validate() error {
	for _, s := range c.scenarios() {
		if !slices.Contains(Scenarios, s) {
			return fmt.Errorf("unknown scenario %q (have %s)", s, strings.Join(Scenarios, ", "))
		}
	}
	if c.Telemetry {
		if !c.Local {
			return errors.New("--telemetry needs --local: it starts the two clusters it compares")
		}
		if c.Plot != "" {
			return errors.New("--telemetry draws no plot: drop --plot")
		}
		if len(c.telemetryScenarios()) == 0 {
			return errors.New("--telemetry compares direct and forwarded: name at least one of them in --scenarios")
		}
	}
	if err := c.validateAB(); err != nil {
		return err
	}
	for i, r := range c.Replicas {
		if r != 1 && r != 3 {
			return fmt.Errorf("--replicas %d: the replication factor is 1 or 3", r)
		}
		if slices.Contains(c.Replicas[:i], r) {
			return fmt.Errorf("--replicas %d: named twice", r)
		}
	}
	if f := c.factors(); c.Local && len(f) == 1 && c.Brokers < f[0] {
		return fmt.Errorf("--replicas %d needs at least %d brokers (--brokers %d)", f[0], f[0], c.Brokers)
	}
	for _, n := range c.Shards {
		if n < 1 || n > shardmap.MaxShards {
			return fmt.Errorf("--shards %d: a stream has 1 to %d shards", n, shardmap.MaxShards)
		}
	}
	for _, pct := range c.Load {
		if pct <= 0 {
			return fmt.Errorf("--load %g: a percentage of the measured throughput must be above 0", pct)
		}
	}
	if c.Plot != "" && !slices.Contains(PlotFormats, strings.ToLower(filepath.Ext(c.Plot))) {
		return fmt.Errorf("--plot %s: the file must end in .svg or .png", c.Plot)
	}
	for _, v := range []struct {
		name string
		n    int
	}{{"size", c.Size}, {"trials", c.Trials}, {"count", c.Count}, {"publishers", c.Publishers}, {"window", c.Window}, {"floor-count", c.FloorCount}} {
		if v.n < 1 {
			return fmt.Errorf("--%s must be at least 1", v.name)
		}
	}
	if c.Size < stampLen && !c.Telemetry && (slices.Contains(c.scenarios(), E2E) || slices.Contains(c.scenarios(), Fanout)) {
		return fmt.Errorf("--size must be at least %d for e2e and fanout (the payload carries the send time)", stampLen)
	}
	if c.Window > client.DefaultMaxInFlight {
		return fmt.Errorf("--window must be at most %d", client.DefaultMaxInFlight)
	}
	return nil
}

// checkTarget checks that one cluster is named: Local, a connection file,
// or a broker with the CA and a client certificate.
func (c *Command) checkTarget() error {
	if !c.Local && c.Cluster == "" && c.Broker == "" {
		return errors.New("say which cluster: --local, or an existing one (--cluster FILE, --broker ADDR --ca FILE, --context NAME, ./felix-cluster.json)")
	}
	if c.Broker != "" && (c.CA == "" || c.Cert == "" || c.Key == "") {
		return errors.New("a broker to bench needs the cluster CA certificate (--ca) and a client certificate (--cert, --cert-key)")
	}
	return nil
}

// scenarios returns the scenarios asked for, in the canonical order.
func (c *Command) scenarios() []string {
	want := c.Scenarios
	if len(want) == 0 {
		want = Scenarios
	}
	var out []string
	for _, s := range Scenarios {
		if slices.Contains(want, s) {
			out = append(out, s)
		}
	}
	for _, s := range want { // unknown ones, for Validate to name
		if !slices.Contains(Scenarios, s) {
			out = append(out, s)
		}
	}
	return out
}

// Run runs the bench and writes the report (and the plot); SIGINT or
// SIGTERM stop it cleanly, local cluster included.
func (c *Command) Run(log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	out := io.Writer(os.Stdout)
	if c.Output != "" {
		f, err := os.Create(c.Output)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer f.Close()
		out = f
	}
	if c.CPUProfile != "" {
		stopProfile, err := startRecording(c.CPUProfile, pprof.StartCPUProfile, pprof.StopCPUProfile)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer stopProfile()
	}
	if c.Trace != "" {
		stopTrace, err := startRecording(c.Trace, trace.Start, trace.Stop)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer stopTrace()
	}
	_, err := c.Execute(ctx, log, out)
	return err
}

// startRecording starts one of the runtime's recordings of this process
// (pprof.StartCPUProfile, trace.Start) into a new file at path; the
// function it returns stops it (with stop) and closes the file.
func startRecording(path string, start func(io.Writer) error, stop func()) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := start(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return func() {
		stop()
		f.Close()
	}, nil
}

// Execute runs the bench, writes the report to out (a table, or JSON with
// --json) and the plot to c.Plot, and returns the report.
func (c *Command) Execute(ctx context.Context, log *slog.Logger, out io.Writer) (*Report, error) {
	if log == nil {
		log = slog.Default()
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("bench: %w", err) // kong adds the prefix itself
	}
	if err := c.checkTarget(); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	started := time.Now()
	prog := newProgress(os.Stderr, c.Progress)
	defer prog.close()

	binary := c.Binary
	if binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("bench: find this executable (to run brokers and echo): %w", err)
		}
		binary = exe
	}
	if c.Telemetry {
		return c.executeTelemetry(ctx, log, out, prog, binary, started)
	}
	if c.AB != "" || c.ABRev != "" {
		return c.executeAB(ctx, log, out, prog, binary, started)
	}
	workDir, err := os.MkdirTemp("", "felix-bench-")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer os.RemoveAll(workDir)

	rep := &Report{Started: started, Machine: thisMachine(), PayloadBytes: c.Size, Trials: c.Trials}
	var seed string
	var opts []client.Opt
	opts = append(opts, client.WithLogger(log), client.WithMaxInFlight(max(c.Window, client.DefaultMaxInFlight)))
	watch := &procWatch{names: []string{selfName}, pids: []int{os.Getpid()}}
	dataDir := c.Dir
	ownsCluster := false
	echoProcs := 0 // the RTT floor's echo process runs as the brokers do
	switch {
	case c.Local:
		dir := c.Dir
		if dir == "" {
			if dir, err = os.MkdirTemp("", "felix-bench-cluster-"); err != nil {
				return nil, fmt.Errorf("bench: %w", err)
			}
			if !c.Keep {
				defer os.RemoveAll(dir)
			}
		}
		dataDir = dir
		log.Info("starting a local cluster", "brokers", c.Brokers, "dir", dir, "binary", binary)
		prog.phase(fmt.Sprintf("starting %d brokers", c.Brokers), 0)
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		cl, err := cluster.Start(sctx, cluster.Options{Dir: dir, Binary: binary, Brokers: c.Brokers, BrokerProcs: c.BrokerProcs})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("bench: start a local cluster in %s: %w", dir, err)
		}
		defer cl.Close()
		if n := cl.BrokerProcs(); n > 0 {
			echoProcs = n
			rep.Notes = append(rep.Notes, fmt.Sprintf("the %d brokers and the echo process of the RTT floor ran with GOMAXPROCS=%d (%d CPUs)", c.Brokers, n, runtime.NumCPU()))
		}
		for _, b := range cl.Brokers() {
			pid := b.Pid() // a broker re-executes itself (package sysmon): same pid
			if pid == 0 {
				rep.Notes = append(rep.Notes, fmt.Sprintf("no CPU and RSS of %s: its process is not running", b.ID))
				continue
			}
			watch.names, watch.pids = append(watch.names, b.ID), append(watch.pids, pid)
		}
		if len(watch.pids) > 1 { // watch.pids[0] is this process
			rep.Notes = append(rep.Notes, sysmonNote(processGodebug(watch.pids[1])))
		}
		seed = cl.Brokers()[0].Addr
		opts = append(opts, client.WithCAFile(cl.CAFile()), client.WithClientCertFile(cl.AdminCert()))
		rep.Cluster = fmt.Sprintf("local cluster of %d broker processes (%s)", c.Brokers, filepath.Base(binary))
		ownsCluster = true
	case c.Cluster != "":
		cf, err := client.LoadClusterFile(c.Cluster)
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		if len(cf.Brokers) == 0 {
			return nil, fmt.Errorf("bench: %s lists no broker", c.Cluster)
		}
		seed = cf.Brokers[0].Addr
		opts = append(opts, client.WithCAFile(cf.CAFile), client.WithClientCertFile(cf.CertFile, cf.KeyFile))
		rep.Cluster = fmt.Sprintf("cluster %q (%s)", cf.Name, c.Cluster)
	default:
		seed = c.Broker
		opts = append(opts, client.WithCAFile(c.CA), client.WithClientCertFile(c.Cert, c.Key))
		rep.Cluster = "cluster of " + c.Broker
		if c.Source != "" {
			rep.Cluster += " (" + c.Source + ")"
		}
	}
	if slices.ContainsFunc(c.factors(), func(r int) bool { return r > 1 }) {
		rep.Notes = append(rep.Notes, "bench streams of replication factor 3 (rows marked R=3): direct publishes to the shard's raft leader (found by a probe record's ack), forwarded through another broker; an ack waits for a majority's fsync, and a local cluster's replicas share one disk")
	}
	if !c.Local {
		rep.Notes = append(rep.Notes, "existing cluster: broker CPU and RSS are not measured; the fsync floor is measured in "+
			orDefault(dataDir, os.TempDir())+" and the RTT floor on this host: run the bench on a broker's host with --dir on its data disk for honest floors")
		if dataDir == "" {
			dataDir = os.TempDir()
		}
	}
	if fs := fsType(dataDir); fs == "tmpfs" {
		rep.Notes = append(rep.Notes, "the data directory "+dataDir+" is on tmpfs: fsync costs nothing there, and the figures mean little")
	}

	e, err := newEnv(ctx, c.settings(), log, prog, seed, opts)
	if err != nil {
		return nil, err
	}
	e.watch, e.ownsData = watch, ownsCluster
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := e.close(cctx); err != nil {
			log.Warn("bench: cleaning up", "err", err)
		}
	}()

	// The idle round trips are as far apart as the open-loop rows'
	// records.
	idleGap := time.Millisecond
	if c.Rate > 0 {
		idleGap = time.Second / time.Duration(c.Rate)
	}
	floors, err := startFloors(ctx, binary, workDir, dataDir, c.Size, idleGap, slices.Contains(c.factors(), 3), echoProcs)
	if err != nil {
		return nil, err
	}
	defer floors.close()
	floorWarmup := max(10, c.FloorCount/20)
	if err := floors.measure(floorWarmup, (c.FloorCount+1)/2, prog); err != nil {
		return nil, err
	}

	if slices.Contains(c.scenarios(), Throughput) {
		if e.shardMem, err = e.measureShardMemory(ctx, c.memoryProbes(len(e.nodes))); err != nil {
			return nil, err
		}
	}
	for pass, factor := range c.factors() {
		if factor > len(e.nodes) {
			rep.Notes = append(rep.Notes, fmt.Sprintf("replication factor %d skipped: the cluster has %d brokers", factor, len(e.nodes)))
			continue
		}
		e.cfg.replicas = factor
		for _, s := range c.scenarios() {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			if pass > 0 && !slices.Contains(againScenarios, s) {
				continue
			}
			log.Debug("bench: scenario", "scenario", s, "replicas", factor)
			results, err := c.runScenario(ctx, e, s, pass == 0)
			if isSkip(err) {
				rep.Notes = append(rep.Notes, fmt.Sprintf("%s skipped: %v", s, err))
				continue
			}
			if err != nil {
				return nil, err
			}
			for _, r := range results {
				r.PayloadBytes = c.Size
				if pass > 0 || factor > 1 {
					r.Replicas = factor
				}
			}
			rep.Scenarios = append(rep.Scenarios, results...)
		}
	}

	if err := floors.measure(floorWarmup, c.FloorCount/2, prog); err != nil {
		return nil, err
	}
	rep.setFloors(floors.floors())
	rep.Notes = append(rep.Notes, e.notes...)
	rep.ShardSweep = shardSweep(rep.Scenarios)
	rep.checkTargets()
	rep.DurationSec = round1(time.Since(started).Seconds())
	prog.close() // before the report is written; the deferred close is then a no-op

	if c.Plot != "" {
		if err := writePlot(c.Plot, rep); err != nil {
			return nil, err
		}
	}
	if err := rep.write(out, c.JSON); err != nil {
		return nil, err
	}
	return rep, nil
}

// memoryProbes returns the streams whose memory per shard the throughput
// rows report: each shard count at the first replication factor, the
// first count at the others (as runThroughputScenario runs them).
func (c *Command) memoryProbes(brokers int) []memKey {
	var keys []memKey
	for pass, factor := range c.factors() {
		if factor > brokers {
			continue
		}
		counts := c.shardCounts(brokers)
		if pass > 0 {
			counts = counts[:1]
		}
		for _, n := range counts {
			keys = append(keys, memKey{factor, n})
		}
	}
	return keys
}

// againScenarios are those run again at each replication factor after
// the first: direct and forwarded in closed loop, throughput over the
// first shard count with its load rows.
var againScenarios = []string{Direct, Forwarded, Throughput}

// factors returns the replication factors to run, 1 if none is named.
func (c *Command) factors() []int {
	if len(c.Replicas) == 0 {
		return []int{1}
	}
	return c.Replicas
}

// runScenario runs one scenario in each of its modes; a pass after the
// first (another replication factor) runs the closed loop and the
// throughput over the first shard count only.
func (c *Command) runScenario(ctx context.Context, e *env, s string, first bool) ([]*Result, error) {
	switch s {
	case Direct, Forwarded:
		p, err := e.pathFor(ctx, s)
		if err != nil {
			return nil, err
		}
		defer p.pub.Close()
		closed, err := e.runPublish(ctx, s, p)
		if err != nil {
			return nil, err
		}
		out := []*Result{closed}
		if c.Rate > 0 && first { // on the same stream, shard and owner
			open, err := e.runOpen(ctx, s, p)
			if err != nil {
				return nil, err
			}
			out = append(out, open)
		}
		return out, nil
	case E2E:
		r, err := e.runDelivery(ctx, E2E, 1)
		return []*Result{r}, err
	case Fanout:
		r, err := e.runDelivery(ctx, Fanout, c.Subscribers)
		return []*Result{r}, err
	case Throughput:
		return c.runThroughputScenario(ctx, e, first)
	}
	return nil, fmt.Errorf("bench: unknown scenario %q", s)
}

// runThroughputScenario runs the throughput scenario over each shard count
// of --shards (the sweep), and the latency-under-load rows (--load) after
// the first of them, over the same publishers.
func (c *Command) runThroughputScenario(ctx context.Context, e *env, first bool) ([]*Result, error) {
	counts := c.shardCounts(len(e.nodes))
	if !first {
		counts = counts[:1]
	}
	var out []*Result
	for k, n := range counts {
		name := Throughput
		if len(counts) > 1 {
			name = fmt.Sprintf("%s-%d", Throughput, n)
		}
		rs, err := func() ([]*Result, error) {
			ps, err := e.throughputPublishers(ctx, name, n)
			if err != nil {
				return nil, err
			}
			defer ps.close()
			r, err := e.runThroughput(ctx, ps)
			if err != nil {
				return nil, err
			}
			if m, ok := e.shardMem[memKey{e.cfg.replicas, n}]; ok {
				r.IdleShardKiB, r.OpenShardKiB = m.idle, m.open
			}
			rs := []*Result{r}
			if k > 0 {
				return rs, nil
			}
			for _, pct := range c.Load {
				lr, err := e.runLoad(ctx, ps, r.ThroughputMsgsPerS, pct)
				if err != nil {
					return nil, err
				}
				rs = append(rs, lr)
			}
			return rs, nil
		}()
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
		if len(counts) > 1 {
			// The next step starts from brokers without this stream's
			// shards: its RSS and its memory per shard are its own.
			if err := e.deleteStream(ctx, name); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

func (c *Command) settings() settings {
	return settings{
		size: c.Size, trials: c.Trials, count: c.Count, warmup: max(0, c.Warmup),
		rate: c.Rate, openDuration: c.OpenDuration, loadDuration: c.LoadDuration,
		publishers: c.Publishers, window: c.Window,
		duration: c.Duration, throughputWarmup: c.TPWarmup,
		subscribers: max(1, c.Subscribers),
		replicas:    c.factors()[0],
	}
}

// selfName names this process among the watched ones.
const selfName = "bench"

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
