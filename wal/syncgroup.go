package wal

import "sync/atomic"

// SyncGroup is shared by the logs of one process that write to one disk
// (a broker's shard logs, through Options.SyncGroup). It counts the logs
// whose committer has records to commit, and while at least its threshold
// of them have, their committers park their fdatasyncs (as with
// Options.ParkedSync) instead of blocking.
//
// Why: a blocking fdatasync keeps its goroutine's P for the whole call
// (Go's monitor hands the P to another thread only after seeing the same
// syscall twice, and its tick is too coarse on a small VM to see one of a
// few hundred microseconds), so with few Ps the fdatasyncs of many busy
// logs run one after another while the process's network input waits.
// Parked, they overlap, and the P serves the network meanwhile. But a
// parked commit's completion waits for the scheduler to run its goroutine
// again, which costs a lone or saturated log more than it saves; so the
// logs block while few of them are busy, and park when many are.
// Measured on a 2-vCPU VM with brokers at GOMAXPROCS=1 (README, "Latency
// under load"): 768 shards 113–121k acked records/s against 82–85k,
// 6 shards (never 4 busy logs per broker) unchanged.
//
// The zero value is not usable: make one with NewSyncGroup.
type SyncGroup struct {
	parkAt int64
	busy   atomic.Int64 // logs whose committer has taken records and not yet found none
}

// NewSyncGroup returns a group whose logs park their fdatasyncs while at
// least parkAt of them are busy (parkAt < 1 is taken as 1: always).
func NewSyncGroup(parkAt int) *SyncGroup {
	return &SyncGroup{parkAt: int64(max(1, parkAt))}
}

// Busy returns how many of the group's logs have records to commit.
func (g *SyncGroup) Busy() int { return int(g.busy.Load()) }

// park reports whether a commit should park its fdatasync now.
func (g *SyncGroup) park() bool { return g != nil && g.busy.Load() >= g.parkAt }

// busyLog is one committer's membership in its log's group: set busy when
// it takes records, idle when it finds none. A nil group does nothing.
type busyLog struct {
	g    *SyncGroup
	busy bool
}

func (b *busyLog) set(busy bool) {
	if b.g == nil || b.busy == busy {
		return
	}
	b.busy = busy
	if busy {
		b.g.busy.Add(1)
	} else {
		b.g.busy.Add(-1)
	}
}
