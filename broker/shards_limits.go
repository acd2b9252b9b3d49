package broker

// DefaultMaxShards is Config.MaxShards's default.
const DefaultMaxShards = 16384

// DefaultMaxOpenShards is Config.MaxOpenShards's default where the
// file-descriptor limit does not lower it.
const DefaultMaxOpenShards = 1024

// fdsPerShard is what one open shard log holds: tidwall's tail segment,
// the broker's own handle on it for fdatasync, the high-water-mark file and,
// with Config.ParkedSync, the eventfd of the committer's parked fdatasync
// (package wal), with room for the files a segment roll or a retention
// pass opens for a moment.
const fdsPerShard = 6

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
