package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/sysmon"
)

// tinyLocal is a --local run of every scenario small enough for a test.
func tinyLocal(t *testing.T) *Command {
	return &Command{
		Local: true, Binary: felixBinary, Brokers: 3, Dir: t.TempDir(),
		Scenarios: Scenarios, Size: 128, Trials: 2, Count: 30, Warmup: 5,
		Rate: 400, OpenDuration: 150 * time.Millisecond,
		Publishers: 6, Window: 4, Duration: 400 * time.Millisecond, TPWarmup: 100 * time.Millisecond,
		Shards: []int{6, 12}, Load: []float64{50}, LoadDuration: 200 * time.Millisecond,
		Subscribers: 3, FloorCount: 60,
		JSON: true, Plot: filepath.Join(t.TempDir(), "latency.svg"),
	}
}

// TestLocalEveryScenario runs every scenario against a local cluster
// and checks the JSON report a user would read.
func TestLocalEveryScenario(t *testing.T) {
	c := tinyLocal(t)
	rep, out := execute(t, c, 50*time.Second)
	var doc struct {
		Floors     map[string]any   `json:"floors"`
		Scenarios  []map[string]any `json:"scenarios"`
		Targets    []map[string]any `json:"targets"`
		ShardSweep []map[string]any `json:"shard_sweep"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatalf("the report is not JSON: %v\n%s", err, out.String())
	}
	num := func(s map[string]any, k string) float64 {
		t.Helper()
		v, ok := s[k]
		if !ok {
			t.Fatalf("%v %v: no %q", s["scenario"], s["mode"], k)
		}
		f, ok := v.(float64)
		if !ok {
			t.Fatalf("%v %v: %q is %v, not a number", s["scenario"], s["mode"], k, v)
		}
		return f
	}

	openN := int(float64(c.Rate) * c.OpenDuration.Seconds())
	want := map[string]float64{ // scenario/mode -> count
		"direct/closed":        float64(c.Trials * c.Count),
		"direct/open":          float64(c.Trials * openN),
		"forwarded/closed":     float64(c.Trials * c.Count),
		"forwarded/open":       float64(c.Trials * openN),
		"e2e/closed":           float64(c.Trials * c.Count),
		"throughput/pipelined": -1, // depends on the machine
		"load/open":            -1,
		"fanout/closed":        float64(c.Trials * c.Count * c.Subscribers),
	}
	seen := map[string]bool{}
	for _, s := range doc.Scenarios {
		key := s["scenario"].(string) + "/" + s["mode"].(string)
		seen[key] = true
		wantCount, ok := want[key]
		if !ok {
			t.Errorf("unexpected scenario %s", key)
			continue
		}
		for _, k := range []string{"count", "payload_bytes", "p50_us", "p90_us", "p99_us", "p999_us", "max_us",
			"throughput_msgs_per_s", "records_per_fsync", "fsync_p50_us", "fsync_p99_us", "rtt_p50_us", "rtt_p99_us"} {
			num(s, k)
		}
		count := num(s, "count")
		if wantCount >= 0 && count != wantCount {
			t.Errorf("%s: count %v, want %v", key, count, wantCount)
		}
		if count <= 0 {
			t.Errorf("%s: count %v", key, count)
		}
		if num(s, "payload_bytes") != float64(c.Size) {
			t.Errorf("%s: payload_bytes %v", key, s["payload_bytes"])
		}
		p50, p90, p99, p999, mx := num(s, "p50_us"), num(s, "p90_us"), num(s, "p99_us"), num(s, "p999_us"), num(s, "max_us")
		if !(0 < p50 && p50 <= p90 && p90 <= p99 && p99 <= p999 && p999 <= mx) {
			t.Errorf("%s: percentiles out of order: p50 %v p90 %v p99 %v p99.9 %v max %v", key, p50, p90, p99, p999, mx)
		}
		if num(s, "throughput_msgs_per_s") <= 0 {
			t.Errorf("%s: throughput %v", key, s["throughput_msgs_per_s"])
		}
		if rpf := num(s, "records_per_fsync"); rpf < 1 {
			t.Errorf("%s: records_per_fsync %v < 1", key, rpf)
		}
		for _, k := range []string{"fsync_p50_us", "fsync_p99_us", "rtt_p50_us", "rtt_p99_us"} {
			if num(s, k) <= 0 {
				t.Errorf("%s: floor %s = %v", key, k, s[k])
			}
		}
		if num(s, "fsync_p50_us") > num(s, "fsync_p99_us") || num(s, "rtt_p50_us") > num(s, "rtt_p99_us") {
			t.Errorf("%s: floor percentiles out of order", key)
		}
		if got := num(s, "p50_floor_ratio"); got <= 0 {
			t.Errorf("%s: p50_floor_ratio %v", key, got)
		}
		switch key {
		case "direct/open", "forwarded/open":
			if num(s, "generator_lag_p99_us") < 0 || num(s, "send_wait_p99_us") < 0 || num(s, "rate_per_s") != float64(c.Rate) {
				t.Errorf("%s: open-loop fields %v %v %v", key, s["generator_lag_p99_us"], s["send_wait_p99_us"], s["rate_per_s"])
			}
		}
		if s["mode"] == ModeOpen {
			// Nothing excused: at least the row's own figures, which
			// excuse the generator's lag.
			if num(s, "from_intended_p50_us") < p50 || num(s, "from_intended_p99_us") < p99 {
				t.Errorf("%s: from the intended send time p50 %v p99 %v, below the row's %v %v", key, s["from_intended_p50_us"], s["from_intended_p99_us"], p50, p99)
			}
		}
		switch key {
		case "load/open", "throughput/pipelined":
			// Every record left in a QUIC packet: the counts come from the
			// bench's connections over the row, not from zero values.
			if sent, lost := num(s, "quic_packets_sent"), num(s, "quic_packets_lost"); sent < num(s, "count")/64 || lost < 0 || lost > sent {
				t.Errorf("%s: QUIC packets sent %v lost %v for %v records", key, s["quic_packets_sent"], s["quic_packets_lost"], s["count"])
			}
		}
		switch key {
		case "load/open":
			if num(s, "load_pct") != 50 || num(s, "rate_per_s") < 1 || num(s, "generator_lag_p99_us") < 0 || num(s, "shards") != 6 {
				t.Errorf("load: fields %v %v %v %v", s["load_pct"], s["rate_per_s"], s["generator_lag_p99_us"], s["shards"])
			}
			if num(s, "broker_cpu_pct") <= 0 || num(s, "client_cpu_pct") <= 0 || num(s, "machine_cpu_pct") < 0.8*num(s, "broker_cpu_pct") {
				t.Errorf("load: usage brokers %v bench %v machine %v", s["broker_cpu_pct"], s["client_cpu_pct"], s["machine_cpu_pct"])
			}
		case "throughput/pipelined":
			if num(s, "broker_cpu_pct") <= 0 || num(s, "broker_rss_mib") <= 0 || num(s, "broker_peak_rss_mib") < num(s, "broker_rss_mib") {
				t.Errorf("throughput: broker usage cpu %v rss %v peak %v", s["broker_cpu_pct"], s["broker_rss_mib"], s["broker_peak_rss_mib"])
			}
			if procs, _ := s["processes"].([]any); len(procs) != 2+c.Brokers {
				t.Errorf("throughput: %d usages, want the bench's, %d brokers' and the machine's", len(procs), c.Brokers)
			}
			// The machine's busy time holds the brokers' (with slack
			// for the clock ticks both are counted in).
			if num(s, "machine_cpu_pct") < 0.8*num(s, "broker_cpu_pct") {
				t.Errorf("throughput: the machine's CPUs %v%% busy, less than the brokers' %v%%", s["machine_cpu_pct"], s["broker_cpu_pct"])
			}
			if num(s, "wal_records_per_fsync") < 1 {
				t.Errorf("throughput: wal_records_per_fsync %v", s["wal_records_per_fsync"])
			}
			// The brokers' own fsync time over the row: a real
			// fdatasync, never zero.
			if num(s, "wal_fsync_mean_us") <= 0 {
				t.Errorf("throughput: wal_fsync_mean_us %v", s["wal_fsync_mean_us"])
			}
			num(s, "idle_shard_kib")
			num(s, "open_shard_kib")
		case "direct/closed", "forwarded/closed":
			// One record in flight on a shard nobody else writes: one
			// fsync each.
			if rpf := num(s, "records_per_fsync"); rpf != 1 {
				t.Errorf("%s: records_per_fsync %v, want 1 with one record in flight", key, rpf)
			}
		}
	}
	for k := range want {
		if !seen[k] {
			t.Errorf("no result for %s", k)
		}
	}
	// Light load against a lone record: the open-loop row runs on the
	// closed loop's stream, shard and owner (it had a stream of its own,
	// whose owner could be another broker).
	streams := map[string]any{}
	for _, s := range doc.Scenarios {
		streams[s["scenario"].(string)+"/"+s["mode"].(string)] = s["stream"]
	}
	for _, sc := range []string{Direct, Forwarded} {
		if st := streams[sc+"/closed"]; st == nil || st == "" || streams[sc+"/open"] != st {
			t.Errorf("%s: closed loop on stream %v, open loop on %v: want the same", sc, st, streams[sc+"/open"])
		}
	}
	if doc.Floors["target_fsync"] != "fsync_prealloc" {
		t.Errorf("target_fsync %v, want fsync_prealloc (measured)", doc.Floors["target_fsync"])
	}
	for _, k := range []string{"fsync", "fsync_prealloc", "fsync_idle", "rtt", "rtt_idle"} {
		p, _ := doc.Floors[k].(map[string]any)
		if p == nil || p["count"].(float64) != float64(c.FloorCount) || p["p50_us"].(float64) <= 0 {
			t.Errorf("floor %s: %v", k, doc.Floors[k])
		}
	}
	if gap := doc.Floors["rtt_idle_gap_us"]; gap != 1e6/float64(c.Rate) {
		t.Errorf("floor rtt_idle_gap_us %v, want the open-loop rate's gap %v", gap, 1e6/float64(c.Rate))
	}
	// direct p50 and p99, forwarded hop, e2e, throughput, broker RSS,
	// light load, load 50% and the shards sweep.
	if len(doc.Targets) != 9 {
		t.Errorf("%d targets checked, want 9: %v", len(doc.Targets), doc.Targets)
	}
	// The brokers re-executed themselves with sysmon kept awake (package
	// sysmon), and the report says so from a broker's environment.
	if !sysmon.Configured(os.Getenv("GODEBUG")) &&
		!slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "GODEBUG="+sysmon.Setting) }) {
		t.Errorf("notes %q: none says the brokers ran with GODEBUG=%s", rep.Notes, sysmon.Setting)
	}
	if len(doc.ShardSweep) != 2 || doc.ShardSweep[0]["shards"] != 6.0 || doc.ShardSweep[1]["shards"] != 12.0 || doc.ShardSweep[0]["ratio_to_fewest"] != 1.0 {
		t.Errorf("shard sweep %v", doc.ShardSweep)
	}

	// The plot, in both formats.
	checkFile(t, c.Plot, "<?xml")
	png := filepath.Join(t.TempDir(), "latency.png")
	if err := writePlot(png, rep); err != nil {
		t.Fatal(err)
	}
	checkFile(t, png, "\x89PNG")

	// The table reads.
	var table bytes.Buffer
	if err := rep.writeTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"floors (same run)", "direct open 400/s", "throughput 6x4 (6 shards)", "throughput 6x4 (12 shards)",
		"load 50%", "generator lag (not charged)", "with nothing excused", "shards sweep:", "IDLE/SHARD", "fanout x3", "targets:"} {
		if !strings.Contains(table.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, table.String())
		}
	}
}

func checkFile(t *testing.T, path, prefix string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 1000 || !strings.HasPrefix(string(b), prefix) {
		t.Errorf("%s: %d bytes starting %q, want a %q file", path, len(b), b[:min(len(b), 16)], prefix)
	}
}

// execute runs c within timeout and returns its report and what it wrote.
func execute(t *testing.T, c *Command, timeout time.Duration) (*Report, *bytes.Buffer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out bytes.Buffer
	rep, err := c.Execute(ctx, slog.New(slog.DiscardHandler), &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("bench ran %.1fs", rep.DurationSec)
	return rep, &out
}
