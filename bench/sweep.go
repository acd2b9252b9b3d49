package bench

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
)

// ShardStep is one shard count of the --shards sweep: the throughput
// scenario over a stream of that many shards (same publishers, window and
// duration as every other step).
type ShardStep struct {
	Shards             int     `json:"shards"`
	ThroughputMsgsPerS float64 `json:"throughput_msgs_per_s"`
	// RatioToFewest is ThroughputMsgsPerS over that of the step with the
	// fewest shards: how cost grows with the number of shards.
	RatioToFewest      float64  `json:"ratio_to_fewest"`
	P50                float64  `json:"p50_us"`
	P99                float64  `json:"p99_us"`
	RecordsPerFsync    *float64 `json:"records_per_fsync"`                  // from the acks: records per commit of one shard
	WALRecordsPerFsync *float64 `json:"wal_records_per_fsync,omitempty"`    // from the brokers' felix_wal_batch_records
	WALFsyncMeanUS     *float64 `json:"wal_fsync_mean_us,omitempty"`        // from the brokers' felix_wal_fsync_duration_seconds
	BrokerRSSMiB       *float64 `json:"broker_rss_mib,omitempty"`           // largest broker, end of the last trial
	BrokerPeakRSSMiB   *float64 `json:"broker_peak_rss_mib,omitempty"`      // largest broker peak during the step's measured windows (VmHWM, reset at each start)
	PeakRSSLifetime    bool     `json:"broker_peak_rss_lifetime,omitempty"` // the reset failed: BrokerPeakRSSMiB is over the broker's life, earlier steps included
	BrokerCPUPct       *float64 `json:"broker_cpu_pct,omitempty"`
	IdleShardKiB       *float64 `json:"idle_shard_kib,omitempty"`
	OpenShardKiB       *float64 `json:"open_shard_kib,omitempty"`
}

// shardSweep gathers the throughput rows into the sweep, when there is
// more than one; nil otherwise.
func shardSweep(results []*Result) []*ShardStep {
	var steps []*ShardStep
	for _, r := range results {
		if r.Scenario != Throughput || r.Mode != ModePipelined || r.Replicas != results[0].Replicas {
			continue // the sweep runs at the first replication factor only
		}
		steps = append(steps, &ShardStep{
			Shards: r.Shards, ThroughputMsgsPerS: r.ThroughputMsgsPerS, P50: r.P50, P99: r.P99,
			RecordsPerFsync: r.RecordsPerFsync, WALRecordsPerFsync: r.WALRecordsPerFsync, WALFsyncMeanUS: r.WALFsyncMeanUS,
			BrokerRSSMiB: r.BrokerRSSMiB, BrokerPeakRSSMiB: r.BrokerPeakRSSMiB, PeakRSSLifetime: r.BrokerPeakRSSLifetime, BrokerCPUPct: r.BrokerCPUPct,
			IdleShardKiB: r.IdleShardKiB, OpenShardKiB: r.OpenShardKiB,
		})
	}
	if len(steps) < 2 {
		return nil
	}
	fewest := slices.MinFunc(steps, func(a, b *ShardStep) int { return a.Shards - b.Shards })
	for _, s := range steps {
		s.RatioToFewest = ratio3(s.ThroughputMsgsPerS, fewest.ThroughputMsgsPerS)
	}
	return steps
}

// ShardSweepTarget is the bound of issue 13: throughput over the most
// shards at least this share of that over the fewest, in the same run.
const ShardSweepTarget = 0.8

// checkSweep adds the sweep's target: throughput over the most shards
// against that over the fewest.
func (rep *Report) checkSweep() {
	if len(rep.ShardSweep) < 2 {
		return
	}
	byShards := func(a, b *ShardStep) int { return a.Shards - b.Shards }
	fewest, most := slices.MinFunc(rep.ShardSweep, byShards), slices.MaxFunc(rep.ShardSweep, byShards)
	if fewest.Shards == most.Shards {
		return
	}
	rep.Targets = append(rep.Targets, Target{Name: "shards sweep",
		Rule:  fmt.Sprintf("throughput over %d shards >= %.1f x over %d shards (same run)", most.Shards, ShardSweepTarget, fewest.Shards),
		Value: most.RatioToFewest, Limit: ShardSweepTarget, Unit: "x", Met: most.RatioToFewest >= ShardSweepTarget})
}

// peakFormat formats a step's peak RSS, marked when it is the brokers'
// lifetime peak (the reset failed).
func peakFormat(lifetime bool) string {
	if lifetime {
		return "%.1fMiB (lifetime)"
	}
	return "%.1fMiB"
}

// writeSweep writes the sweep for a person.
func writeSweep(w io.Writer, steps []*ShardStep) error {
	fmt.Fprintln(w, "\nshards sweep: the throughput scenario over each shard count (its own stream, deleted after); memory per shard = brokers' RSS growth / shards, idle (created) and open (one record each); peak RSS while the step was measured")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "SHARDS\tMSG/S\tVS FEWEST\tP50\tP99\tREC/FSYNC\tWAL REC/FSYNC\tFSYNC MEAN\tBROKER CPU\tMAX RSS\tMAX PEAK RSS\tIDLE/SHARD\tOPEN/SHARD\t")
	opt := func(f *float64, format string) string {
		if f == nil {
			return "n/a"
		}
		return fmt.Sprintf(format, *f)
	}
	for _, s := range steps {
		fmt.Fprintf(tw, "%d\t%.0f\t%.3f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			s.Shards, s.ThroughputMsgsPerS, s.RatioToFewest, fmtUS(s.P50), fmtUS(s.P99),
			opt(s.RecordsPerFsync, "%.2f"), opt(s.WALRecordsPerFsync, "%.2f"), opt(s.WALFsyncMeanUS, "%.0fµs"), opt(s.BrokerCPUPct, "%.0f%%"),
			opt(s.BrokerRSSMiB, "%.1fMiB"), opt(s.BrokerPeakRSSMiB, peakFormat(s.PeakRSSLifetime)),
			opt(s.IdleShardKiB, "%.1fKiB"), opt(s.OpenShardKiB, "%.1fKiB"))
	}
	return tw.Flush()
}
