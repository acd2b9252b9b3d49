package bench

import (
	"github.com/felix-broker/felix/client"
)

// commitKey names one commit of one shard's log: its owner stamps every
// record of a commit (one write, one fdatasync; see wal's committer) with
// the same commit timestamp, and no two commits of a shard share one
// unless the clock stood still across an fsync.
type commitKey struct {
	owner  string
	stream string
	shard  int
	ts     int64
}

// ackGroups counts acks and the distinct commits they came from, to
// derive records per fsync from what a client can see. Not safe for
// concurrent use: give each goroutine its own and merge.
type ackGroups struct {
	records int64
	commits map[commitKey]struct{}
	last    commitKey // the commit of the last ack added, already in commits
}

func newAckGroups() *ackGroups { return &ackGroups{commits: make(map[commitKey]struct{})} }

func (g *ackGroups) add(a client.Ack) {
	g.records++
	k := commitKey{owner: a.Owner, stream: a.Stream, shard: a.Shard, ts: a.Timestamp.UnixNano()}
	if k == g.last && g.records > 1 {
		return // the same commit as the last ack, the usual case: no hashing
	}
	g.commits[k], g.last = struct{}{}, k
}

func (g *ackGroups) merge(o *ackGroups) {
	g.records += o.records
	for k := range o.commits {
		g.commits[k] = struct{}{}
	}
}

// perFsync returns records per commit, or false with no acks.
func (g *ackGroups) perFsync() (float64, bool) {
	if len(g.commits) == 0 {
		return 0, false
	}
	return float64(g.records) / float64(len(g.commits)), true
}
