package bench

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/sysmon"
)

func TestMedianAndSpread(t *testing.T) {
	for _, tc := range []struct {
		in          []float64
		median, pct float64
	}{
		{nil, 0, 0},
		{[]float64{5}, 5, 0},
		{[]float64{300, 100, 200}, 200, 100},
		{[]float64{4, 1, 3, 2}, 2.5, 120},
	} {
		if got := median(tc.in); got != tc.median {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.median)
		}
		if got := spreadPct(tc.in); got != tc.pct {
			t.Errorf("spreadPct(%v) = %v, want %v", tc.in, got, tc.pct)
		}
	}
}

func TestMedianPercentiles(t *testing.T) {
	got := medianPercentiles([]Percentiles{
		{Count: 10, P50: 1, P90: 2, P99: 3, P999: 4, Max: 50},
		{Count: 10, P50: 3, P90: 4, P99: 9, P999: 9, Max: 9},
		{Count: 10, P50: 2, P90: 3, P99: 5, P999: 6, Max: 7},
	})
	want := Percentiles{Count: 30, P50: 2, P90: 3, P99: 5, P999: 6, Max: 50}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

// TestAckGroups: acks of one shard sharing a commit timestamp were made
// durable by one fsync.
func TestAckGroups(t *testing.T) {
	g := newAckGroups()
	if _, ok := g.perFsync(); ok {
		t.Fatal("records per fsync with no acks")
	}
	ts := time.Unix(0, 1_000_000)
	for range 3 { // one commit of three records
		g.add(client.Ack{Stream: "s", Shard: 0, Owner: "b0", Timestamp: ts})
	}
	g.add(client.Ack{Stream: "s", Shard: 1, Owner: "b1", Timestamp: ts}) // same time, other shard
	other := newAckGroups()
	other.add(client.Ack{Stream: "s", Shard: 0, Owner: "b0", Timestamp: ts.Add(time.Microsecond)})
	other.add(client.Ack{Stream: "s", Shard: 0, Owner: "b0", Timestamp: ts.Add(time.Microsecond)})
	g.merge(other)
	got, ok := g.perFsync()
	if !ok || got != 6.0/3 {
		t.Errorf("records per fsync %v, want 2 (6 records, 3 commits)", got)
	}
}

func TestReadProcSelf(t *testing.T) {
	s, err := readProc(os.Getpid())
	if err != nil {
		t.Skip("no /proc:", err)
	}
	if s.rssKiB == 0 || s.hwmKiB < s.rssKiB {
		t.Errorf("rss %d KiB, peak %d KiB", s.rssKiB, s.hwmKiB)
	}
}

// TestKongMount parses a command line the way felixctl does, with
// Command mounted as a subcommand.
func TestKongMount(t *testing.T) {
	var cli struct {
		Bench Command `cmd:""`
	}
	p, err := kong.New(&cli, kong.Exit(func(int) { t.Fatal("kong exited") }))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Parse([]string{"bench", "--local", "--plot", "x.png", "--scenarios", "direct,e2e", "--no-progress"}); err != nil {
		t.Fatal(err)
	}
	c := cli.Bench
	if !c.Local || c.Plot == "" || c.Progress || len(c.Scenarios) != 2 ||
		c.Size != 128 || c.Publishers != 64 || c.Trials != 3 || c.Duration != 3*time.Second {
		t.Errorf("parsed %+v", c)
	}
	// Which cluster, and --json, are felixctl's global flags, not bench's:
	// felixctl fills Cluster, Broker, CA, Cert, Key and JSON.
	if err := (&Command{}).checkTarget(); err == nil {
		t.Error("no cluster named: accepted")
	}
	if err := (&Command{Broker: "a:1"}).checkTarget(); err == nil {
		t.Error("a broker without a CA: accepted")
	}
	for _, bad := range [][]string{
		{"bench", "--local", "--broker", "a:1"},
		{"bench", "--local", "--json"},
		{"bench", "--local", "--scenarios", "nope"},
		{"bench", "--local", "--plot", "x.jpg"},
	} {
		if _, err := p.Parse(bad); err == nil {
			t.Errorf("%v: parsed", bad)
		}
	}
}

// defaults fills c with the flag defaults, as kong would for
// `bench --local`.
func defaults(c *Command) error {
	var cli struct {
		Bench Command `cmd:""`
	}
	p, err := kong.New(&cli)
	if err != nil {
		return err
	}
	if _, err := p.Parse([]string{"bench", "--local"}); err != nil {
		return err
	}
	*c = cli.Bench
	return nil
}

// The R=3 targets compare the R=3 rows with the R=1 rows before them, in
// the same run; the R=1 targets keep reading the R=1 rows.
func TestReplicatedTargets(t *testing.T) {
	rep := &Report{Floors: Floors{RTT: Percentiles{P50: 200}, Fsync: Percentiles{P50: 300}, FsyncShared: &Percentiles{Count: 10, P50: 550}}, Scenarios: []*Result{
		{Scenario: Direct, Mode: ModeClosed, P50: 500},
		{Scenario: Throughput, Mode: ModePipelined, ThroughputMsgsPerS: 100000, Publishers: 64, Shards: 6},
		{Scenario: Direct, Mode: ModeClosed, P50: 900, Replicas: 3},
		{Scenario: Throughput, Mode: ModePipelined, ThroughputMsgsPerS: 40000, Publishers: 64, Shards: 6, Replicas: 3},
	}}
	rep.checkTargets()
	got := map[string]Target{}
	for _, tg := range rep.Targets {
		got[tg.Name] = tg
	}
	if d := got["direct p50"]; d.Value != 500 {
		t.Errorf("direct p50 target read %v, want the R=1 row's 500", d.Value)
	}
	if d := got["R=3 direct p50"]; d.Value != 900 || d.Limit != 800 || d.Met {
		t.Errorf("R=3 direct p50 target: %+v, want 900 against 500 + 1.5 x 200 = 800, missed", d)
	}
	if len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], "= 400µs (2.0 x RTT p50); of it, the shared disk") ||
		!strings.Contains(rep.Notes[0], "p50 550µs - one alone 300µs = 250µs (1.2 x RTT p50)") {
		t.Errorf("R=3 notes %q, want the excess over R=1 and the shared disk's part of it", rep.Notes)
	}
	if tp := got["R=3 throughput"]; tp.Value != 0.4 || tp.Met {
		t.Errorf("R=3 throughput target: %+v, want 0.4 of R=1, missed", tp)
	}
	if len(shardSweep(rep.Scenarios)) != 0 {
		t.Errorf("one shard count per factor is no sweep")
	}
	if l := rep.Scenarios[2].Label(); l != "direct R=3" {
		t.Errorf("label %q", l)
	}
}

// TestUnreplicatedTargetsSkipR3Rows: the targets of replication factor 1
// (direct, the hop, e2e, throughput, light load, load 50%) never read a
// row of factor 3, whichever order --replicas names them in: with
// --replicas 3 alone, or 3 before 1, the first direct row is R=3's, and
// it was checked against the R=1 bounds under the name "direct p50".
func TestUnreplicatedTargetsSkipR3Rows(t *testing.T) {
	floors := Floors{RTT: Percentiles{Count: 1, P50: 200, P99: 400}, Fsync: Percentiles{Count: 1, P50: 300, P99: 600}}
	r3 := func() []*Result {
		return []*Result{
			{Scenario: Direct, Mode: ModeClosed, P50: 900, P99: 2000, Replicas: 3},
			{Scenario: Direct, Mode: ModeOpen, P50: 950, RatePerSec: 1000, Replicas: 3},
			{Scenario: Forwarded, Mode: ModeClosed, P50: 1100, Replicas: 3},
			{Scenario: E2E, Mode: ModeClosed, P50: 950, Replicas: 3},
			{Scenario: Throughput, Mode: ModePipelined, ThroughputMsgsPerS: 40000, Publishers: 64, Shards: 6, Replicas: 3},
			{Scenario: Load, Mode: ModeOpen, LoadPct: 50, P99: 9000, Replicas: 3},
		}
	}
	r1 := []*Result{
		{Scenario: Direct, Mode: ModeClosed, P50: 500, P99: 1000},
		{Scenario: Direct, Mode: ModeOpen, P50: 520, RatePerSec: 1000},
		{Scenario: Forwarded, Mode: ModeClosed, P50: 650},
		{Scenario: E2E, Mode: ModeClosed, P50: 520},
		{Scenario: Throughput, Mode: ModePipelined, ThroughputMsgsPerS: 100000, Publishers: 64, Shards: 6},
		{Scenario: Load, Mode: ModeOpen, LoadPct: 50, P99: 2500},
	}
	// R=3 alone: no R=1 target at all.
	rep := &Report{Floors: floors, Scenarios: r3()}
	rep.checkTargets()
	for _, tg := range rep.Targets {
		if !strings.HasPrefix(tg.Name, "R=3") {
			t.Errorf("--replicas 3 alone checked the R=1 target %q against an R=3 row: %+v", tg.Name, tg)
		}
	}
	// 3 before 1: the R=1 targets read the R=1 rows.
	rep = &Report{Floors: floors, Scenarios: append(r3(), r1...)}
	rep.checkTargets()
	want := map[string]float64{"direct p50": 500, "direct p99": 1000, "forwarded hop": 150, "e2e p50": 520, "light load p50": 520, "load 50% p99": 2500}
	for _, tg := range rep.Targets {
		if v, ok := want[tg.Name]; ok && tg.Value != v {
			t.Errorf("target %q read %v, want the R=1 row's %v", tg.Name, tg.Value, v)
		}
		if tg.Name == "throughput" && tg.Value != round1(100000.0/6/(1e6/300)) {
			t.Errorf("throughput target read %v, want the R=1 row's", tg.Value)
		}
	}
}

// The shared-disk floor runs real write+fdatasyncs of three files at
// once and times the second to finish. They write over zeros written
// beforehand, as replicas do (each file's size never changes while it is
// sampled; they were appended to, which also made each fdatasync write
// the inode), and a write error is reported, not timed.
func TestSharedFsyncFloor(t *testing.T) {
	dir := t.TempDir()
	m := &floorMeter{payload: make([]byte, 64)}
	for range sharedReplicas {
		f, err := os.CreateTemp(dir, "shared-*")
		if err != nil {
			t.Fatal(err)
		}
		m.shared = append(m.shared, f)
	}
	if err := m.preallocShared(5); err != nil {
		t.Fatal(err)
	}
	s := startSharedSyncer(m.shared, m.payload)
	defer s.stop()
	for i := range 5 {
		d, skew, err := s.sample(int64(i * 64))
		// The skew may pass the quorum time: on a busy machine the last
		// writer can start after the first two are done.
		if err != nil || d <= 0 || skew < 0 {
			t.Fatalf("sample = %v, skew %v, %v", d, skew, err)
		}
		for _, f := range m.shared {
			if fi, err := f.Stat(); err != nil || fi.Size() != 5*64 {
				t.Fatalf("sample %d: %s has %v bytes (%v), want the 5 payloads' zeros written beforehand", i, f.Name(), fi.Size(), err)
			}
		}
	}
	m.shared[1].Close()
	if _, _, err := s.sample(0); err == nil {
		t.Error("a closed file's write went unreported")
	}
}

// TestSharedFloorStartsTogether: the shared-disk floor's three
// write+fdatasyncs start together, the last within a lone
// write+fdatasync of the first, even when the bench runs at GOMAXPROCS 1
// (three brokers on 2 CPUs run at 1; the bench runs at 2). A goroutine
// per write started per sample waited for a P, which a goroutine in its
// fdatasync keeps: at GOMAXPROCS 2 the third started 200-275 µs after
// the first, about two lone fdatasyncs at 1. GOMAXPROCS is restored
// afterwards. A timing test: it passes if one of three attempts does.
func TestSharedFloorStartsTogether(t *testing.T) {
	dir := t.TempDir()
	if fsType(dir) == "tmpfs" {
		t.Skip("fdatasync costs nothing on tmpfs: no lone fdatasync to start within")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	m := &floorMeter{payload: make([]byte, 128), fsyncPre: &floorSamples{}, fsyncShared: &floorSamples{}, sharedSkew: &floorSamples{}}
	for range sharedReplicas {
		f, err := os.CreateTemp(dir, "shared-*")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		m.shared = append(m.shared, f)
	}
	var err error
	if m.pre, err = os.CreateTemp(dir, "lone-*"); err != nil {
		t.Fatal(err)
	}
	defer m.pre.Close()
	const n = 40
	if _, err := m.pre.WriteAt(make([]byte, 3*n*len(m.payload)), 0); err != nil {
		t.Fatal(err)
	}
	var skew, lone Percentiles
	for attempt := range 3 {
		if err := m.writeSyncs(m.pre, m.fsyncPre, 0, n, nil, true); err != nil {
			t.Fatal(err)
		}
		if err := m.measureShared(5, n, nil); err != nil {
			t.Fatal(err)
		}
		if p := runtime.GOMAXPROCS(0); p != 1 {
			t.Fatalf("GOMAXPROCS %d after the shared floor, want 1 again", p)
		}
		skew, lone = m.sharedSkew.percentiles(), m.fsyncPre.percentiles()
		if skew.P50 < lone.P50 {
			t.Logf("start skew p50 %v µs, a lone write+fdatasync p50 %v µs", skew.P50, lone.P50)
			return
		}
		t.Logf("attempt %d: start skew p50 %v µs, a lone write+fdatasync p50 %v µs", attempt+1, skew.P50, lone.P50)
		m.fsyncPre, m.sharedSkew = &floorSamples{}, &floorSamples{}
	}
	t.Errorf("the three writes started %v µs apart at the median, a lone write+fdatasync took %v: not at once", skew.P50, lone.P50)
}

// TestTargetsUsePreallocatedFsync: the targets' fsync floor is the one a
// shard log and a replica pay, write+fdatasync over preallocated zeros,
// wherever a target or a floor ratio uses fsync; the plain append (which
// also writes the inode, and costs more) only when the other was not
// measured. Against the append, one run's direct p50 was 0.94x its
// "floor".
func TestTargetsUsePreallocatedFsync(t *testing.T) {
	floors := Floors{
		Fsync:           Percentiles{Count: 1000, P50: 110, P99: 400},
		FsyncPrealloc:   Percentiles{Count: 1000, P50: 76, P99: 290},
		RTT:             Percentiles{Count: 1000, P50: 100, P99: 200},
		FsyncShared:     &Percentiles{Count: 1000, P50: 250},
		FsyncSharedSkew: &Percentiles{Count: 1000, P50: 40},
	}
	scenarios := func() []*Result {
		return []*Result{
			{Scenario: Direct, Mode: ModeClosed, P50: 200, P99: 700},
			{Scenario: Throughput, Mode: ModePipelined, ThroughputMsgsPerS: 6 * 1e6 / 76 * 4, Publishers: 64, Shards: 6},
			{Scenario: Direct, Mode: ModeClosed, P50: 500, P99: 900, Replicas: 3},
		}
	}
	targets := func(rep *Report) map[string]Target {
		got := map[string]Target{}
		for _, tg := range rep.Targets {
			got[tg.Name] = tg
		}
		return got
	}
	for _, tc := range []struct {
		name           string
		floors         Floors
		fsync          Percentiles
		want           string
		p50, p99, tput float64
	}{
		{"measured", floors, floors.FsyncPrealloc, "fsync_prealloc", round1(1.2 * 176), round1(1.5 * 490), 4},
		{"not measured", Floors{Fsync: floors.Fsync, RTT: floors.RTT, FsyncShared: floors.FsyncShared}, floors.Fsync, "fsync", round1(1.2 * 210), round1(1.5 * 600), round2(4 * 110.0 / 76)},
	} {
		rep := &Report{Scenarios: scenarios()}
		rep.setFloors(tc.floors)
		rep.checkTargets()
		got := targets(rep)
		if rep.Floors.TargetFsync != tc.want {
			t.Errorf("%s: target_fsync %q, want %q", tc.name, rep.Floors.TargetFsync, tc.want)
		}
		if d := got["direct p50"]; d.Limit != tc.p50 || !strings.Contains(d.Rule, tc.want+" p50") {
			t.Errorf("%s: direct p50 target %+v, want bound %v from %s", tc.name, d, tc.p50, tc.want)
		}
		if d := got["direct p99"]; d.Limit != tc.p99 {
			t.Errorf("%s: direct p99 target %+v, want bound %v", tc.name, d, tc.p99)
		}
		if tp := got["throughput"]; tp.Value != tc.tput {
			t.Errorf("%s: throughput target %+v, want %v x 1/fsync", tc.name, tp, tc.tput)
		}
		r := rep.Scenarios[0]
		if r.FsyncP50 != tc.fsync.P50 || r.FsyncP99 != tc.fsync.P99 || r.P50FloorRatio != round2(200/(tc.fsync.P50+100)) {
			t.Errorf("%s: the row's floor fsync p50 %v p99 %v ratio %v, want %v %v %v", tc.name, r.FsyncP50, r.FsyncP99, r.P50FloorRatio,
				tc.fsync.P50, tc.fsync.P99, round2(200/(tc.fsync.P50+100)))
		}
		if !slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, fmt.Sprintf("one alone %s", fmtUS(tc.fsync.P50))) }) {
			t.Errorf("%s: the R=3 note does not set the shared floor against the targets' fsync floor: %q", tc.name, rep.Notes)
		}
		var buf bytes.Buffer
		if err := rep.writeScenarios(&buf); err != nil {
			t.Fatal(err)
		}
		if tc.want == "fsync_prealloc" && !strings.Contains(buf.String(), "the targets' fsync floor is write+fdatasync over preallocated zeros") {
			t.Errorf("%s: the report does not say which fsync floor the targets use:\n%s", tc.name, buf.String())
		}
		if tc.want == "fsync_prealloc" && !strings.Contains(buf.String(), "2 done p50 250µs p99 0µs (the last started 40µs after the first, p50)") {
			t.Errorf("%s: the report does not give the shared floor's start skew:\n%s", tc.name, buf.String())
		}
	}
}

// TestCPUPerRecord: the brokers' CPU (every broker's, not the bench's)
// and the machine's per acked record, the median over the trials.
func TestCPUPerRecord(t *testing.T) {
	trialAt := func(count int64, brokers, machine float64) trial {
		return trial{hist: newHist(), acks: newAckGroups(), count: count, elapsed: time.Second, usage: []ProcUsage{
			{Name: machineName, CPUPct: machine},
			{Name: selfName, CPUPct: 70},
			{Name: "broker-0", CPUPct: brokers / 2},
			{Name: "broker-1", CPUPct: brokers / 2},
		}}
	}
	r := summarize(Throughput, ModePipelined, []trial{
		trialAt(100_000, 100, 180), // 10 µs, 18 µs
		trialAt(125_000, 100, 190), // 8 µs, 15.2 µs
		trialAt(80_000, 120, 200),  // 15 µs, 25 µs
	})
	if r.BrokerCPUPerRecord == nil || *r.BrokerCPUPerRecord != 10 {
		t.Errorf("brokers' CPU per record %v, want 10 µs", fmtOpt2(r.BrokerCPUPerRecord))
	}
	if r.MachineCPUPerRecord == nil || *r.MachineCPUPerRecord != 18 {
		t.Errorf("machine's CPU per record %v, want 18 µs", fmtOpt2(r.MachineCPUPerRecord))
	}
	if r := summarize(Direct, ModeClosed, []trial{trialAt(1000, 50, 60)}); r.BrokerCPUPerRecord != nil {
		t.Errorf("a latency scenario reported CPU per record %v", *r.BrokerCPUPerRecord)
	}
}

func TestCPUIdle(t *testing.T) {
	files := func(m map[string]string) func(string) string {
		return func(p string) string { return m[p] }
	}
	const (
		driver   = "/sys/devices/system/cpu/cpuidle/current_driver"
		governor = "/sys/devices/system/cpu/cpuidle/current_governor_ro"
		pollNs   = "/sys/module/haltpoll/parameters/guest_halt_poll_ns"
	)
	for _, tc := range []struct {
		files map[string]string
		want  string
	}{
		{map[string]string{driver: "haltpoll", governor: "haltpoll", pollNs: "0"}, "cpuidle haltpoll, governor haltpoll, guest_halt_poll_ns 0"},
		{map[string]string{driver: "intel_idle", governor: "menu", pollNs: "200000"}, "cpuidle intel_idle, governor menu"},
		{map[string]string{pollNs: "0"}, ""},
	} {
		if got := cpuIdle(files(tc.files)); got != tc.want {
			t.Errorf("cpuIdle(%v) = %q, want %q", tc.files, got, tc.want)
		}
	}
}

func TestSysmonNote(t *testing.T) {
	pid := os.Getpid()
	if got := processGodebug(pid); got != os.Getenv("GODEBUG") {
		t.Errorf("processGodebug(self) = %q, want %q", got, os.Getenv("GODEBUG"))
	}
	if n := sysmonNote("madvdontneed=1," + sysmon.Setting); !strings.Contains(n, "never parks") {
		t.Errorf("sysmonNote with the setting = %q", n)
	}
	if n := sysmonNote("schedtrace=0"); !strings.Contains(n, "parks while they idle") {
		t.Errorf("sysmonNote with schedtrace=0 = %q", n)
	}
}

// TestParseCPUsCountsSteal: a VM's stolen time is in the total, not in
// the busy time, and guest time, within user, is not counted twice (the
// steal column was left out of the total, which overstated how busy the
// CPUs were by the share stolen).
func TestParseCPUsCountsSteal(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	s, err := parseCPUs("cpu  100 0 100 600 0 0 0 200 50 0\ncpu0 50 0 50 300 0 0 0 100 25 0\ncpu1 50 0 50 300 0 0 0 100 25 0\nintr 7\n")
	if err != nil {
		t.Fatal(err)
	}
	if s.total != 1000 || s.busy != 200 || s.n != 2 {
		t.Errorf("sample %+v, want total 1000, busy 200 over 2 CPUs", s)
	}
	if _, err := parseCPUs("intr 7\n"); err == nil {
		t.Error("a /proc/stat without a cpu line parsed")
	}
}

// TestNoBrokerFiguresWithoutBrokers: against a cluster that is not the
// bench's, only the bench's process and the machine are watched; the
// report then gives no broker CPU, RSS or CPU per record, and checks no
// RSS target (it gave zeros, and the RSS target met at 0 MiB).
func TestNoBrokerFiguresWithoutBrokers(t *testing.T) {
	tr := trial{hist: newHist(), acks: newAckGroups(), count: 1000, elapsed: time.Second,
		usage: []ProcUsage{{Name: selfName, CPUPct: 40, RSSMiB: 30}, {Name: machineName, CPUPct: 90}}}
	record(tr.hist, time.Millisecond)
	r := summarize(Throughput, ModePipelined, []trial{tr})
	if r.BrokerCPUPct != nil || r.BrokerRSSMiB != nil || r.BrokerPeakRSSMiB != nil || r.BrokerCPUPerRecord != nil {
		t.Errorf("broker figures with no broker watched: cpu %v rss %v peak %v per record %v", r.BrokerCPUPct, r.BrokerRSSMiB, r.BrokerPeakRSSMiB, r.BrokerCPUPerRecord)
	}
	rep := &Report{Scenarios: []*Result{r}}
	rep.Floors.Fsync = Percentiles{Count: 1, P50: 1000, P99: 2000}
	rep.checkTargets()
	for _, tg := range rep.Targets {
		if tg.Name == "broker RSS" {
			t.Errorf("RSS target checked with no broker watched: %+v", tg)
		}
	}
	if (&env{watch: &procWatch{names: []string{selfName}}}).sameClock() {
		t.Error("a cluster that is not the bench's counts as on its clock")
	}
}

// TestThroughputTargetPerShard: the throughput target asks each shard for
// several records per fsync's time: six shards committing one record per
// fsync each, their fsyncs overlapping, do not meet it (they met a bound
// on their sum).
func TestThroughputTargetPerShard(t *testing.T) {
	for _, tc := range []struct {
		perShard float64 // acked records/s per shard, fsync 1 ms
		met      bool
	}{{900, false}, {5100, true}} {
		rep := &Report{Scenarios: []*Result{{Scenario: Throughput, Mode: ModePipelined, Shards: 6, Publishers: 64, ThroughputMsgsPerS: 6 * tc.perShard}}}
		rep.Floors.Fsync = Percentiles{Count: 1, P50: 1000, P99: 2000}
		rep.checkTargets()
		i := slices.IndexFunc(rep.Targets, func(tg Target) bool { return tg.Name == "throughput" })
		if i < 0 || rep.Targets[i].Met != tc.met {
			t.Errorf("%v records/s per shard over 6, fsync 1 ms: targets %+v; want throughput met %v", tc.perShard, rep.Targets, tc.met)
		}
	}
}

// TestEchoRunsLikeTheBrokers: the round-trip floor's far end runs with
// the GOMAXPROCS the local cluster gives its brokers (1 for three brokers
// on 2 CPUs), so that the floor pays what a broker's end of a round trip
// pays; at Go's default it ran with every CPU (measured on 2 vCPUs, three
// alternated pairs: RTT p90 184–223 µs against 144–157 at 1).
func TestEchoRunsLikeTheBrokers(t *testing.T) {
	for _, procs := range []int{1, 0} {
		m, err := startFloors(t.Context(), felixBinary, t.TempDir(), t.TempDir(), 64, time.Millisecond, false, procs)
		if err != nil {
			t.Fatal(err)
		}
		got := processEnv(m.echo.Process.Pid, "GOMAXPROCS")
		m.close()
		want := ""
		if procs > 0 {
			want = strconv.Itoa(procs)
		}
		if got != want && os.Getenv("GOMAXPROCS") == "" {
			t.Errorf("brokers at GOMAXPROCS %d: the echo process ran with GOMAXPROCS=%q, want %q", procs, got, want)
		}
	}
}

// TestFloorsAreMediansOfBatches: a floor's percentiles are taken as a
// scenario's are, the median over batches (floorBatch samples each), not
// over one pool of every sample: one bad stretch of 200 fdatasyncs at
// 7 ms among 2,000 at 100 µs made the pooled p99 7 ms, and the direct p99
// bound 1.5 x that. The bad stretch still shows in Max.
func TestFloorsAreMediansOfBatches(t *testing.T) {
	m := &floorMeter{fsync: &floorSamples{}, fsyncPre: &floorSamples{}, fsyncIdle: &floorSamples{}, rtt: &floorSamples{}, rttIdle: &floorSamples{}}
	for i := range 2000 {
		d := 100 * time.Microsecond
		if i >= 300 && i < 500 {
			d = 7 * time.Millisecond
		}
		m.fsyncPre.add(d)
		m.rtt.add(80 * time.Microsecond)
	}
	f := m.floors()
	if p := f.FsyncPrealloc; p.P99 != 100 || p.P50 != 100 || p.Max < 6990 || p.Max > 7010 || p.Count != 2000 {
		t.Errorf("floor %+v, want p50 and p99 100 µs (median over batches), max 7 ms, 2000 samples", p)
	}
	if pooled := percentilesOf(m.fsyncPre.hist()); pooled.P99 < 6990 {
		t.Errorf("the plot's curve %+v lost the bad stretch", pooled)
	}
	rep := &Report{Scenarios: []*Result{{Scenario: Direct, Mode: ModeClosed, P50: 300, P99: 500}}}
	rep.setFloors(f)
	rep.checkTargets()
	if i := slices.IndexFunc(rep.Targets, func(tg Target) bool { return tg.Name == "direct p99" }); i < 0 || rep.Targets[i].Limit != 270 {
		t.Errorf("targets %+v, want the direct p99 bound 1.5 x (100 + 80) µs", rep.Targets)
	}
	// Fewer samples than a batch: one batch of all of them.
	small := &floorSamples{}
	for i := range 10 {
		small.add(time.Duration(i+1) * time.Millisecond)
	}
	if p := small.percentiles(); p.Count != 10 || p.P50 < 4990 || p.P50 > 5010 || p.Max < 9990 || p.Max > 10010 {
		t.Errorf("10 samples: %+v", p)
	}
}

// TestPeakRSSIsTheWindows: a row's peak RSS is the peak during its
// measured window, not over the process's life (VmHWM), which carried
// the peaks of every earlier row (sweep steps, load rows, R=3 rows) into
// later ones. Here this process touches 128 MiB and gives it back before
// the window: its lifetime peak holds it, the window's must not.
func TestPeakRSSIsTheWindows(t *testing.T) {
	big := make([]byte, 128<<20)
	for i := 0; i < len(big); i += 4096 {
		big[i] = 1
	}
	runtime.KeepAlive(big)
	big = nil
	runtime.GC()
	debug.FreeOSMemory()
	before, err := readProc(os.Getpid())
	if err != nil {
		t.Skip(err) // no /proc
	}
	if before.hwmKiB < before.rssKiB+100<<10 {
		t.Skipf("RSS %d KiB did not fall 100 MiB below its peak %d KiB after freeing", before.rssKiB, before.hwmKiB)
	}
	w := &procWatch{names: []string{"broker-0"}, pids: []int{os.Getpid()}}
	w.begin()
	usage := w.end(1)
	var u ProcUsage
	for _, x := range usage {
		if x.Name == "broker-0" {
			u = x
		}
	}
	if u.PeakLifetime || u.PeakRSSMiB > float64(before.hwmKiB)/1024-64 {
		t.Errorf("peak RSS %v MiB (lifetime %v) over a window that allocated nothing, lifetime peak %v MiB, RSS %v MiB",
			u.PeakRSSMiB, u.PeakLifetime, before.hwmKiB/1024, before.rssKiB/1024)
	}

	// Where the reset fails, the report says the peak is the lifetime's.
	tr := func(peak float64, lifetime bool) trial {
		return trial{hist: newHist(), acks: newAckGroups(), count: 1, elapsed: time.Second, usage: []ProcUsage{
			{Name: "broker-0", CPUPct: 50, RSSMiB: 40, PeakRSSMiB: peak, PeakLifetime: lifetime}}}
	}
	r := summarize(Throughput, ModePipelined, []trial{tr(70, false), tr(60, true)})
	if r.BrokerPeakRSSMiB == nil || *r.BrokerPeakRSSMiB != 70 || !r.BrokerPeakRSSLifetime {
		t.Errorf("peak %v lifetime %v, want the largest of the trials' 70 MiB, marked lifetime", fmtOpt(r.BrokerPeakRSSMiB), r.BrokerPeakRSSLifetime)
	}
	var buf bytes.Buffer
	if err := (&Report{Scenarios: []*Result{r}}).writeScenarios(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "lifetime peak 70.0 MiB, earlier rows included") {
		t.Errorf("the report does not say the peak is the lifetime's:\n%s", buf.String())
	}
}

// TestRSSTargetSeesEverySweepStep: the RSS target is judged on the
// largest peak over every throughput row, each step of a --shards sweep
// (it once looked at the first row alone: a 768-shard step over the
// bound was reported met).
func TestRSSTargetSeesEverySweepStep(t *testing.T) {
	row := func(shards int, peak float64) *Result {
		return &Result{Scenario: Throughput, Mode: ModePipelined, Replicas: 1, Shards: shards,
			ThroughputMsgsPerS: 1e5, BrokerPeakRSSMiB: ptr(peak)}
	}
	rep := &Report{Scenarios: []*Result{row(6, 80), row(768, 350), row(96, 120)}}
	rep.Floors.Fsync = Percentiles{Count: 1, P50: 1000, P99: 2000}
	rep.checkTargets()
	for _, tg := range rep.Targets {
		if tg.Name == "broker RSS" {
			if tg.Met || tg.Value != 350 || !strings.Contains(tg.Rule, "768 shards") {
				t.Fatalf("RSS target %+v; want 350 MiB over 768 shards, missed", tg)
			}
			return
		}
	}
	t.Fatal("no RSS target")
}
