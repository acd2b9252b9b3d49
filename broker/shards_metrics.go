package broker

// # Per-shard gauges
//
// felix.shard.log.size (bytes of the shard's segment files),
// felix.shard.next.offset (the offset the next record will get: one past
// the last) and felix.shard.records (next minus the first offset
// retention kept) are observed at scrape time, labelled stream and shard,
// for the shards the current map assigns to this broker. They read what
// the open logs already keep in memory (wal.Log.Size, FirstOffset,
// NextOffset: atomic loads; replica.Group's alike for a replicated
// shard's replica) under the shard set's read lock; a scrape
// opens no log and touches no file. A log closed for the open-log budget
// (Config.MaxOpenShards) reports what it showed when it closed, which is
// still true (nothing is written to a closed log); a shard whose log has
// not been opened since the broker started reports nothing.
//
// Cardinality is three series per owned shard, bounded by
// Config.ShardMetrics (default 1024 shards, in stream and shard order;
// felix.shard.metrics.omitted counts the rest; -1 turns them off).

import (
	"cmp"
	"slices"

	"github.com/felix-broker/felix/shardmap"
)

// shardStats is what the per-shard gauges report of one shard's log.
type shardStats struct {
	bytes       int64
	first, next uint64
}

func statsOf(l shardLog) shardStats {
	return shardStats{bytes: l.Size(), first: l.FirstOffset(), next: l.NextOffset()}
}

// records is how many records the log holds.
func (st shardStats) records() uint64 {
	if st.next < st.first {
		return 0
	}
	return st.next - st.first
}

type shardStat struct {
	id shardmap.ShardID
	shardStats
}

// ownedIn reports whether m assigns id to node (as its owner, or one of
// its replicas).
func ownedIn(m *shardmap.Map, id shardmap.ShardID, node string) bool {
	if m == nil {
		return false
	}
	st, ok := m.Stream(id.Stream)
	return ok && st.Placement.IsReplica(id.Shard, node)
}

// stats returns the stats of at most limit shards that m assigns to this
// broker and that have a log open or closed for the budget, in stream and
// shard order, and how many more there were. It opens nothing and does no
// I/O.
func (s *shardSet) stats(m *shardmap.Map, limit int) (out []shardStat, omitted int) {
	s.mu.RLock()
	live := make(map[shardmap.ShardID]bool, len(s.mu.entries))
	for id, e := range s.mu.entries {
		if e.gone != nil || !ownedIn(m, id, s.node) {
			continue
		}
		select {
		case <-e.ready: // e.log is set
		default:
			continue // opening
		}
		if e.sl != nil { // a log, or a replica of a replicated shard
			out = append(out, shardStat{id, statsOf(e.sl)})
			live[id] = true
		}
	}
	for id, st := range s.mu.closedStats {
		if !live[id] && ownedIn(m, id, s.node) {
			out = append(out, shardStat{id, st})
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b shardStat) int {
		return cmp.Or(cmp.Compare(a.id.Stream, b.id.Stream), cmp.Compare(a.id.Shard, b.id.Shard))
	})
	if len(out) > limit {
		omitted, out = len(out)-limit, out[:limit]
	}
	return out, omitted
}
