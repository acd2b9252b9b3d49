package bench

import (
	"bytes"
	"strings"
	"testing"
)

// TestShardSweep: the throughput rows become the sweep, each step's
// throughput against the step with the fewest shards, and the sweep's
// target compares the most shards with the fewest.
func TestShardSweep(t *testing.T) {
	rows := []*Result{
		{Scenario: Direct, Mode: ModeClosed},
		{Scenario: Throughput, Mode: ModePipelined, Shards: 6, ThroughputMsgsPerS: 100000, RecordsPerFsync: ptr(50), WALRecordsPerFsync: ptr(51),
			BrokerPeakRSSMiB: ptr(60), BrokerRSSMiB: ptr(55), IdleShardKiB: ptr(30), OpenShardKiB: ptr(120)},
		{Scenario: Load, Mode: ModeOpen, Shards: 6, LoadPct: 50},
		{Scenario: Throughput, Mode: ModePipelined, Shards: 768, ThroughputMsgsPerS: 64000, RecordsPerFsync: ptr(17),
			IdleShardKiB: ptr(3), OpenShardKiB: ptr(700)},
	}
	if got := shardSweep(rows[:3]); got != nil {
		t.Errorf("one throughput row made a sweep: %v", got)
	}
	rep := &Report{Scenarios: rows, ShardSweep: shardSweep(rows)}
	if len(rep.ShardSweep) != 2 || rep.ShardSweep[0].RatioToFewest != 1 || rep.ShardSweep[1].RatioToFewest != 0.64 {
		t.Fatalf("sweep %+v %+v", rep.ShardSweep[0], rep.ShardSweep[1])
	}
	rep.checkSweep()
	if len(rep.Targets) != 1 || rep.Targets[0].Met || rep.Targets[0].Value != 0.64 ||
		!strings.Contains(rep.Targets[0].Rule, "over 768 shards >= 0.8 x over 6 shards") {
		t.Errorf("targets %+v", rep.Targets)
	}
	var b bytes.Buffer
	if err := writeSweep(&b, rep.ShardSweep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"shards sweep:", "IDLE/SHARD", "100000", "0.640", "51.00", "60.0MiB", "30.0KiB", "700.0KiB", "n/a"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("sweep table lacks %q:\n%s", want, b.String())
		}
	}
}
