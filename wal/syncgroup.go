package wal

import "sync/atomic"

// SyncGroup is shared by the logs of one process that write to one disk
// (a broker's shard logs, through Options.SyncGroup). It counts the logs
// whose committer has records to commit, and while at least its threshold
// of them have, their committers park their fdatasyncs (as with
// Options.ParkedSync) instead of blocking; while any of them has, a lone
// record committed inline hands its P on (see tailSync).
//
// Why: an ordinary blocking fdatasync keeps its goroutine's P for the
// whole call (Go's monitor hands the P to another thread only after seeing
// the same syscall twice, and its tick is too coarse on a small VM to see
// one of a few hundred microseconds), so with few Ps the fdatasyncs of
// many busy logs would run one after another while the process's network
// input waits. The committers' blocking fdatasyncs hand the P on, and
// parked ones need no thread at all: with hundreds of busy logs, parking
// keeps hundreds of threads from blocking in the kernel at once. A parked
// commit's completion waits for the scheduler to run its goroutine again,
// which costs a lone or saturated log more than it saves; so the logs
// block while few of them are busy, and park when many are.
// Measured on a 2-vCPU VM with brokers at GOMAXPROCS=1
// (docs/performance.md, "Parked while many logs are busy"): 768 shards 113–121k acked records/s against 82–85k,
// 6 shards (never 4 busy logs per broker) unchanged.
//
// The zero value is not usable: make one with NewSyncGroup.
type SyncGroup struct {
	parkAt int64
	busy   atomic.Int64  // logs whose committer has taken records and not yet found none
	parked atomic.Uint64 // fdatasyncs the members parked
}

// NewSyncGroup returns a group whose logs park their fdatasyncs while at
// least parkAt of them are busy (parkAt < 1 is taken as 1: always).
func NewSyncGroup(parkAt int) *SyncGroup {
	return &SyncGroup{parkAt: int64(max(1, parkAt))}
}

// Busy returns how many of the group's logs have records to commit (a nil
// group: none).
func (g *SyncGroup) Busy() int {
	if g == nil {
		return 0
	}
	return int(g.busy.Load())
}

// Parked returns how many fdatasyncs the group's members have parked (a
// nil group: none).
func (g *SyncGroup) Parked() uint64 {
	if g == nil {
		return 0
	}
	return g.parked.Load()
}

// Park reports whether a commit should park its fdatasync now: at least
// the threshold of the group's logs are busy. A nil group never parks.
func (g *SyncGroup) Park() bool { return g != nil && g.busy.Load() >= g.parkAt }

// Member returns a log's (or a replica's) membership in g, idle. g may be
// nil: the membership then does nothing.
func (g *SyncGroup) Member() SyncMember { return SyncMember{g: g} }

// SyncMember is one log's membership in its SyncGroup, owned by the
// goroutine that commits the log: busy from when it has records to commit
// until it finds none.
type SyncMember struct {
	g    *SyncGroup
	busy bool
}

// Park reports whether the member's commit should park its fdatasync now
// (its group's Park).
func (m *SyncMember) Park() bool { return m.g.Park() }

// Parking counts one fdatasync the member is about to park in its
// group's Parked.
func (m *SyncMember) Parking() {
	if m.g != nil {
		m.g.parked.Add(1)
	}
}

// SetBusy marks the member busy or idle.
func (m *SyncMember) SetBusy(busy bool) {
	if m.g == nil || m.busy == busy {
		return
	}
	m.busy = busy
	if busy {
		m.g.busy.Add(1)
	} else {
		m.g.busy.Add(-1)
	}
}
