package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Report is the outcome of one bench run: the machine, its floors and
// every scenario, each latency next to the floors measured in the same run.
type Report struct {
	Started      time.Time `json:"started"`
	DurationSec  float64   `json:"duration_s"`
	Machine      Machine   `json:"machine"`
	Cluster      string    `json:"cluster"`
	PayloadBytes int       `json:"payload_bytes"`
	Trials       int       `json:"trials"`
	Floors       Floors    `json:"floors,omitzero"` // zero (and left out) in a --telemetry report
	Scenarios    []*Result `json:"scenarios"`
	Targets      []Target  `json:"targets"`
	Notes        []string  `json:"notes,omitempty"`

	// ShardSweep is the throughput scenario over each shard count of
	// --shards, when it names more than one.
	ShardSweep []*ShardStep `json:"shard_sweep,omitempty"`

	// Telemetry is what --telemetry measured; that mode runs nothing else.
	Telemetry *TelemetryOverhead `json:"telemetry_overhead,omitempty"`
	// AB is what --ab measured; that mode runs nothing else.
	AB *ABComparison `json:"ab,omitempty"`
}

// Machine describes where the run happened.
type Machine struct {
	CPUs     int    `json:"cpus"`
	CPUModel string `json:"cpu_model,omitempty"`
	Kernel   string `json:"kernel,omitempty"`
	// CPUIdle is how an idle CPU waits (Linux cpuidle driver and, for a
	// guest's haltpoll driver, how long it polls before halting): it sets
	// what waking an idle CPU costs, which every light-load figure pays.
	CPUIdle   string `json:"cpu_idle,omitempty"`
	OS        string `json:"os"`
	GoVersion string `json:"go"`
}

func thisMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, GoVersion: runtime.Version(), CPUIdle: cpuIdle(readTrimmed)}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

// cpuIdle describes Linux's cpuidle driver and governor, and for the
// haltpoll driver (a virtual machine's) its guest_halt_poll_ns: with 0 an
// idle vCPU halts at once and its next wake-up is a VM exit. Empty where
// the files do not exist. read returns a file's trimmed text, "" if it
// cannot.
func cpuIdle(read func(path string) string) string {
	const dir = "/sys/devices/system/cpu/cpuidle/"
	driver := read(dir + "current_driver")
	if driver == "" {
		return ""
	}
	s := "cpuidle " + driver
	if g := read(dir + "current_governor_ro"); g != "" {
		s += ", governor " + g
	}
	if ns := read("/sys/module/haltpoll/parameters/guest_halt_poll_ns"); ns != "" && driver == "haltpoll" {
		s += ", guest_halt_poll_ns " + ns
	}
	return s
}

// readTrimmed returns the file's text without surrounding space, or "".
func readTrimmed(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Result is one scenario in one mode. Percentiles are the median over the
// trials, Max the largest latency of any trial, Count the latencies
// measured over all trials (acks; for e2e and fanout, deliveries: one per
// record and subscriber).
type Result struct {
	Scenario string `json:"scenario"`
	Mode     string `json:"mode"`
	Path     string `json:"path"`
	// Stream is the bench stream of a direct or forwarded row: its closed
	// and open-loop rows share it (one shard, one owner).
	Stream       string  `json:"stream,omitempty"`
	Count        int64   `json:"count"`
	PayloadBytes int     `json:"payload_bytes"`
	P50          float64 `json:"p50_us"`
	P90          float64 `json:"p90_us"`
	P99          float64 `json:"p99_us"`
	P999         float64 `json:"p999_us"`
	Max          float64 `json:"max_us"`
	// ThroughputMsgsPerS is acks (deliveries for e2e and fanout) per
	// second of the measured part, median over the trials.
	ThroughputMsgsPerS float64 `json:"throughput_msgs_per_s"`
	// RecordsPerFsync is derived from the acks' commit timestamps (see
	// the package doc); null when no ack was seen.
	RecordsPerFsync *float64 `json:"records_per_fsync"`

	// The floors of the run, repeated so each scenario reads on its own,
	// and the latency as a ratio to them. The fsync floor is the one the
	// targets use (Floors.TargetFsync: over preallocated zeros when
	// measured).
	FsyncP50      float64 `json:"fsync_p50_us"`
	FsyncP99      float64 `json:"fsync_p99_us"`
	RTTP50        float64 `json:"rtt_p50_us"`
	RTTP99        float64 `json:"rtt_p99_us"`
	P50FloorRatio float64 `json:"p50_floor_ratio"` // p50 / (fsync p50 + RTT p50)
	P99FloorRatio float64 `json:"p99_floor_ratio"` // p99 / (fsync p99 + RTT p99)

	Trials           int       `json:"trials"`
	TrialP50         []float64 `json:"trial_p50_us"`
	TrialP99         []float64 `json:"trial_p99_us"`
	TrialThroughput  []float64 `json:"trial_throughput_msgs_per_s"`
	P50SpreadPct     float64   `json:"p50_spread_pct"` // (max - min) / median of the trials' p50
	P99SpreadPct     float64   `json:"p99_spread_pct"`
	ThroughputSpread float64   `json:"throughput_spread_pct"`
	RatePerSec       int       `json:"rate_per_s,omitempty"`           // open loop: the intended rate
	LoadPct          float64   `json:"load_pct,omitempty"`             // load: the rate as a percentage of the throughput row's msg/s
	GeneratorLagP50  *float64  `json:"generator_lag_p50_us,omitempty"` // open loop: the generator's timer overshoot past the intended send, not charged
	GeneratorLagP99  *float64  `json:"generator_lag_p99_us,omitempty"` // open loop
	SendWaitP50      *float64  `json:"send_wait_p50_us,omitempty"`     // open loop: from due to the send (a full window, the burst before it), charged
	SendWaitP99      *float64  `json:"send_wait_p99_us,omitempty"`     // open loop
	UncorrectedP50   *float64  `json:"uncorrected_p50_us,omitempty"`   // open loop: from the actual send
	UncorrectedP99   *float64  `json:"uncorrected_p99_us,omitempty"`   // open loop
	// FromIntended is an open-loop row's percentiles measured from each
	// record's intended send time with nothing excused, the generator's
	// lag included; the median over the trials, as P50 to P999 are. The
	// row's own figures (and the targets) excuse the generator's timer
	// overshoot (issue 13), but under load that lag also holds the
	// generator waiting for CPUs the brokers hold, so a stall that
	// delays the generator's wake-up is hidden there (coordinated
	// omission) and shows here.
	FromIntendedP50  *float64       `json:"from_intended_p50_us,omitempty"`
	FromIntendedP90  *float64       `json:"from_intended_p90_us,omitempty"`
	FromIntendedP99  *float64       `json:"from_intended_p99_us,omitempty"`
	FromIntendedP999 *float64       `json:"from_intended_p999_us,omitempty"`
	ToBatchP50       *float64       `json:"to_batch_p50_us,omitempty"`     // open loop, local cluster: from due to the owner's stamp on the record's batch (before its write and fsync)
	ToBatchP99       *float64       `json:"to_batch_p99_us,omitempty"`     // open loop, local cluster
	FromBatchP50     *float64       `json:"from_batch_p50_us,omitempty"`   // open loop, local cluster: from that stamp to the ack in the client (write, fsync, the way back)
	FromBatchP99     *float64       `json:"from_batch_p99_us,omitempty"`   // open loop, local cluster
	Publishers       int            `json:"publishers,omitempty"`          // throughput, load
	Window           int            `json:"window,omitempty"`              // throughput: records in flight per publisher
	Shards           int            `json:"shards,omitempty"`              // throughput, load
	ShardsPerBroker  map[string]int `json:"shards_per_broker,omitempty"`   // throughput: shards whose owner (R=3: first replica, the leader the bench waits for) each broker is; bench streams are named so that placement spreads them evenly (balancedName)
	Replicas         int            `json:"replicas,omitempty"`            // the bench stream's replication factor when not 1
	Subscribers      int            `json:"subscribers,omitempty"`         // e2e, fanout
	BrokerCPUPct     *float64       `json:"broker_cpu_pct,omitempty"`      // throughput, load: all brokers, % of one core
	MachineCPUPct    *float64       `json:"machine_cpu_pct,omitempty"`     // throughput, load: every CPU's busy time, % of one core
	BrokerRSSMiB     *float64       `json:"broker_rss_mib,omitempty"`      // throughput: largest broker RSS at the end
	BrokerPeakRSSMiB *float64       `json:"broker_peak_rss_mib,omitempty"` // throughput, load: largest broker peak RSS during the row's measured windows (VmHWM, reset at each one's start)
	// BrokerPeakRSSLifetime says a broker's peak RSS could not be reset
	// (resetPeakRSS): BrokerPeakRSSMiB is then over the broker's life so
	// far, earlier rows included.
	BrokerPeakRSSLifetime bool     `json:"broker_peak_rss_lifetime,omitempty"`
	ClientCPUPct          *float64 `json:"client_cpu_pct,omitempty"` // throughput, load: this process
	// QUICPacketsSent and QUICPacketsLost are the packets the bench's QUIC
	// connections sent to the brokers over the row's trials (throughput:
	// the measured part; load: warm-up included), and those quic-go
	// declared lost and sent again (client.ConnStats): on loopback, a
	// broker that fell 256 packets behind reading its connection.
	QUICPacketsSent *uint64 `json:"quic_packets_sent,omitempty"` // throughput, load
	QUICPacketsLost *uint64 `json:"quic_packets_lost,omitempty"` // throughput, load
	// BrokerCPUPerRecord is the brokers' CPU time (user and system, all
	// of them) per acked record, in µs: what a record costs the brokers
	// when the CPUs are what bounds throughput. MachineCPUPerRecord is
	// every CPU's busy time per acked record (the bench's publishers
	// too). Throughput only; medians over the trials.
	BrokerCPUPerRecord  *float64    `json:"broker_cpu_us_per_record,omitempty"`
	MachineCPUPerRecord *float64    `json:"machine_cpu_us_per_record,omitempty"`
	Processes           []ProcUsage `json:"processes,omitempty"` // throughput, load: last trial, per process and the machine
	// WALRecordsPerFsync is records per fsync as the brokers count them
	// (felix_wal_batch_records over the measured part, all brokers): unlike
	// RecordsPerFsync it sees a commit shared by several shards, and other
	// traffic; at replication factor 3 it averages every replica's
	// fdatasyncs, the followers' too. Throughput only; absent when
	// /metrics cannot be scraped.
	WALRecordsPerFsync *float64 `json:"wal_records_per_fsync,omitempty"`
	// WALFsyncMeanUS is how long the brokers' writes and fdatasyncs of
	// their shard logs and replicas took on average over the measured
	// part, in µs (felix_wal_fsync_duration_seconds, all brokers): beside
	// the fsync floor, what the disk and the CPUs made of an fsync under
	// the row's load. Throughput only; absent when /metrics cannot be
	// scraped or nothing synced.
	WALFsyncMeanUS *float64 `json:"wal_fsync_mean_us,omitempty"`
	// IdleShardKiB is the brokers' RSS growth (summed over them) from
	// creating a stream of the row's shard count, divided by its shards:
	// what a shard costs before its first record. OpenShardKiB is the
	// same after one record to each shard (its log open, its tail cache
	// started). Both are measured on probe streams before the
	// scenario's load, each reading once the RSS holds still (see
	// measureShardMemory). Throughput with --local only; RSS moves by
	// whole pages and with the Go heap, so few shards give a rough
	// figure.
	IdleShardKiB *float64 `json:"idle_shard_kib,omitempty"`
	OpenShardKiB *float64 `json:"open_shard_kib,omitempty"`
	Note         string   `json:"note,omitempty"`

	hist *hdrhistogram.Histogram // every trial's latencies, for the plot
}

// Label names the result in tables and plots.
func (r *Result) Label() string {
	if r.Replicas > 1 {
		return r.label() + fmt.Sprintf(" R=%d", r.Replicas)
	}
	return r.label()
}

func (r *Result) label() string {
	switch {
	case r.Scenario == Load:
		return fmt.Sprintf("%s %g%% %d/s (%d shards)", r.Scenario, r.LoadPct, r.RatePerSec, r.Shards)
	case r.Mode == ModeOpen:
		return fmt.Sprintf("%s open %d/s", r.Scenario, r.RatePerSec)
	case r.Mode == ModePipelined:
		return fmt.Sprintf("%s %dx%d (%d shards)", r.Scenario, r.Publishers, r.Window, r.Shards)
	}
	if r.Scenario == Fanout {
		return fmt.Sprintf("%s x%d", r.Scenario, r.Subscribers)
	}
	return r.Scenario
}

// summarize turns a scenario's trials into its Result (without floors).
func summarize(scenario, mode string, trials []trial) *Result {
	r := &Result{Scenario: scenario, Mode: mode, Trials: len(trials)}
	var pcts, fulls []Percentiles
	var hists, lags, raws, waits, tos, froms []*hdrhistogram.Histogram
	acks := newAckGroups()
	var cpu, clientCPU, machineCPU, cpuPerRec, machinePerRec []float64
	peakAll := 0.0 // over every trial's window
	for _, t := range trials {
		p := percentilesOf(t.hist)
		pcts = append(pcts, p)
		r.TrialP50 = append(r.TrialP50, p.P50)
		r.TrialP99 = append(r.TrialP99, p.P99)
		tp := 0.0
		if t.elapsed > 0 {
			tp = round1(float64(t.count) / t.elapsed.Seconds())
		}
		r.TrialThroughput = append(r.TrialThroughput, tp)
		hists = append(hists, t.hist)
		if t.lag != nil {
			lags, raws, waits = append(lags, t.lag), append(raws, t.raw), append(waits, t.wait)
		}
		if t.fromIntended != nil {
			fulls = append(fulls, percentilesOf(t.fromIntended))
		}
		if t.toBatch != nil {
			tos, froms = append(tos, t.toBatch), append(froms, t.fromBatch)
		}
		acks.merge(t.acks)
		if t.quic != nil {
			if r.QUICPacketsSent == nil {
				r.QUICPacketsSent, r.QUICPacketsLost = new(uint64), new(uint64)
			}
			*r.QUICPacketsSent += t.quic.sent
			*r.QUICPacketsLost += t.quic.lost
		}
		if t.usage != nil {
			sum, peak, rss, machine := 0.0, 0.0, 0.0, -1.0
			for _, u := range t.usage {
				switch u.Name {
				case selfName:
					clientCPU = append(clientCPU, u.CPUPct)
					continue
				case machineName:
					machineCPU = append(machineCPU, u.CPUPct)
					machine = u.CPUPct
					continue
				}
				sum += u.CPUPct
				rss, peak = max(rss, u.RSSMiB), max(peak, u.PeakRSSMiB)
				r.BrokerPeakRSSLifetime = r.BrokerPeakRSSLifetime || u.PeakLifetime
			}
			peakAll = max(peakAll, peak)
			cpu = append(cpu, sum)
			if tp > 0 {
				cpuPerRec = append(cpuPerRec, perRecord(sum, tp))
				if machine >= 0 { // this trial's, never an earlier one's
					machinePerRec = append(machinePerRec, perRecord(machine, tp))
				}
			}
			r.BrokerRSSMiB, r.BrokerPeakRSSMiB = ptr(rss), ptr(peakAll)
			r.Processes = t.usage
		}
	}
	m := medianPercentiles(pcts)
	r.Count, r.P50, r.P90, r.P99, r.P999, r.Max = m.Count, m.P50, m.P90, m.P99, m.P999, m.Max
	r.ThroughputMsgsPerS = median(r.TrialThroughput)
	r.P50SpreadPct, r.P99SpreadPct = spreadPct(r.TrialP50), spreadPct(r.TrialP99)
	r.ThroughputSpread = spreadPct(r.TrialThroughput)
	r.hist = merged(hists...)
	if len(lags) > 0 {
		lag, raw, wait := percentilesOf(merged(lags...)), percentilesOf(merged(raws...)), percentilesOf(merged(waits...))
		r.GeneratorLagP50, r.GeneratorLagP99 = ptr(lag.P50), ptr(lag.P99)
		r.SendWaitP50, r.SendWaitP99 = ptr(wait.P50), ptr(wait.P99)
		r.UncorrectedP50, r.UncorrectedP99 = ptr(raw.P50), ptr(raw.P99)
	}
	if len(fulls) > 0 {
		full := medianPercentiles(fulls)
		r.FromIntendedP50, r.FromIntendedP90, r.FromIntendedP99, r.FromIntendedP999 = ptr(full.P50), ptr(full.P90), ptr(full.P99), ptr(full.P999)
	}
	if len(tos) > 0 {
		to, from := percentilesOf(merged(tos...)), percentilesOf(merged(froms...))
		r.ToBatchP50, r.ToBatchP99 = ptr(to.P50), ptr(to.P99)
		r.FromBatchP50, r.FromBatchP99 = ptr(from.P50), ptr(from.P99)
	}
	if rpf, ok := acks.perFsync(); ok {
		r.RecordsPerFsync = ptr(float64(int64(rpf*100+0.5)) / 100)
	}
	if len(cpu) > 0 && brokersWatched(r.Processes) {
		r.BrokerCPUPct = ptr(round1(median(cpu)))
	} else {
		r.BrokerRSSMiB, r.BrokerPeakRSSMiB, r.BrokerPeakRSSLifetime = nil, nil, false
	}
	if len(clientCPU) > 0 {
		r.ClientCPUPct = ptr(round1(median(clientCPU)))
	}
	if scenario == Throughput && r.BrokerCPUPct != nil && len(cpuPerRec) > 0 {
		r.BrokerCPUPerRecord = ptr(median(cpuPerRec))
		if len(machinePerRec) > 0 {
			r.MachineCPUPerRecord = ptr(median(machinePerRec))
		}
	}
	if len(machineCPU) > 0 {
		r.MachineCPUPct = ptr(round1(median(machineCPU)))
	}
	return r
}

func ptr(f float64) *float64 { return &f }

// perRecord converts a CPU percentage (of one core) at tp records/s into
// µs of CPU per record, to two decimals.
func perRecord(cpuPct, tp float64) float64 {
	return float64(int64(cpuPct/100*1e6/tp*100+0.5)) / 100
}

// setFloors fills the floor fields of every result, with the targets'
// fsync floor (Floors.targetFsync).
func (rep *Report) setFloors(f Floors) {
	fsync, name := f.targetFsync()
	f.TargetFsync = name
	rep.Floors = f
	for _, r := range rep.Scenarios {
		r.FsyncP50, r.FsyncP99 = fsync.P50, fsync.P99
		r.RTTP50, r.RTTP99 = f.RTT.P50, f.RTT.P99
		if d := fsync.P50 + f.RTT.P50; d > 0 {
			r.P50FloorRatio = round2(r.P50 / d)
		}
		if d := fsync.P99 + f.RTT.P99; d > 0 {
			r.P99FloorRatio = round2(r.P99 / d)
		}
	}
}

// find returns the first result of scenario in mode at replication
// factor 1, or nil: the targets of issue 13 are bounds for unreplicated
// streams, and --replicas may name 3 first, or alone.
func (rep *Report) find(scenario, mode string) *Result {
	for _, r := range rep.Scenarios {
		if r.Scenario == scenario && r.Mode == mode && r.Replicas <= 1 {
			return r
		}
	}
	return nil
}

// findReplicated returns the result of scenario in mode at replication
// factor 3, when a factor-1 result of it comes first (the pair the R=3
// targets compare), else nil.
func (rep *Report) findReplicated(scenario, mode string) (r1, r3 *Result) {
	for _, r := range rep.Scenarios {
		if r.Scenario != scenario || r.Mode != mode {
			continue
		}
		switch {
		case r.Replicas <= 1 && r1 == nil && r3 == nil:
			r1 = r
		case r.Replicas == 3 && r1 != nil && r3 == nil:
			r3 = r
		}
	}
	if r3 == nil {
		return nil, nil
	}
	return r1, r3
}

// Target is one of Felix's performance targets (issue 6) checked against
// this run.
type Target struct {
	Name  string  `json:"name"`
	Rule  string  `json:"rule"`
	Value float64 `json:"value"`
	Limit float64 `json:"limit"`
	Unit  string  `json:"unit"`
	Met   bool    `json:"met"`
}

// throughputFloorRatio is the throughput target, as a multiple of the rate
// one shard committing one record per fsync would give (1 / the targets'
// fsync p50 of the same run).
const throughputFloorRatio = 5.0

// brokersWatched reports whether usage holds a broker's process, not
// only the bench's and the machine's (a cluster that is not ours).
func brokersWatched(usage []ProcUsage) bool {
	return slices.ContainsFunc(usage, func(u ProcUsage) bool { return u.Name != selfName && u.Name != machineName })
}

// checkTargets evaluates the targets whose scenarios ran. Each is relative
// to the floors measured in the same run (or a resource bound), never an
// absolute speed: the machines are shared and noisy. Every one that
// involves fsync uses the targets' fsync floor (Floors.targetFsync).
func (rep *Report) checkTargets() {
	f := rep.Floors
	fsync, fsyncName := f.targetFsync()
	le := func(name, rule string, v, limit float64, unit string) {
		rep.Targets = append(rep.Targets, Target{Name: name, Rule: rule, Value: v, Limit: round1(limit), Unit: unit, Met: v <= limit})
	}
	direct := rep.find(Direct, ModeClosed)
	if direct != nil {
		le("direct p50", fmt.Sprintf("p50 <= 1.2 x (%s p50 + RTT p50)", fsyncName), direct.P50, 1.2*(fsync.P50+f.RTT.P50), "us")
		le("direct p99", fmt.Sprintf("p99 <= 1.5 x (%s p99 + RTT p99)", fsyncName), direct.P99, 1.5*(fsync.P99+f.RTT.P99), "us")
	}
	if fw := rep.find(Forwarded, ModeClosed); fw != nil && direct != nil {
		le("forwarded hop", "forwarded p50 - direct p50 <= 1.2 x RTT p50", fw.P50-direct.P50, 1.2*f.RTT.P50, "us")
	}
	if e2e := rep.find(E2E, ModeClosed); e2e != nil && direct != nil {
		le("e2e p50", "e2e p50 <= direct p50 + 0.5 x RTT p50", e2e.P50, direct.P50+0.5*f.RTT.P50, "us")
	}
	if tp := rep.find(Throughput, ModePipelined); tp != nil && fsync.P50 > 0 {
		// Against the fsync floor of the same run: one record per fsync
		// would ack 1/fsync p50 records per second per shard; group
		// commit must do several times better, per shard (shards whose
		// fsyncs overlap would meet a bound on their sum with one
		// record per fsync). An absolute rate means little on a shared
		// machine.
		perFsync := 1e6 / fsync.P50
		shards := max(tp.Shards, 1)
		ratio := tp.ThroughputMsgsPerS / float64(shards) / perFsync
		rep.Targets = append(rep.Targets, Target{Name: "throughput",
			Rule: fmt.Sprintf("acked records/s per shard >= %.0f x 1/(%s p50) = %.0f/s, %.0f/s over %d shards (%d publishers; group commit amortizes fsync)",
				throughputFloorRatio, fsyncName, throughputFloorRatio*perFsync, throughputFloorRatio*perFsync*float64(shards), shards, tp.Publishers),
			Value: round2(ratio), Limit: throughputFloorRatio, Unit: "x 1/fsync", Met: ratio >= throughputFloorRatio})
		// Over every throughput row of the run (each step of a --shards
		// sweep), not the first alone: the largest shard count is the
		// one that holds the most.
		peak, over := -1.0, 0
		for _, r := range rep.Scenarios {
			if r.Scenario == Throughput && r.Mode == ModePipelined && r.Replicas <= 1 && r.BrokerPeakRSSMiB != nil && *r.BrokerPeakRSSMiB > peak {
				peak, over = *r.BrokerPeakRSSMiB, r.Shards
			}
		}
		if peak >= 0 {
			le("broker RSS", fmt.Sprintf("every broker's peak RSS <= 300 MiB in every throughput row (the largest: over %d shards)", over), peak, 300, "MiB")
		}
	}
	if open := rep.find(Direct, ModeOpen); open != nil && direct != nil {
		le("light load p50", fmt.Sprintf("direct open loop %d/s p50 <= direct closed p50 (light load costs no more than a lone record; same stream, shard and owner)", open.RatePerSec),
			open.P50, direct.P50, "us")
		if f.RTTIdle.Count > 0 {
			note := fmt.Sprintf("light load: direct open loop p50 - direct closed p50 = %s; the QUIC echo floor alone, after %s idle - back to back = %s",
				fmtUS(open.P50-direct.P50), fmtUS(f.IdleGapUS), fmtUS(f.RTTIdle.P50-f.RTT.P50))
			if fi, fp := f.FsyncIdle, f.FsyncPrealloc; fi.Count > 0 && fp.Count > 0 {
				note += fmt.Sprintf(", write+fdatasync over zeros %s, together %s", fmtUS(fi.P50-fp.P50), fmtUS(fi.P50-fp.P50+f.RTTIdle.P50-f.RTT.P50))
			}
			rep.Notes = append(rep.Notes, note+" (waking idle CPUs and threads, with no Felix code in it)")
		}
	}
	for _, r := range rep.Scenarios {
		if r.Scenario == Load && r.LoadPct == 50 && r.Replicas <= 1 && direct != nil {
			le("load 50% p99", "open-loop p99 at 50% of the measured throughput <= 3 x direct closed p99", r.P99, 3*direct.P99, "us")
			break
		}
	}
	if r1, r3 := rep.findReplicated(Direct, ModeClosed); r3 != nil {
		le("R=3 direct p50", "R=3 direct p50 <= R=1 direct p50 + 1.5 x RTT p50", r3.P50, r1.P50+1.5*f.RTT.P50, "us")
		if fs := f.FsyncShared; fs != nil && fs.Count > 0 {
			rep.Notes = append(rep.Notes, fmt.Sprintf("R=3 direct p50 - R=1 direct p50 = %s (%.1f x RTT p50); of it, the shared disk: %d write+fdatasyncs at once on %s, until %d are done, p50 %s - one alone %s = %s (%.1f x RTT p50)",
				fmtUS(r3.P50-r1.P50), (r3.P50-r1.P50)/f.RTT.P50, sharedReplicas, f.FsyncFS, sharedQuorum,
				fmtUS(fs.P50), fmtUS(fsync.P50), fmtUS(fs.P50-fsync.P50), (fs.P50-fsync.P50)/f.RTT.P50))
		}
	}
	if r1, r3 := rep.findReplicated(Throughput, ModePipelined); r3 != nil && r1.ThroughputMsgsPerS > 0 {
		share := ratio3(r3.ThroughputMsgsPerS, r1.ThroughputMsgsPerS)
		rep.Targets = append(rep.Targets, Target{Name: "R=3 throughput",
			Rule:  fmt.Sprintf("R=3 acked records/s >= 0.5 x R=1's (%.0f/s, %d publishers)", r1.ThroughputMsgsPerS, r1.Publishers),
			Value: share, Limit: 0.5, Unit: "x R=1", Met: share >= 0.5})
	}
	rep.checkSweep()
}

// writeJSON writes the report as indented JSON.
func (rep *Report) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// writeTable writes the report for a person: the floors, one line per
// scenario with its latencies and their ratio to the floors, the
// telemetry overhead (--telemetry), the targets and the notes.
func (rep *Report) writeTable(w io.Writer) error {
	fmt.Fprintf(w, "Felix bench: %s, %d-byte records, %d trials; %d CPUs (%s), %s, %s\n",
		rep.Cluster, rep.PayloadBytes, rep.Trials, rep.Machine.CPUs, rep.Machine.CPUModel, rep.Machine.Kernel, rep.Machine.GoVersion)
	if rep.Machine.CPUIdle != "" {
		fmt.Fprintf(w, "Idle CPUs: %s\n", rep.Machine.CPUIdle)
	}
	if (rep.Telemetry == nil && rep.AB == nil) || len(rep.Scenarios) > 0 { // --telemetry and --ab measure no floors and run no scenario
		if err := rep.writeScenarios(w); err != nil {
			return err
		}
	}
	if len(rep.ShardSweep) > 0 {
		if err := writeSweep(w, rep.ShardSweep); err != nil {
			return err
		}
	}
	if rep.Telemetry != nil {
		fmt.Fprintln(w)
		if err := rep.Telemetry.writeTable(w); err != nil {
			return err
		}
	}
	if rep.AB != nil {
		fmt.Fprintln(w)
		if err := rep.AB.writeTable(w); err != nil {
			return err
		}
	}
	return rep.writeTargetsAndNotes(w)
}

// writeScenarios writes the floors and one line per scenario.
func (rep *Report) writeScenarios(w io.Writer) error {
	f := rep.Floors
	fmt.Fprintf(w, "floors (same run): write+fdatasync p50 %s p99 %s (%s, %s)", fmtUS(f.Fsync.P50), fmtUS(f.Fsync.P99), f.FsyncFS, f.FsyncDir)
	if fp := f.FsyncPrealloc; fp.Count > 0 {
		fmt.Fprintf(w, ", over preallocated zeros p50 %s p99 %s", fmtUS(fp.P50), fmtUS(fp.P99))
		if fi := f.FsyncIdle; fi.Count > 0 {
			fmt.Fprintf(w, " (after %s idle p50 %s p99 %s)", fmtUS(f.IdleGapUS), fmtUS(fi.P50), fmtUS(fi.P99))
		}
	}
	fmt.Fprintf(w, "; QUIC RTT between 2 processes p50 %s p99 %s", fmtUS(f.RTT.P50), fmtUS(f.RTT.P99))
	if f.RTTIdle.Count > 0 {
		fmt.Fprintf(w, ", after %s idle p50 %s p99 %s", fmtUS(f.IdleGapUS), fmtUS(f.RTTIdle.P50), fmtUS(f.RTTIdle.P99))
	}
	if fs := f.FsyncShared; fs != nil && fs.Count > 0 {
		fmt.Fprintf(w, "; %d write+fdatasyncs over zeros at once, %d done p50 %s p99 %s", sharedReplicas, sharedQuorum, fmtUS(fs.P50), fmtUS(fs.P99))
		if sk := f.FsyncSharedSkew; sk != nil && sk.Count > 0 {
			fmt.Fprintf(w, " (the last started %s after the first, p50)", fmtUS(sk.P50))
		}
	}
	fmt.Fprintln(w)
	fsync, name := f.targetFsync()
	what := "the plain append (over preallocated zeros not measured)"
	if name == "fsync_prealloc" {
		what = "over preallocated zeros, as shard logs and replicas write"
	}
	fmt.Fprintf(w, "floor = fsync + RTT: p50 %s, p99 %s; the targets' fsync floor is write+fdatasync %s\n\n",
		fmtUS(fsync.P50+f.RTT.P50), fmtUS(fsync.P99+f.RTT.P99), what)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "SCENARIO\tCOUNT\tP50\tP90\tP99\tP99.9\tMAX\tP50/FLOOR\tP99/FLOOR\tP50 SPREAD\tMSG/S\tREC/FSYNC\t")
	for _, r := range rep.Scenarios {
		rpf := "n/a"
		if r.RecordsPerFsync != nil {
			rpf = fmt.Sprintf("%.2f", *r.RecordsPerFsync)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%.2fx\t%.2fx\t%.0f%%\t%.0f\t%s\t\n",
			r.Label(), r.Count, fmtUS(r.P50), fmtUS(r.P90), fmtUS(r.P99), fmtUS(r.P999), fmtUS(r.Max),
			r.P50FloorRatio, r.P99FloorRatio, r.P50SpreadPct, r.ThroughputMsgsPerS, rpf)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rep.Scenarios {
		if r.GeneratorLagP50 != nil {
			fmt.Fprintf(w, "%s: latency from the intended send time (from the generator's wake-up where its timer overshot); generator lag (not charged) p50 %s p99 %s; send wait (charged) p50 %s p99 %s; from the actual send p50 %s p99 %s\n",
				r.Label(), fmtUS(*r.GeneratorLagP50), fmtUS(*r.GeneratorLagP99), fmtUS(deref(r.SendWaitP50)), fmtUS(deref(r.SendWaitP99)),
				fmtUS(*r.UncorrectedP50), fmtUS(*r.UncorrectedP99))
		}
		if r.FromIntendedP50 != nil {
			fmt.Fprintf(w, "%s: from the intended send time with nothing excused (the generator's lag charged too): p50 %s p90 %s p99 %s p99.9 %s\n",
				r.Label(), fmtUS(*r.FromIntendedP50), fmtUS(*r.FromIntendedP90), fmtUS(*r.FromIntendedP99), fmtUS(*r.FromIntendedP999))
		}
		if r.ToBatchP50 != nil {
			fmt.Fprintf(w, "%s: split at the owner's stamp on the record's batch (before its write and fsync): due -> stamp p50 %s p99 %s (client, network, the broker's read, the wait for its committer); stamp -> ack p50 %s p99 %s (write, fsync, the way back)\n",
				r.Label(), fmtUS(*r.ToBatchP50), fmtUS(*r.ToBatchP99), fmtUS(*r.FromBatchP50), fmtUS(*r.FromBatchP99))
		}
		if r.BrokerCPUPct != nil {
			fmt.Fprintf(w, "%s: brokers used %.0f%% CPU (of one core), largest broker RSS %.1f MiB (%s); the bench itself %.0f%% CPU%s\n",
				r.Label(), *r.BrokerCPUPct, *r.BrokerRSSMiB, peakRSS(*r.BrokerPeakRSSMiB, r.BrokerPeakRSSLifetime), deref(r.ClientCPUPct), machineBusy(r.MachineCPUPct))
		}
		if r.QUICPacketsSent != nil {
			fmt.Fprintf(w, "%s: the bench's QUIC connections sent %d packets, %d of them declared lost and sent again\n", r.Label(), *r.QUICPacketsSent, *r.QUICPacketsLost)
		}
		if r.BrokerCPUPerRecord != nil {
			fmt.Fprintf(w, "%s: CPU per acked record: brokers %.2f µs, whole machine %s µs\n", r.Label(), *r.BrokerCPUPerRecord, fmtOpt2(r.MachineCPUPerRecord))
		}
		if r.WALRecordsPerFsync != nil {
			fmt.Fprintf(w, "%s: %.2f records per fsync as the brokers' WALs count them (felix_wal_batch_records)\n", r.Label(), *r.WALRecordsPerFsync)
		}
		if r.WALFsyncMeanUS != nil {
			fmt.Fprintf(w, "%s: the brokers' fdatasyncs took %.0f µs on average (felix_wal_fsync_duration_seconds)\n", r.Label(), *r.WALFsyncMeanUS)
		}
		if r.IdleShardKiB != nil && len(rep.ShardSweep) == 0 {
			fmt.Fprintf(w, "%s: memory per shard (brokers' RSS growth / %d shards) idle %.1f KiB, open %s KiB\n",
				r.Label(), r.Shards, *r.IdleShardKiB, fmtOpt(r.OpenShardKiB))
		}
		if r.Note != "" {
			fmt.Fprintf(w, "%s: %s\n", r.Label(), r.Note)
		}
	}
	return nil
}

// writeTargetsAndNotes writes the targets and the notes.
func (rep *Report) writeTargetsAndNotes(w io.Writer) error {
	if len(rep.Targets) > 0 {
		fmt.Fprintln(w, "\ntargets:")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, t := range rep.Targets {
			verdict := "met"
			if !t.Met {
				verdict = "MISSED"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%.1f %s (bound %.1f)\t%s\n", t.Name, t.Rule, t.Value, t.Unit, t.Limit, verdict)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	return nil
}

func fmtOpt(f *float64) string {
	if f == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.1f", *f)
}

func fmtOpt2(f *float64) string {
	if f == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", *f)
}

func deref(f *float64) float64 {
	if f == nil {
		return 0
	}
	return *f
}

// fmtUS formats microseconds for a person.
func fmtUS(us float64) string {
	switch {
	case us >= 10000:
		return fmt.Sprintf("%.1fms", us/1000)
	case us >= 1000:
		return fmt.Sprintf("%.2fms", us/1000)
	}
	return fmt.Sprintf("%.0fµs", us)
}

// write writes the report to w: JSON if asJSON, else the table.
func (r *Report) write(w io.Writer, asJSON bool) error {
	var err error
	if asJSON {
		err = r.writeJSON(w)
	} else {
		err = r.writeTable(w)
	}
	if err != nil {
		return fmt.Errorf("bench: write the report: %w", err)
	}
	return nil
}

// peakRSS says what a peak RSS of mib covers: the row's measured
// windows, or the process's life when it could not be reset.
func peakRSS(mib float64, lifetime bool) string {
	if lifetime {
		return fmt.Sprintf("lifetime peak %.1f MiB, earlier rows included: resetting it failed", mib)
	}
	return fmt.Sprintf("peak %.1f MiB while measured", mib)
}

// machineBusy says how busy the machine's CPUs were, if measured.
func machineBusy(pct *float64) string {
	if pct == nil {
		return ""
	}
	return fmt.Sprintf("; the machine's CPUs %.0f%% busy of %d%%", *pct, 100*runtime.NumCPU())
}
