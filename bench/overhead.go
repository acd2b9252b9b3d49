package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/internal/msgtrace"
	"github.com/felix-broker/felix/internal/telemetry"
)

// OverheadTarget is the bound of issue 7: with tracing and metrics on, the
// direct and forwarded p50 stay within 5% of off.
const OverheadTarget = 1.05

// The brokers' environments of the two clusters --telemetry compares
// (read by internal/telemetry.New in each broker process).
var (
	telemetryOffEnv = []string{"OTEL_METRICS_EXPORTER=none", "OTEL_TRACES_EXPORTER=none"}
	telemetryOnEnv  = []string{"OTEL_TRACES_EXPORTER=discard"}
)

// What the two sides of the comparison run with, for the report.
const (
	telemetryOffNote = "brokers with OTEL_TRACES_EXPORTER=none and OTEL_METRICS_EXPORTER=none; client with no tracer or meter provider"
	telemetryOnNote  = "brokers with OTEL_TRACES_EXPORTER=discard (every span sampled, ended and dropped in-process) and metrics recorded; " +
		"client with an SDK tracer provider built with client.TraceIDGenerator (every span sampled, dropped by an in-process exporter) and an SDK meter provider"
)

// TelemetryOverhead is what --telemetry measured: direct and forwarded,
// closed loop, on two local clusters, one without telemetry (off) and one
// with tracing and metrics on, the records alternating between them.
type TelemetryOverhead struct {
	Off       string            `json:"off"`       // what "off" runs with
	On        string            `json:"on"`        // what "on" runs with
	MaxRatio  float64           `json:"max_ratio"` // the target: on p50 <= MaxRatio × off p50
	Scenarios []*OverheadResult `json:"scenarios"`
}

// OverheadResult is one scenario of TelemetryOverhead. The percentiles are
// the median over the trials; RatioP50 is P50On / P50Off, TrialRatios the
// same ratio in each trial and RatioSpreadPct their range as a percentage
// of their median.
type OverheadResult struct {
	Scenario       string    `json:"scenario"`
	PathOff        string    `json:"path_off"`
	PathOn         string    `json:"path_on"`
	Count          int64     `json:"count"` // measured records of each side, over all trials
	P50Off         float64   `json:"p50_off_us"`
	P50On          float64   `json:"p50_on_us"`
	P99Off         float64   `json:"p99_off_us"`
	P99On          float64   `json:"p99_on_us"`
	RatioP50       float64   `json:"ratio_p50"`
	TrialP50Off    []float64 `json:"trial_p50_off_us"`
	TrialP50On     []float64 `json:"trial_p50_on_us"`
	TrialRatios    []float64 `json:"trial_ratios"`
	RatioSpreadPct float64   `json:"ratio_spread_pct"`
	WithinTarget   bool      `json:"within_target"` // RatioP50 <= OverheadTarget
}

// telemetryScenarios returns the scenarios --telemetry compares: those of
// direct and forwarded that --scenarios names.
func (c *Command) telemetryScenarios() []string {
	var out []string
	for _, s := range c.scenarios() {
		if s == Direct || s == Forwarded {
			out = append(out, s)
		}
	}
	return out
}

// executeTelemetry is Execute with --telemetry: it starts the two
// clusters, measures the overhead and writes the report.
func (c *Command) executeTelemetry(ctx context.Context, log *slog.Logger, out io.Writer, prog *progress, binary string, started time.Time) (*Report, error) {
	rep := &Report{
		Started: started, Machine: thisMachine(), PayloadBytes: c.Size, Trials: c.Trials,
		Cluster:   fmt.Sprintf("two local clusters of %d broker processes each (%s), telemetry off and on", c.Brokers, filepath.Base(binary)),
		Scenarios: []*Result{}, Targets: []Target{},
	}
	base := []client.Opt{client.WithLogger(log), client.WithMaxInFlight(max(c.Window, client.DefaultMaxInFlight))}

	off, err := c.startLocal(ctx, log, prog, binary, "telemetry-off", telemetryOffEnv)
	if err != nil {
		return nil, err
	}
	defer off.close()
	on, err := c.startLocal(ctx, log, prog, binary, "telemetry-on", telemetryOnEnv)
	if err != nil {
		return nil, err
	}
	defer on.close()
	if n := off.cl.BrokerProcs(); n > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("the brokers ran with GOMAXPROCS=%d (%d CPUs)", n, runtime.NumCPU()))
	}
	if fsType(off.dir) == "tmpfs" {
		rep.Notes = append(rep.Notes, "the clusters' directories are on tmpfs: fsync costs nothing there, which inflates the share telemetry takes")
	}

	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(telemetry.NewSpanBuffer(telemetry.Discard{}, telemetry.SpanBufferOptions{})),
		sdktrace.WithIDGenerator(msgtrace.IDs{}))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			log.Warn("bench: shutting down the tracer provider", "err", err)
		}
		if err := mp.Shutdown(sctx); err != nil {
			log.Warn("bench: shutting down the meter provider", "err", err)
		}
	}()

	envs := make([]*env, 0, 2)
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		for _, e := range envs {
			if err := e.close(cctx); err != nil {
				log.Warn("bench: cleaning up", "err", err)
			}
		}
	}()
	for _, side := range []struct {
		lc    *localCluster
		extra []client.Opt
	}{
		{off, nil},
		{on, []client.Opt{client.WithTracerProvider(tp), client.WithMeterProvider(mp)}},
	} {
		opts := append(slices.Clone(base), client.WithCAFile(side.lc.cl.CAFile()), client.WithClientCertFile(side.lc.cl.AdminCert()))
		e, err := newEnv(ctx, c.settings(), log, prog, side.lc.cl.Brokers()[0].Addr, append(opts, side.extra...))
		if err != nil {
			return nil, err
		}
		e.ownsData = true
		if len(envs) > 0 {
			// The same stream names on both: brokers with the same ids
			// place them alike, so both sides take the same path.
			e.runID = envs[0].runID
		}
		envs = append(envs, e)
	}

	ov := &TelemetryOverhead{Off: telemetryOffNote, On: telemetryOnNote, MaxRatio: OverheadTarget, Scenarios: []*OverheadResult{}}
	for _, s := range c.telemetryScenarios() {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r, err := measureOverhead(ctx, envs[0], envs[1], s)
		if isSkip(err) {
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s skipped: %v", s, err))
			continue
		}
		if err != nil {
			return nil, err
		}
		ov.Scenarios = append(ov.Scenarios, r)
	}
	rep.Telemetry = ov
	rep.DurationSec = round1(time.Since(started).Seconds())
	prog.close() // before the report is written; the deferred close is then a no-op

	if err := rep.write(out, c.JSON); err != nil {
		return nil, err
	}
	return rep, nil
}

// localCluster is one of the clusters --telemetry or --ab starts, with the
// directory it lives in.
type localCluster struct {
	cl     *cluster.Cluster
	dir    string
	remove bool // the directory is a temporary one of ours
}

// startLocal starts a local cluster of binary whose brokers get env, in a
// temporary directory (or in DIR/name with --dir); name says which of the
// compared clusters it is ("telemetry-off", "ab-a").
func (c *Command) startLocal(ctx context.Context, log *slog.Logger, prog *progress, binary, name string, env []string) (*localCluster, error) {
	lc := &localCluster{}
	if c.Dir != "" {
		lc.dir = filepath.Join(c.Dir, name)
		if err := os.MkdirAll(lc.dir, 0o755); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
	} else {
		dir, err := os.MkdirTemp("", "felix-bench-"+name+"-")
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		lc.dir, lc.remove = dir, !c.Keep
	}
	log.Info("starting a local cluster", "cluster", name, "brokers", c.Brokers, "dir", lc.dir, "binary", binary, "env", strings.Join(env, " "))
	prog.phase(fmt.Sprintf("starting %d brokers (%s)", c.Brokers, name), 0)
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cl, err := cluster.Start(sctx, cluster.Options{Dir: lc.dir, Binary: binary, Brokers: c.Brokers, BrokerProcs: c.BrokerProcs, BrokerEnv: env})
	if err != nil {
		lc.close()
		return nil, fmt.Errorf("bench: start a local cluster (%s, %s) in %s: %w", name, binary, lc.dir, err)
	}
	lc.cl = cl
	return lc, nil
}

// close stops the cluster and removes its directory if it is ours.
func (lc *localCluster) close() {
	if lc.cl != nil {
		lc.cl.Close()
	}
	if lc.remove {
		os.RemoveAll(lc.dir)
	}
}

// overheadSide is one cluster's publisher in measureOverhead.
type overheadSide struct {
	scenario   string
	name       string // "off" or "on"; "A" or "B"
	pub        *client.Publisher
	owner, via string
	forwarded  bool
	value      []byte
	hist       *hdrhistogram.Histogram // the current trial's latencies
	trials     []Percentiles
}

// publish sends one record, waits for its ack and checks the path it took.
func (s *overheadSide) publish(ctx context.Context) (time.Duration, error) {
	t0 := time.Now()
	ack, err := s.pub.Publish(ctx, nil, s.value, client.WithShard(0))
	d := time.Since(t0)
	if err != nil {
		return 0, fmt.Errorf("bench: %s, side %s: publish: %w", s.scenario, s.name, err)
	}
	if err := pathCheck(s.scenario+", side "+s.name, s.via, s.owner, s.forwarded)(ack); err != nil {
		return 0, err
	}
	return d, nil
}

// measureOverhead runs scenario (direct or forwarded), closed loop, on
// both clusters at once (see alternateClosed), off against on.
func measureOverhead(ctx context.Context, off, on *env, scenario string) (*OverheadResult, error) {
	sides, err := alternateClosed(ctx, [2]*env{off, on}, [2]string{"off", "on"}, scenario, "-overhead", "telemetry off/on")
	if err != nil {
		return nil, err
	}
	r := &OverheadResult{Scenario: scenario, PathOff: sides[0].path(), PathOn: sides[1].path()}
	for t := range sides[0].trials {
		pOff, pOn := sides[0].trials[t], sides[1].trials[t]
		r.TrialP50Off, r.TrialP50On = append(r.TrialP50Off, pOff.P50), append(r.TrialP50On, pOn.P50)
		r.TrialRatios = append(r.TrialRatios, ratio3(pOn.P50, pOff.P50))
	}
	mOff, mOn := medianPercentiles(sides[0].trials), medianPercentiles(sides[1].trials)
	r.Count = mOff.Count
	r.P50Off, r.P50On, r.P99Off, r.P99On = mOff.P50, mOn.P50, mOff.P99, mOn.P99
	r.RatioP50 = ratio3(r.P50On, r.P50Off)
	r.RatioSpreadPct = spreadPct(r.TrialRatios)
	r.WithinTarget = r.RatioP50 > 0 && r.RatioP50 <= OverheadTarget
	return r, nil
}

// alternateClosed runs scenario (direct or forwarded), closed loop, on two
// clusters at once: each record goes to one and then to the other, the
// first of the two alternating from record to record, so that whatever
// else the machine does falls on both alike. It returns each side with
// its trials' percentiles. suffix names the streams, label the progress
// phase.
func alternateClosed(ctx context.Context, envs [2]*env, names [2]string, scenario, suffix, label string) ([2]*overheadSide, error) {
	var sides [2]*overheadSide
	cfg := envs[0].cfg
	value := make([]byte, cfg.size) // never modified: shared by both sides
	for k, e := range envs {
		pub, owner, via, err := e.publisherOn(ctx, scenario, scenario+suffix)
		if err != nil {
			return sides, err
		}
		defer pub.Close()
		sides[k] = &overheadSide{
			name: names[k], pub: pub, owner: owner, via: via, forwarded: scenario == Forwarded,
			scenario: scenario, value: value,
		}
	}
	prog := envs[0].prog
	for t := range cfg.trials {
		prog.phase(fmt.Sprintf("%s %s %d/%d", scenario, label, t+1, cfg.trials), cfg.warmup+cfg.count)
		for _, s := range sides {
			s.hist = newHist()
		}
		for i := range cfg.warmup + cfg.count {
			for k := range sides {
				s := sides[(i+k)%len(sides)] // the first side first on even records, the second on odd ones
				d, err := s.publish(ctx)
				if err != nil {
					return sides, err
				}
				if i >= cfg.warmup {
					record(s.hist, d)
				}
			}
			prog.add(1)
		}
		for _, s := range sides {
			s.trials = append(s.trials, percentilesOf(s.hist))
		}
	}
	return sides, nil
}

// path is the side's path, "via -> owner".
func (s *overheadSide) path() string { return s.via + " -> " + s.owner }

// ratio3 returns a / b rounded to three decimals, 0 when b is 0.
func ratio3(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return float64(int64(a/b*1000+0.5)) / 1000
}

// writeTable writes the comparison for a person: one line per scenario,
// then what off and on mean.
func (ov *TelemetryOverhead) writeTable(w io.Writer) error {
	fmt.Fprintf(w, "telemetry overhead: closed loop, each record sent to both clusters, which goes first alternating; target: on p50 <= %.2f x off p50\n", ov.MaxRatio)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "SCENARIO\tCOUNT\tP50 OFF\tP50 ON\tON/OFF\tP99 OFF\tP99 ON\tTRIAL ON/OFF\tSPREAD\tTARGET\t")
	for _, r := range ov.Scenarios {
		trials := make([]string, len(r.TrialRatios))
		for i, x := range r.TrialRatios {
			trials[i] = fmt.Sprintf("%.3f", x)
		}
		verdict := "met"
		if !r.WithinTarget {
			verdict = "MISSED"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%.3f\t%s\t%s\t%s\t%.1f%%\t%s\t\n",
			r.Scenario, r.Count, fmtUS(r.P50Off), fmtUS(r.P50On), r.RatioP50, fmtUS(r.P99Off), fmtUS(r.P99On),
			strings.Join(trials, " "), r.RatioSpreadPct, verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "off: %s\non: %s\n", ov.Off, ov.On)
	return nil
}
