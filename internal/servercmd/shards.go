package servercmd

import (
	"time"

	"github.com/felix-broker/felix/broker"
)

// BrokerShards are the flags bounding a broker's shard logs (see the
// fields of broker.Config of the same names). Their defaults are broker's.
type BrokerShards struct {
	MaxOpenShards     int           `help:"Most shard logs open at once (each holds 3 file descriptors, 4 with --parked-fsync, a goroutine and its in-memory tail); past it the least recently used idle log is closed, and if all are in use the publish or subscription gets unavailable. 0: 1024, or a sixth of the file-descriptor limit left after 256, if smaller; --log-memory may lower it." default:"0" env:"FELIX_MAX_OPEN_SHARDS"`
	LogMemory         int64         `help:"Most bytes the open shard logs and replicas hold in memory: each holds up to 5/4 of --segment-size (tidwall's copy of its tail segment) and twice --tail-bytes (its tail cache), so at most this over that many are open at once (never fewer than 16), within --max-open-shards: 315 with the defaults." default:"1073741824" env:"FELIX_LOG_MEMORY"`
	MinFreeBytes      int64         `help:"Free space the data directory's filesystem must keep: below it the broker refuses new records to the shards it writes (limit_exceeded, nothing written) until space is freed, checked every 250 ms, so that no log meets a full disk. Size it above what the broker writes in 250 ms. -1: no check." default:"268435456" env:"FELIX_MIN_FREE_BYTES"`
	MaxShards         int           `help:"Most shards this broker holds, counted in whole streams; a stream past it is refused (its publishes get unavailable) and logged once per map." default:"16384" env:"FELIX_MAX_SHARDS"`
	SegmentSize       int           `help:"Size at which a shard log starts a new segment file, in bytes (0: the default, 1 MiB), for the logs of replicated shards' replicas too. Retention deletes whole segments of a replicated shard; a log of replication factor 1 is cut inside a segment." default:"0" env:"FELIX_SEGMENT_SIZE"`
	ParkedSync        bool          `help:"Park every fdatasync a shard log's committer runs on the kernel (Linux AIO) instead of blocking a thread, so that the broker serves its network and other shards meanwhile; a lone record on an idle log still syncs blocking. Without it they park only while four or more of the broker's logs have records to commit at once. Measured on a 2-vCPU VM (docs/performance.md): always parked, lower latency at moderate load over few shards, higher p99 when the CPUs are saturated." name:"parked-fsync" env:"FELIX_PARKED_FSYNC"`
	RetentionCheck    time.Duration `help:"How often retention passes run over the shard logs of streams with a retention limit (each open log's own, one pass over every hosted replica of a replicated stream, and a sweep of the logs closed for --max-open-shards that opens, within the budget, those whose oldest segment has expired)." default:"10s" env:"FELIX_RETENTION_CHECK"`
	RaftTick          time.Duration `help:"Replicated streams: the interval of the one ticker that drives every raft group this broker hosts (elections and heartbeats count ticks)." default:"100ms" env:"FELIX_RAFT_TICK"`
	RaftElectionTicks int           `help:"Replicated streams: ticks a follower waits without hearing from its leader before it campaigns (raft randomizes it up to twice that); with --raft-tick, the failover time." default:"10" env:"FELIX_RAFT_ELECTION_TICKS"`
	AcceptLoss        []string      `help:"Shards (stream/shard, repeatable) whose logs may open although acknowledged records are missing from them: the log continues past the lost offsets, which are never reused and read as corrupt. Without it such a shard stays unavailable. Restore the files first if you can." name:"accept-loss" placeholder:"STREAM/SHARD" env:"FELIX_ACCEPT_LOSS"`
}

// apply sets the bounds in cfg and returns it.
func (s BrokerShards) apply(cfg broker.Config) broker.Config {
	cfg.MaxOpenShards = s.MaxOpenShards
	cfg.LogMemory = s.LogMemory
	cfg.MinFreeBytes = s.MinFreeBytes
	cfg.MaxShards = s.MaxShards
	cfg.SegmentSize = s.SegmentSize
	cfg.ParkedSync = s.ParkedSync
	cfg.RetentionCheck = s.RetentionCheck
	cfg.AcceptLoss = s.AcceptLoss
	cfg.RaftTick = s.RaftTick
	cfg.RaftElectionTicks = s.RaftElectionTicks
	return cfg
}
