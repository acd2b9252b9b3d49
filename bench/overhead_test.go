package bench

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
)

// overheadReport is a --telemetry report as Execute makes it.
func overheadReport() *Report {
	return &Report{
		Started: time.Unix(1700000000, 0).UTC(), DurationSec: 12.5, Cluster: "two local clusters",
		Machine: Machine{CPUs: 2, OS: "linux/amd64", GoVersion: "go1.26"}, PayloadBytes: 128, Trials: 3,
		Scenarios: []*Result{}, Targets: []Target{},
		Telemetry: &TelemetryOverhead{
			Off: telemetryOffNote, On: telemetryOnNote, MaxRatio: OverheadTarget,
			Scenarios: []*OverheadResult{
				{Scenario: Direct, PathOff: "broker-1 -> broker-1", PathOn: "broker-2 -> broker-2", Count: 6000,
					P50Off: 1000, P50On: 1020, P99Off: 2000, P99On: 2100, RatioP50: 1.02,
					TrialP50Off: []float64{990, 1000, 1010}, TrialP50On: []float64{1000, 1020, 1030},
					TrialRatios: []float64{1.01, 1.02, 1.02}, RatioSpreadPct: 1, WithinTarget: true},
				{Scenario: Forwarded, PathOff: "broker-0 -> broker-1", PathOn: "broker-0 -> broker-2", Count: 6000,
					P50Off: 1500, P50On: 1650, P99Off: 3000, P99On: 3300, RatioP50: 1.1,
					TrialP50Off: []float64{1500}, TrialP50On: []float64{1650},
					TrialRatios: []float64{1.1}, WithinTarget: false},
			},
		},
		Notes: []string{"the brokers ran with GOMAXPROCS=1 (2 CPUs)"},
	}
}

// TestOverheadTable: the table of a --telemetry run has the comparison,
// what off and on mean and the notes, and no floors.
func TestOverheadTable(t *testing.T) {
	var b bytes.Buffer
	if err := overheadReport().writeTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"Felix bench: two local clusters, 128-byte records, 3 trials",
		"telemetry overhead:", "target: on p50 <= 1.05 x off p50",
		"P50 OFF", "ON/OFF",
		"1.020", "1.010 1.020 1.020", "met",
		"1.100", "MISSED",
		"off: brokers with OTEL_TRACES_EXPORTER=none", "on: brokers with OTEL_TRACES_EXPORTER=discard",
		"note: the brokers ran with GOMAXPROCS=1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for _, unwanted := range []string{"floors", "SCENARIO  COUNT  P50  P90", "targets:"} {
		if strings.Contains(out, unwanted) {
			t.Errorf("table has %q:\n%s", unwanted, out)
		}
	}
	var direct string
	for line := range strings.Lines(out) {
		if strings.HasPrefix(strings.TrimSpace(line), Direct) {
			direct = line
		}
	}
	for _, want := range []string{"6000", "1.00ms", "1.02ms", "2.00ms", "2.10ms", "1.0%"} {
		if !strings.Contains(direct, want) {
			t.Errorf("direct line lacks %q: %q", want, direct)
		}
	}
}

// TestOverheadJSON: the JSON of a --telemetry run carries the comparison
// under telemetry_overhead, and a normal report has no such key.
func TestOverheadJSON(t *testing.T) {
	var b bytes.Buffer
	if err := overheadReport().writeJSON(&b); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Machine   map[string]any `json:"machine"`
		Started   string         `json:"started"`
		Duration  float64        `json:"duration_s"`
		Scenarios []any          `json:"scenarios"`
		Telemetry *struct {
			Off, On   string
			MaxRatio  float64          `json:"max_ratio"`
			Scenarios []map[string]any `json:"scenarios"`
		} `json:"telemetry_overhead"`
	}
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, b.String())
	}
	if doc.Machine["cpus"] != 2.0 || doc.Started == "" || doc.Duration != 12.5 || doc.Scenarios == nil {
		t.Errorf("report fields: %s", b.String())
	}
	ov := doc.Telemetry
	if ov == nil || ov.MaxRatio != 1.05 || !strings.Contains(ov.On, "discard") || !strings.Contains(ov.Off, "none") || len(ov.Scenarios) != 2 {
		t.Fatalf("telemetry_overhead: %s", b.String())
	}
	d := ov.Scenarios[0]
	for k, want := range map[string]any{
		"scenario": "direct", "path_off": "broker-1 -> broker-1", "count": 6000.0,
		"p50_off_us": 1000.0, "p50_on_us": 1020.0, "p99_off_us": 2000.0, "p99_on_us": 2100.0,
		"ratio_p50": 1.02, "ratio_spread_pct": 1.0, "within_target": true,
	} {
		if d[k] != want {
			t.Errorf("direct %s = %v, want %v", k, d[k], want)
		}
	}
	if r, _ := d["trial_ratios"].([]any); len(r) != 3 {
		t.Errorf("direct trial_ratios = %v", d["trial_ratios"])
	}
	if ov.Scenarios[1]["within_target"] != false {
		t.Errorf("forwarded within_target = %v", ov.Scenarios[1]["within_target"])
	}

	b.Reset()
	if err := (&Report{}).writeJSON(&b); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "telemetry") {
		t.Errorf("a report without --telemetry mentions it:\n%s", b.String())
	}
}

func TestOverheadRatio(t *testing.T) {
	for _, tc := range []struct{ a, b, want float64 }{
		{1020, 1000, 1.02},
		{1000, 1000, 1},
		{1, 3, 0.333},
		{2, 3, 0.667},
		{5, 0, 0},
	} {
		if got := ratio3(tc.a, tc.b); got != tc.want {
			t.Errorf("ratio3(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

// TestTelemetryFlags: --telemetry parses with --local and is refused
// without it, with --plot, or with neither direct nor forwarded.
func TestTelemetryFlags(t *testing.T) {
	var cli struct {
		Bench Command `cmd:""`
	}
	p, err := kong.New(&cli, kong.Exit(func(int) { t.Fatal("kong exited") }))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Parse([]string{"bench", "--local", "--telemetry", "--size", "1"}); err != nil {
		t.Fatal(err)
	}
	if c := cli.Bench; !c.Telemetry || !slices.Equal(c.telemetryScenarios(), []string{Direct, Forwarded}) {
		t.Errorf("parsed %+v, compares %v", c, c.telemetryScenarios())
	}
	if _, err := p.Parse([]string{"bench", "--local", "--telemetry", "--scenarios", "forwarded,e2e"}); err != nil {
		t.Fatal(err)
	}
	if got := cli.Bench.telemetryScenarios(); !slices.Equal(got, []string{Forwarded}) {
		t.Errorf("--scenarios forwarded,e2e: compares %v", got)
	}
	for _, bad := range [][]string{
		{"bench", "--broker", "a:1", "--ca", "ca.crt", "--telemetry"},
		{"bench", "--local", "--telemetry", "--plot", "x.svg"},
		{"bench", "--local", "--telemetry", "--scenarios", "e2e,fanout"},
	} {
		if _, err := p.Parse(bad); err == nil {
			t.Errorf("%v: parsed", bad)
		}
	}
}

// TestLocalTelemetry runs --telemetry end to end, small: two local
// clusters of broker processes, direct and forwarded on both. It checks
// what the report holds, not what the ratio is: timing is the machine's.
func TestLocalTelemetry(t *testing.T) {
	c := &Command{
		Local: true, Telemetry: true, Binary: felixBinary, Brokers: 3, Dir: t.TempDir(),
		Scenarios: Scenarios, Size: 128, Trials: 1, Count: 50, Warmup: 10,
		Publishers: 1, Window: 1, FloorCount: 1, JSON: true,
	}
	rep, out := execute(t, c, 90*time.Second)

	var doc Report
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatalf("the report is not JSON: %v\n%s", err, out.String())
	}
	if doc.Machine.CPUs <= 0 || doc.Cluster == "" || doc.Started.IsZero() || doc.DurationSec <= 0 || len(doc.Scenarios) != 0 {
		t.Errorf("report: machine %+v, cluster %q, started %v, duration %v, %d scenarios",
			doc.Machine, doc.Cluster, doc.Started, doc.DurationSec, len(doc.Scenarios))
	}
	ov := doc.Telemetry
	if ov == nil {
		t.Fatalf("no telemetry_overhead:\n%s", out.String())
	}
	var got []string
	for _, r := range ov.Scenarios {
		got = append(got, r.Scenario)
		if r.Count != int64(c.Trials*c.Count) {
			t.Errorf("%s: count %d, want %d", r.Scenario, r.Count, c.Trials*c.Count)
		}
		if !(r.P50Off > 0 && r.P50On > 0 && r.P50Off <= r.P99Off && r.P50On <= r.P99On) {
			t.Errorf("%s: p50 off %v on %v, p99 off %v on %v", r.Scenario, r.P50Off, r.P50On, r.P99Off, r.P99On)
		}
		if r.RatioP50 <= 0 || len(r.TrialRatios) != c.Trials || r.TrialRatios[0] <= 0 {
			t.Errorf("%s: ratio %v, trial ratios %v", r.Scenario, r.RatioP50, r.TrialRatios)
		}
		if r.PathOff == "" || r.PathOff != r.PathOn {
			t.Errorf("%s: paths %q off and %q on, want the same one", r.Scenario, r.PathOff, r.PathOn)
		}
	}
	if !slices.Equal(got, []string{Direct, Forwarded}) {
		t.Errorf("scenarios %v, want direct and forwarded", got)
	}

	var table bytes.Buffer
	if err := rep.writeTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"telemetry overhead", "direct", "forwarded", "on: brokers with OTEL_TRACES_EXPORTER=discard"} {
		if !strings.Contains(table.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, table.String())
		}
	}
}
