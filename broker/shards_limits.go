package broker

// DefaultMaxShards is Config.MaxShards's default.
const DefaultMaxShards = 16384

// DefaultMaxOpenShards is Config.MaxOpenShards's default where the
// file-descriptor limit does not lower it.
const DefaultMaxOpenShards = 1024

// DefaultLogMemory is Config.LogMemory's default.
const DefaultLogMemory = 1 << 30

// Defaults of the shard logs' in-memory sizes when Config leaves them 0:
// wal's and what replicas are given (replicaConfig).
const (
	defaultSegmentSize = 1 << 20
	defaultTailBytes   = 1 << 20
)

// logMemory is the most one open shard log (or replica) of segmentSize
// and tailBytes (0: the defaults) holds in memory: tidwall's copy of its
// tail segment, a byte slice grown by append up to the segment size
// (Go grows a large slice by a quarter, so its capacity reaches 5/4 of
// it; a log that fills its segments fast gets that room at once after
// a roll instead, within the same 5/4: tidseg.Presizer), and its tail
// cache, whose records may keep up to twice tailBytes of batch buffers
// alive (wal.Options.TailBytes).
func logMemory(segmentSize, tailBytes int) int64 {
	if segmentSize <= 0 {
		segmentSize = defaultSegmentSize
	}
	if tailBytes <= 0 {
		tailBytes = defaultTailBytes
	}
	return int64(segmentSize)*5/4 + 2*int64(tailBytes)
}

// minOpenShards is the fewest open logs any budget allows.
const minOpenShards = 16

// openByMemory returns how many logs of segmentSize and tailBytes fit
// in budget bytes, never fewer than minOpenShards.
func openByMemory(budget int64, segmentSize, tailBytes int) int {
	return int(max(minOpenShards, min(budget/logMemory(segmentSize, tailBytes), 1<<30)))
}

// fdsPerShard is what one open shard log holds: tidwall's tail segment,
// the broker's own handle on it for fdatasync, the high-water-mark file and,
// once its committer has parked an fdatasync (Config.ParkedSync, or many
// busy logs: parkAtBusyLogs), that fdatasync's eventfd (package wal), the
// segment files its subscriptions read (at most three at once:
// tidseg.FilesMax, for a replica's raft log too), with room for the files
// a segment roll or a retention pass opens for a moment.
const fdsPerShard = 9

// parkAtBusyLogs is how many of a broker's shard logs must have records
// to commit at once before their committers park their fdatasyncs instead
// of blocking (wal.SyncGroup): few busy logs block, which keeps a lone
// record's and a saturated CPU's commits prompt; many park, so that their
// fdatasyncs overlap and the broker reads the network meanwhile. Measured
// with three brokers at GOMAXPROCS=1 on 2 vCPUs (docs/performance.md,
// "Parked while many logs are busy"): over 768 shards 113–121k acked records/s instead of 82–85k; over
// 6 shards (two per broker: never 4 busy) nothing changes.
const parkAtBusyLogs = 4

// fdReserve is what the budget leaves for connections, the admin listener,
// the control-plane client and the rest of the process.
const fdReserve = 256

// defaultMaxOpenShards returns DefaultMaxOpenShards, or what the process's
// file-descriptor limit allows after fdReserve, if that is smaller, but
// never less than 16.
func defaultMaxOpenShards() int {
	n := DefaultMaxOpenShards
	if lim, ok := fdLimit(); ok && lim > 0 {
		n = min(n, max(16, (int(min(lim, 1<<30))-fdReserve)/fdsPerShard))
	}
	return n
}
