package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
)

// ABComparison is what --ab measured: two builds of Felix side by side in
// one run, cluster A running this build and cluster B the other, so that a
// change's effect is a ratio from one run (B/A) rather than a difference
// of two runs on a noisy machine.
type ABComparison struct {
	A         string      `json:"a"` // what cluster A's brokers run
	B         string      `json:"b"` // what cluster B's brokers run
	Scenarios []*ABResult `json:"scenarios"`
}

// ABResult is one scenario of ABComparison. Latency rows (direct,
// forwarded; closed loop, records alternating between the clusters) have
// the percentiles; the throughput row (trials alternating, ABBA…) has the
// rates too. Percentiles and rates are the median over the trials; every
// ratio is B/A, overall and per trial, with the spread of the per-trial
// ratios (their range as a percentage of their median).
type ABResult struct {
	Scenario string  `json:"scenario"`
	Mode     string  `json:"mode"`
	PathA    string  `json:"path_a"`
	PathB    string  `json:"path_b"`
	Count    int64   `json:"count"` // measured records of A, over all trials
	P50A     float64 `json:"p50_a_us"`
	P50B     float64 `json:"p50_b_us"`
	P99A     float64 `json:"p99_a_us"`
	P99B     float64 `json:"p99_b_us"`
	RatioP50 float64 `json:"ratio_p50"` // P50B / P50A
	RatioP99 float64 `json:"ratio_p99"` // P99B / P99A

	TrialRatiosP50    []float64 `json:"trial_ratios_p50"`
	TrialRatiosP99    []float64 `json:"trial_ratios_p99"`
	RatioP50SpreadPct float64   `json:"ratio_p50_spread_pct"`
	RatioP99SpreadPct float64   `json:"ratio_p99_spread_pct"`

	// Throughput only: acked records/s.
	ThroughputA              float64   `json:"throughput_a_msgs_per_s,omitempty"`
	ThroughputB              float64   `json:"throughput_b_msgs_per_s,omitempty"`
	RatioThroughput          float64   `json:"ratio_throughput,omitempty"` // ThroughputB / ThroughputA
	TrialRatiosThroughput    []float64 `json:"trial_ratios_throughput,omitempty"`
	RatioThroughputSpreadPct float64   `json:"ratio_throughput_spread_pct,omitempty"`

	// Throughput only: the brokers' CPU µs per acked record (median over
	// the trials; see Result.BrokerCPUPerRecord) and its ratio.
	CPUPerRecordA     *float64 `json:"broker_cpu_us_per_record_a,omitempty"`
	CPUPerRecordB     *float64 `json:"broker_cpu_us_per_record_b,omitempty"`
	RatioCPUPerRecord float64  `json:"ratio_broker_cpu_per_record,omitempty"` // B / A
}

// abScenarios returns the scenarios --ab compares: those of direct,
// forwarded and throughput that --scenarios names.
func (c *Command) abScenarios() []string {
	var out []string
	for _, s := range c.scenarios() {
		if s == Direct || s == Forwarded || s == Throughput {
			out = append(out, s)
		}
	}
	return out
}

// otherBinary returns the felix executable of cluster B: --ab, or the
// revision --ab-rev built into dir.
func (c *Command) otherBinary(ctx context.Context, log *slog.Logger, prog *progress, dir string) (path, desc string, err error) {
	if c.AB != "" {
		abs, err := filepath.Abs(c.AB)
		if err != nil {
			return "", "", fmt.Errorf("bench: --ab %s: %w", c.AB, err)
		}
		return abs, abs, nil
	}
	prog.phase("building felixctl at "+c.ABRev, 0)
	log.Info("building felixctl for cluster B", "rev", c.ABRev, "dir", dir)
	path, commit, err := buildRevision(ctx, c.ABRev, dir)
	if err != nil {
		return "", "", err
	}
	return path, fmt.Sprintf("felixctl built from %s (%s)", c.ABRev, commit), nil
}

// buildRevision builds cmd/felixctl as it is at git revision rev of the
// repository around the working directory into dir, from an export of
// that revision (git archive): the working tree is not touched. It returns
// the binary and the full commit id.
//
// felixctl, not felix: cluster A's brokers are this felixctl, and the two
// clusters must run the same kind of executable, built the same way
// (cgo as this one was). Measured on identical code, brokers run from
// the felix executable were 5% slower at p50 than from felixctl (B/A
// 1.05-1.06 in three runs, 1.01 with felixctl on both sides): code
// layout, not code, which an A/B of a felix binary would have charged to
// the change.
func buildRevision(ctx context.Context, rev, dir string) (bin, commit string, err error) {
	git := func(args ...string) ([]byte, error) {
		var stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("bench: git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return out, nil
	}
	out, err := git("rev-parse", "--verify", rev+"^{commit}")
	if err != nil {
		return "", "", fmt.Errorf("%w (run the bench inside the Felix repository, with a revision it has)", err)
	}
	commit = strings.TrimSpace(string(out))
	top, err := git("rev-parse", "--show-toplevel")
	if err != nil {
		return "", "", err
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", "", fmt.Errorf("bench: %w", err)
	}
	archive := exec.CommandContext(ctx, "git", "-C", strings.TrimSpace(string(top)), "archive", "--format=tar", commit)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return "", "", fmt.Errorf("bench: git archive: %w", err)
	}
	untar.Stdin = pipe
	var archErr, tarErr bytes.Buffer
	archive.Stderr, untar.Stderr = &archErr, &tarErr
	if err := untar.Start(); err != nil {
		return "", "", fmt.Errorf("bench: tar: %w", err)
	}
	if err := archive.Run(); err != nil {
		untar.Wait()
		return "", "", fmt.Errorf("bench: git archive %s: %w: %s", commit, err, strings.TrimSpace(archErr.String()))
	}
	if err := untar.Wait(); err != nil {
		return "", "", fmt.Errorf("bench: unpack %s: %w: %s", commit, err, strings.TrimSpace(tarErr.String()))
	}
	bin = filepath.Join(dir, "felixctl-"+commit[:12])
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/felixctl")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED="+cgoOfThisBuild())
	if b, err := build.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("bench: go build ./cmd/felixctl at %s: %w\n%s", commit, err, b)
	}
	return bin, commit, nil
}

// cgoOfThisBuild returns the CGO_ENABLED this executable was built with
// ("0" when it does not say).
func cgoOfThisBuild() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "CGO_ENABLED" {
				return s.Value
			}
		}
	}
	return "0"
}

// executeAB is Execute with --ab or --ab-rev: it starts the two clusters,
// compares them and writes the report.
func (c *Command) executeAB(ctx context.Context, log *slog.Logger, out io.Writer, prog *progress, binary string, started time.Time) (*Report, error) {
	buildDir, err := os.MkdirTemp("", "felix-bench-ab-build-")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer os.RemoveAll(buildDir)
	other, otherDesc, err := c.otherBinary(ctx, log, prog, buildDir)
	if err != nil {
		return nil, err
	}
	if st, err := os.Stat(other); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("bench: --ab %s: not an executable felix binary", other)
	}
	rep := &Report{
		Started: started, Machine: thisMachine(), PayloadBytes: c.Size, Trials: c.Trials,
		Cluster:   fmt.Sprintf("two local clusters of %d broker processes each: A %s, B %s", c.Brokers, filepath.Base(binary), filepath.Base(other)),
		Scenarios: []*Result{}, Targets: []Target{},
		Notes: []string{"both clusters' control plane runs in this process (this build's ctl): B's brokers must speak this build's control protocol"},
	}
	ab := &ABComparison{A: "this build: " + binary, B: otherDesc, Scenarios: []*ABResult{}}

	var clusters []*localCluster
	defer func() { // after the clients are closed (defers run last first)
		for _, lc := range clusters {
			lc.close()
		}
	}()
	var envs [2]*env
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		for _, e := range envs {
			if e == nil {
				continue
			}
			if err := e.close(cctx); err != nil {
				log.Warn("bench: cleaning up", "err", err)
			}
		}
	}()
	for k, side := range []struct{ name, bin string }{{"ab-a", binary}, {"ab-b", other}} {
		lc, err := c.startLocal(ctx, log, prog, side.bin, side.name, nil)
		if err != nil {
			return nil, err
		}
		clusters = append(clusters, lc)
		opts := []client.Opt{client.WithLogger(log), client.WithMaxInFlight(max(c.Window, client.DefaultMaxInFlight)),
			client.WithCAFile(lc.cl.CAFile()), client.WithClientCertFile(lc.cl.AdminCert())}
		e, err := newEnv(ctx, c.settings(), log, prog, lc.cl.Brokers()[0].Addr, opts)
		if err != nil {
			return nil, err
		}
		e.ownsData, e.watch = true, brokerWatch(lc.cl)
		if k > 0 {
			// The same stream names on both: brokers with the same ids
			// place them alike, so both sides take the same path.
			e.runID = envs[0].runID
		}
		envs[k] = e
		if k == 0 {
			if n := lc.cl.BrokerProcs(); n > 0 {
				rep.Notes = append(rep.Notes, fmt.Sprintf("the brokers ran with GOMAXPROCS=%d (%d CPUs)", n, runtime.NumCPU()))
			}
			if fsType(lc.dir) == "tmpfs" {
				rep.Notes = append(rep.Notes, "the clusters' directories are on tmpfs: fsync costs nothing there")
			}
		}
	}

	for _, s := range c.abScenarios() {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var r *ABResult
		var err error
		if s == Throughput {
			r, err = c.abThroughput(ctx, envs)
		} else {
			r, err = abLatency(ctx, envs, s)
		}
		if isSkip(err) {
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s skipped: %v", s, err))
			continue
		}
		if err != nil {
			return nil, err
		}
		ab.Scenarios = append(ab.Scenarios, r)
	}
	rep.AB = ab
	rep.DurationSec = round1(time.Since(started).Seconds())
	prog.close() // before the report is written; the deferred close is then a no-op
	if err := rep.write(out, c.JSON); err != nil {
		return nil, err
	}
	return rep, nil
}

// brokerWatch watches the brokers of cl and this process.
func brokerWatch(cl *cluster.Cluster) *procWatch {
	w := &procWatch{names: []string{selfName}, pids: []int{os.Getpid()}}
	for _, b := range cl.Brokers() {
		if pid := b.Pid(); pid > 0 {
			w.names, w.pids = append(w.names, b.ID), append(w.pids, pid)
		}
	}
	return w
}

// abLatency compares direct or forwarded, closed loop, records alternating
// between A and B.
func abLatency(ctx context.Context, envs [2]*env, scenario string) (*ABResult, error) {
	sides, err := alternateClosed(ctx, envs, [2]string{"A", "B"}, scenario, "-ab", "A/B")
	if err != nil {
		return nil, err
	}
	r := &ABResult{Scenario: scenario, Mode: ModeClosed, PathA: sides[0].path(), PathB: sides[1].path()}
	for t := range sides[0].trials {
		a, b := sides[0].trials[t], sides[1].trials[t]
		r.TrialRatiosP50 = append(r.TrialRatiosP50, ratio3(b.P50, a.P50))
		r.TrialRatiosP99 = append(r.TrialRatiosP99, ratio3(b.P99, a.P99))
	}
	mA, mB := medianPercentiles(sides[0].trials), medianPercentiles(sides[1].trials)
	r.setLatency(mA, mB)
	return r, nil
}

// setLatency fills the percentiles and their ratios from each side's
// median over the trials, and the spreads of the per-trial ratios.
func (r *ABResult) setLatency(a, b Percentiles) {
	r.Count = a.Count
	r.P50A, r.P50B, r.P99A, r.P99B = a.P50, b.P50, a.P99, b.P99
	r.RatioP50, r.RatioP99 = ratio3(b.P50, a.P50), ratio3(b.P99, a.P99)
	r.RatioP50SpreadPct, r.RatioP99SpreadPct = spreadPct(r.TrialRatiosP50), spreadPct(r.TrialRatiosP99)
}

// abThroughput compares the throughput scenario: the same publishers and
// shards on both clusters, the two never loaded at once, trials in the
// order A B, B A, A B, … so that a drift of the machine over the run falls
// on both alike.
func (c *Command) abThroughput(ctx context.Context, envs [2]*env) (*ABResult, error) {
	shards := c.shardCounts(len(envs[0].nodes))[0]
	var sets [2]*pubSet
	for k, e := range envs {
		ps, err := e.throughputPublishers(ctx, Throughput+"-ab", shards)
		if err != nil {
			return nil, err
		}
		defer ps.close()
		sets[k] = ps
	}
	var trials [2][]trial
	r := &ABResult{Scenario: Throughput, Mode: ModePipelined,
		PathA: fmt.Sprintf("%d publishers x %d in flight -> owners, %d shards", len(sets[0].pubs), c.Window, shards)}
	r.PathB = r.PathA
	for t := range c.Trials {
		order := []int{0, 1}
		if t%2 == 1 {
			order = []int{1, 0}
		}
		for _, k := range order {
			tr, err := envs[k].throughputTrial(ctx, sets[k], fmt.Sprintf("%s %d/%d", [2]string{"A", "B"}[k], t+1, c.Trials))
			if err != nil {
				return nil, err
			}
			trials[k] = append(trials[k], tr)
		}
	}
	ra, rb := envs[0].throughputResult(sets[0], trials[0]), envs[1].throughputResult(sets[1], trials[1])
	for t := range trials[0] {
		r.TrialRatiosP50 = append(r.TrialRatiosP50, ratio3(rb.TrialP50[t], ra.TrialP50[t]))
		r.TrialRatiosP99 = append(r.TrialRatiosP99, ratio3(rb.TrialP99[t], ra.TrialP99[t]))
		r.TrialRatiosThroughput = append(r.TrialRatiosThroughput, ratio3(rb.TrialThroughput[t], ra.TrialThroughput[t]))
	}
	r.setLatency(Percentiles{Count: ra.Count, P50: ra.P50, P99: ra.P99}, Percentiles{Count: rb.Count, P50: rb.P50, P99: rb.P99})
	r.ThroughputA, r.ThroughputB = ra.ThroughputMsgsPerS, rb.ThroughputMsgsPerS
	r.RatioThroughput = ratio3(r.ThroughputB, r.ThroughputA)
	r.RatioThroughputSpreadPct = spreadPct(r.TrialRatiosThroughput)
	r.CPUPerRecordA, r.CPUPerRecordB = ra.BrokerCPUPerRecord, rb.BrokerCPUPerRecord
	if ra.BrokerCPUPerRecord != nil && rb.BrokerCPUPerRecord != nil {
		r.RatioCPUPerRecord = ratio3(*rb.BrokerCPUPerRecord, *ra.BrokerCPUPerRecord)
	}
	return r, nil
}

// writeTable writes the comparison for a person: one line per scenario,
// then what A and B run.
func (ab *ABComparison) writeTable(w io.Writer) error {
	fmt.Fprintln(w, "A/B: two builds side by side in one run; latency closed loop, each record sent to both clusters (which goes first alternating); throughput in alternating trials (A B, B A, ...); every ratio is B/A")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "SCENARIO\tCOUNT\tP50 A\tP50 B\tB/A\tP99 A\tP99 B\tB/A\tMSG/S A\tMSG/S B\tB/A\tTRIAL B/A\tSPREAD\t")
	for _, r := range ab.Scenarios {
		tpA, tpB, tpR := "-", "-", "-"
		trialRatios, spread := r.TrialRatiosP50, r.RatioP50SpreadPct
		if r.Scenario == Throughput {
			tpA, tpB, tpR = fmt.Sprintf("%.0f", r.ThroughputA), fmt.Sprintf("%.0f", r.ThroughputB), fmt.Sprintf("%.3f", r.RatioThroughput)
			trialRatios, spread = r.TrialRatiosThroughput, r.RatioThroughputSpreadPct
		}
		trials := make([]string, len(trialRatios))
		for i, x := range trialRatios {
			trials[i] = fmt.Sprintf("%.3f", x)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%.3f\t%s\t%s\t%.3f\t%s\t%s\t%s\t%s\t%.1f%%\t\n",
			r.Scenario, r.Count, fmtUS(r.P50A), fmtUS(r.P50B), r.RatioP50, fmtUS(r.P99A), fmtUS(r.P99B), r.RatioP99,
			tpA, tpB, tpR, strings.Join(trials, " "), spread)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "TRIAL B/A and SPREAD: of the p50 for latency rows, of msg/s for throughput")
	for _, r := range ab.Scenarios {
		if r.CPUPerRecordA != nil && r.CPUPerRecordB != nil {
			fmt.Fprintf(w, "%s: brokers' CPU per acked record A %.2f µs, B %.2f µs, B/A %.3f\n", r.Scenario, *r.CPUPerRecordA, *r.CPUPerRecordB, r.RatioCPUPerRecord)
		}
	}
	fmt.Fprintf(w, "A: %s\nB: %s\n", ab.A, ab.B)
	return nil
}

// validateAB checks the flags of --ab and --ab-rev.
func (c *Command) validateAB() error {
	if c.AB == "" && c.ABRev == "" {
		return nil
	}
	switch {
	case c.AB != "" && c.ABRev != "":
		return errors.New("--ab and --ab-rev both name build B: give one")
	case c.Telemetry:
		return errors.New("--ab and --telemetry are two comparisons: run one at a time")
	case !c.Local:
		return errors.New("--ab needs --local: it starts the two clusters it compares")
	case c.Plot != "":
		return errors.New("--ab draws no plot: drop --plot")
	case len(c.abScenarios()) == 0:
		return errors.New("--ab compares direct, forwarded and throughput: name at least one of them in --scenarios")
	}
	if c.AB != "" {
		if st, err := os.Stat(c.AB); err != nil || st.IsDir() {
			return fmt.Errorf("--ab %s: not a felix binary (build one with `go build -o DIR/felix ./cmd/felix` at the revision to compare)", c.AB)
		}
	}
	return nil
}

// shardCounts returns the shard counts of the throughput scenario: --shards,
// or 2 per broker.
func (c *Command) shardCounts(brokers int) []int {
	if len(c.Shards) == 0 {
		return []int{2 * max(1, brokers)}
	}
	return slices.Clone(c.Shards)
}
