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

// abReport is an --ab report as Execute makes it.
func abReport() *Report {
	return &Report{
		Started: time.Unix(1700000000, 0).UTC(), DurationSec: 20, Cluster: "two local clusters",
		Machine: Machine{CPUs: 2, OS: "linux/amd64", GoVersion: "go1.26"}, PayloadBytes: 128, Trials: 3,
		Scenarios: []*Result{}, Targets: []Target{},
		AB: &ABComparison{
			A: "this build: /bin/felixctl", B: "felixctl built from HEAD~1 (abc)",
			Scenarios: []*ABResult{
				{Scenario: Direct, Mode: ModeClosed, PathA: "broker-1 -> broker-1", PathB: "broker-1 -> broker-1", Count: 6000,
					P50A: 500, P50B: 600, P99A: 1000, P99B: 1500, RatioP50: 1.2, RatioP99: 1.5,
					TrialRatiosP50: []float64{1.1, 1.2, 1.3}, TrialRatiosP99: []float64{1.4, 1.5, 1.6}, RatioP50SpreadPct: 16.7},
				{Scenario: Throughput, Mode: ModePipelined, Count: 300000, P50A: 20000, P50B: 25000, P99A: 50000, P99B: 60000,
					RatioP50: 1.25, RatioP99: 1.2, ThroughputA: 100000, ThroughputB: 80000, RatioThroughput: 0.8,
					TrialRatiosThroughput: []float64{0.79, 0.8, 0.81}, RatioThroughputSpreadPct: 2.5},
			},
		},
	}
}

// TestABTable: the table of an --ab run has one line per scenario with A,
// B and B/A, throughput's rates, and what A and B run; no floors.
func TestABTable(t *testing.T) {
	var b bytes.Buffer
	if err := abReport().writeTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"A/B: two builds side by side", "every ratio is B/A",
		"P50 A", "MSG/S B", "TRIAL B/A",
		"A: this build: /bin/felixctl", "B: felixctl built from HEAD~1 (abc)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "floors") {
		t.Errorf("table has floors:\n%s", out)
	}
	lines := map[string]string{}
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) > 0 {
			lines[f[0]] = line
		}
	}
	for scenario, wants := range map[string][]string{
		Direct:     {"6000", "500µs", "600µs", "1.200", "1.500", "1.100 1.200 1.300", "16.7%"},
		Throughput: {"100000", "80000", "0.800", "0.790 0.800 0.810", "2.5%"},
	} {
		for _, want := range wants {
			if !strings.Contains(lines[scenario], want) {
				t.Errorf("%s line lacks %q: %q", scenario, want, lines[scenario])
			}
		}
	}
}

// TestABJSON: the JSON of an --ab run carries the comparison under "ab".
func TestABJSON(t *testing.T) {
	var b bytes.Buffer
	if err := abReport().writeJSON(&b); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		AB *struct {
			A, B      string
			Scenarios []map[string]any `json:"scenarios"`
		} `json:"ab"`
	}
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.AB == nil || len(doc.AB.Scenarios) != 2 || doc.AB.B == "" {
		t.Fatalf("ab: %s", b.String())
	}
	d, tp := doc.AB.Scenarios[0], doc.AB.Scenarios[1]
	for k, want := range map[string]any{"scenario": "direct", "p50_a_us": 500.0, "p50_b_us": 600.0, "ratio_p50": 1.2, "ratio_p99": 1.5} {
		if d[k] != want {
			t.Errorf("direct %s = %v, want %v", k, d[k], want)
		}
	}
	if _, ok := d["throughput_a_msgs_per_s"]; ok {
		t.Errorf("direct has a throughput: %v", d)
	}
	if tp["ratio_throughput"] != 0.8 || tp["throughput_b_msgs_per_s"] != 80000.0 {
		t.Errorf("throughput: %v", tp)
	}
	b.Reset()
	if err := (&Report{}).writeJSON(&b); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), `"ab"`) || strings.Contains(b.String(), "shard_sweep") {
		t.Errorf("a plain report has an ab or shard_sweep key:\n%s", b.String())
	}
}

// TestABFlags: --ab parses with --local and is refused without it, with
// --telemetry, with --ab-rev, with --plot, or with nothing to compare.
func TestABFlags(t *testing.T) {
	var cli struct {
		Bench Command `cmd:""`
	}
	p, err := kong.New(&cli, kong.Exit(func(int) { t.Fatal("kong exited") }))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Parse([]string{"bench", "--local", "--ab", felixBinary}); err != nil {
		t.Fatal(err)
	}
	if got := cli.Bench.abScenarios(); !slices.Equal(got, []string{Direct, Forwarded, Throughput}) {
		t.Errorf("compares %v", got)
	}
	if _, err := p.Parse([]string{"bench", "--local", "--ab-rev", "HEAD~1", "--scenarios", "direct"}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]string{
		{"bench", "--broker", "a:1", "--ca", "ca.crt", "--ab", felixBinary},
		{"bench", "--local", "--ab", felixBinary, "--telemetry"},
		{"bench", "--local", "--ab", felixBinary, "--ab-rev", "HEAD"},
		{"bench", "--local", "--ab", felixBinary, "--plot", "x.svg"},
		{"bench", "--local", "--ab", felixBinary, "--scenarios", "e2e,fanout"},
		{"bench", "--local", "--ab", "/nonexistent/felix"},
		{"bench", "--local", "--shards", "6,0"},
		{"bench", "--local", "--load", "50,-1"},
		{"bench", "--local", "--replicas", "2"},
		{"bench", "--local", "--replicas", "3", "--brokers", "2"},
	} {
		if _, err := p.Parse(bad); err == nil {
			t.Errorf("%v: parsed", bad)
		}
	}
	if _, err := p.Parse([]string{"bench", "--local", "--shards", "6,96,768", "--load", ""}); err != nil {
		t.Fatal(err)
	}
	if c := cli.Bench; !slices.Equal(c.Shards, []int{6, 96, 768}) || len(c.Load) != 0 {
		t.Errorf("--shards %v --load %v", c.Shards, c.Load)
	}
	if _, err := p.Parse([]string{"bench", "--local", "--replicas", "3"}); err != nil || cli.Bench.settings().replicas != 3 {
		t.Errorf("--replicas 3: %v, replicas %d", err, cli.Bench.settings().replicas)
	}
}

// TestLocalAB runs --ab end to end, small: two local clusters (here both
// of the build under test), direct and throughput. It checks what the
// report holds, not what the ratios are.
func TestLocalAB(t *testing.T) {
	c := &Command{
		Local: true, AB: felixBinary, Binary: felixBinary, Brokers: 3, Dir: t.TempDir(),
		Scenarios: []string{Direct, Throughput}, Size: 128, Trials: 2, Count: 50, Warmup: 10,
		Publishers: 6, Window: 4, Duration: 300 * time.Millisecond, TPWarmup: 100 * time.Millisecond,
		FloorCount: 1, JSON: true,
	}
	rep, out := execute(t, c, 90*time.Second)
	var doc Report
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatalf("the report is not JSON: %v\n%s", err, out.String())
	}
	if doc.AB == nil || len(doc.AB.Scenarios) != 2 {
		t.Fatalf("ab: %s", out.String())
	}
	d, tp := doc.AB.Scenarios[0], doc.AB.Scenarios[1]
	if d.Scenario != Direct || d.Count != int64(c.Trials*c.Count) || d.P50A <= 0 || d.P50B <= 0 || d.RatioP50 <= 0 ||
		len(d.TrialRatiosP50) != c.Trials || d.PathA != d.PathB {
		t.Errorf("direct: %+v", d)
	}
	if tp.Scenario != Throughput || tp.ThroughputA <= 0 || tp.ThroughputB <= 0 || tp.RatioThroughput <= 0 ||
		len(tp.TrialRatiosThroughput) != c.Trials {
		t.Errorf("throughput: %+v", tp)
	}
	var table bytes.Buffer
	if err := rep.writeTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "A/B: two builds") {
		t.Errorf("table:\n%s", table.String())
	}
}
