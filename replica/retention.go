package replica

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/felix-broker/felix/internal/tidseg"
)

// # Retention
//
// Each replica applies the stream's retention to its own log, as Kafka
// and Redpanda do: whole segments are dropped from the front, never the
// segment being written, and never an entry that is not applied here.
// A segment goes once the log without it still holds at least
// Config.RetentionBytes (segment files counted without the zeros
// preallocated after the tail's entries, as package wal counts them;
// Kafka's rule), or once its newest record is older than
// Config.RetentionAge by the timestamp the proposer gave its entry (the
// one every replica stores) and by this replica's own clock: the segment
// file was last written before then too. The proposer's stamp alone
// would let a leader whose clock is behind have every replica drop
// records as soon as they are written. A stamp later than the file's
// last write plus clockSkew is not trusted, and the file's time dates
// the segment instead: a leader whose clock was ahead, even for one
// entry, would otherwise keep that segment, and every one after it (a
// pass stops at the first segment it keeps), until its clock's time came.
// So a log holds at least RetentionBytes once
// it has grown that far, and less than RetentionBytes plus its oldest
// segment (about Config.SegmentSize, more if one entry is larger); a
// record lives at least RetentionAge, and until its segment is complete.
//
// A leader also keeps what a follower it heard from within an election
// timeout has not yet acknowledged: that follower is caught up from the
// log rather than by a snapshot. A follower that has been silent longer
// does not hold retention back; if it comes back behind the leader's
// compaction point it gets a snapshot (compact.go) and its log goes on
// from there: the records it missed before that point are not served by
// it. Replicas decide on their own, from the same entries: their first
// offsets agree but for passes run at different moments.
//
// Nothing in this runs on a timer of the group's own: the owner calls
// EnforceRetention (the broker from one ticker for all its groups), and a
// pass does not wake a quiet group.

// confAt is the configuration the group applied at a log index.
type confAt struct {
	index uint64
	cs    *pb.ConfState
}

// retainRequest is an EnforceRetention handed to the run goroutine.
type retainRequest struct {
	now   time.Time
	reply chan retainReply // capacity 1
}

type retainReply struct {
	dropped uint64
	err     error
}

// EnforceRetention drops the oldest segments of this replica's log that
// Config.RetentionBytes or Config.RetentionAge (relative to now) no longer
// allow, and returns how many records they held. FirstOffset moves on;
// Read below it returns ErrOutOfRange. It waits for the group's goroutine
// (one round of its work); ctx bounds the wait.
func (g *Group) EnforceRetention(ctx context.Context, now time.Time) (dropped uint64, err error) {
	if g.cfg.RetentionBytes <= 0 && g.cfg.RetentionAge <= 0 {
		return 0, nil
	}
	req := retainRequest{now: now, reply: make(chan retainReply, 1)}
	g.in.Lock()
	if err := g.refusal(); err != nil {
		g.in.Unlock()
		return 0, err
	}
	g.in.retains = append(g.in.retains, req)
	g.in.Unlock()
	g.signal()
	select {
	case r := <-req.reply:
		return r.dropped, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// retain runs one retention pass on the run goroutine. An error of the
// storage fails the group (returned as fatal); others only the pass.
func (g *Group) retain(l *loop, now time.Time) (dropped uint64, err, fatal error) {
	segs, _, err := g.st.dataSegments()
	if err != nil || len(segs) < 2 {
		return 0, err, nil
	}
	limit := g.applied + 1 // the first index that must stay
	if st := g.rn.Status(); st.RaftState == raft.StateLeader {
		for id, pr := range st.Progress {
			if h, ok := l.heard[id]; id != g.cfg.ID && ok && l.ticks-h <= uint64(g.cfg.ElectionTicks) {
				limit = min(limit, pr.Match+1)
			}
		}
	}
	total := tidseg.Total(segs)
	minTS := now.Add(-g.cfg.RetentionAge).UnixNano()
	cut := uint64(0)
	for i := 0; i+1 < len(segs); i++ {
		end := segs[i+1].Index // the first index after segment i
		if end > limit {
			break
		}
		drop := g.cfg.RetentionBytes > 0 && total-segs[i].Size >= g.cfg.RetentionBytes
		if !drop && g.cfg.RetentionAge > 0 {
			ts, ok, err := g.newestRecord(l, segs[i].Index, end-1)
			if err != nil {
				return 0, err, nil
			}
			// A segment without records holds nothing to keep; one with
			// records goes once its newest is old by its stamp, unless
			// the stamp is past the file's last write here (then by
			// that), and once the file was written that long ago too.
			drop = !ok || segs[i].Dated(ts, clockSkew) < minTS && segs[i].ModTime.UnixNano() < minTS
		}
		if !drop {
			break
		}
		total -= segs[i].Size
		cut = end
	}
	if cut == 0 {
		return 0, nil, nil
	}
	first, next := g.offs.firstOffset(), g.offs.nextAfter(cut-1)
	if err := g.st.compact(cut, next, g.confAt(cut-1)); err != nil {
		return 0, nil, err
	}
	g.offs.compact(cut, next)
	g.dropConfsBefore(cut)
	for index := range l.segTS {
		if index < cut {
			delete(l.segTS, index)
		}
	}
	g.logger.Debug("replica: retention dropped the log's oldest segments", "before_index", cut, "records", next-first, "first_offset", next)
	return next - first, nil, nil
}

// newestRecord returns the timestamp of the newest entry with records
// among [from, to], a complete segment's entries, reading it once per
// segment (l.segTS remembers it). ok is false if none holds records.
func (g *Group) newestRecord(l *loop, from, to uint64) (ts int64, ok bool, err error) {
	if ts, ok := l.segTS[from]; ok {
		return ts, ts != noRecords, nil
	}
	ts = noRecords
	for i := to; i >= from && i > g.st.p.snapIndex; i-- {
		typ, _, data, err := g.st.readEntry(i)
		if err != nil {
			return 0, false, err
		}
		if typ != pb.EntryNormal || len(data) == 0 {
			continue
		}
		h, _, err := decodeBatchHeader(data)
		if err != nil || h.count == 0 {
			continue
		}
		ts = h.ts
		break
	}
	l.segTS[from] = ts
	return ts, ts != noRecords, nil
}

// clockSkew is how far a proposer's stamp may be past the time this
// replica last wrote the segment file holding it and still date the
// segment (retention by age): clocks of a cluster's brokers agree to well
// within it, and a stamp further ahead was taken by a clock that was
// wrong.
const clockSkew = time.Minute

// noRecords marks a segment without records in loop.segTS.
const noRecords = -1 << 63

// confAt returns the configuration as of index (applied here, and at or
// after the compaction point).
func (g *Group) confAt(index uint64) *pb.ConfState {
	cs := g.st.p.conf
	for _, c := range g.confs {
		if c.index > index {
			break
		}
		cs = c.cs
	}
	return cs
}

// dropConfsBefore forgets the configurations applied before index, now
// that the state file holds the one in force there.
func (g *Group) dropConfsBefore(index uint64) {
	k := 0
	for k < len(g.confs) && g.confs[k].index < index {
		k++
	}
	g.confs = append(g.confs[:0], g.confs[k:]...)
}

// snapshot is raft's Storage.Snapshot for a leader that has dropped the
// entries a follower needs: the compaction point, or, if configuration
// changes were applied after it, the last of them (a replica being added
// is in the configuration only from that change on, and raft would not
// let it install a snapshot that leaves it out). See compact.go.
func (g *Group) snapshot() (*pb.Snapshot, error) {
	index, cs := g.st.p.snapIndex, g.st.p.conf
	if n := len(g.confs); n > 0 {
		index, cs = g.confs[n-1].index, g.confs[n-1].cs
	}
	if index == 0 {
		return &pb.Snapshot{Metadata: &pb.SnapshotMetadata{ConfState: cloneConf(cs), Index: new(uint64(0)), Term: new(uint64(0))}}, nil
	}
	term, err := g.st.Term(index)
	if err != nil {
		return nil, fmt.Errorf("replica: group %q: snapshot at %d: %w", g.cfg.Name, index, err)
	}
	var state []byte
	if g.cfg.SnapshotState != nil {
		state = g.cfg.SnapshotState()
	}
	return &pb.Snapshot{
		Data:     snapshotData(g.offs.nextAfter(index), state),
		Metadata: &pb.SnapshotMetadata{ConfState: cloneConf(cs), Index: new(index), Term: new(term)},
	}, nil
}

// restore installs the snapshot raft handed over in a Ready: the log is
// replaced (compact.go), offsets go on from the snapshot's, and the
// proposals this replica had in the dropped log fail. Those at or below
// the snapshot's index may be among the entries it covers, committed by
// another leader (this one was cut off while its followers appended
// them): their outcome is unknown, and a record told "never committed"
// would be routed again and written twice. Those above it were replaced:
// raft installs a snapshot only when this log does not hold the
// snapshot's last entry, and then, by log matching, holds none of the
// leader's entries after it either.
func (g *Group) restore(l *loop, snap *pb.Snapshot) error {
	next, state, err := decodeSnapshotData(snap.GetData())
	if err != nil {
		return fmt.Errorf("replica: group %q: %w", g.cfg.Name, err)
	}
	md := snap.GetMetadata()
	index := md.GetIndex()
	if err := g.st.installSnapshot(snap, next); err != nil {
		return err
	}
	g.logger.Info("replica: installed a snapshot: the log goes on after the leader's compaction point",
		"index", index, "term", md.GetTerm(), "first_offset", next, "dropped_from_offset", g.offs.nextOffset())
	lead, term := g.leader.Load(), g.term.Load()
	for i, w := range l.byIndex {
		delete(l.byIndex, i)
		if i <= index {
			w.fail(fmt.Errorf("replica: group %q: its log was replaced by a snapshot covering the record's entry (index %d, through %d), which may hold it committed: %w", g.cfg.Name, i, index, ErrUnknownOutcome))
			continue
		}
		w.fail(&NotLeaderError{Group: g.cfg.Name, Leader: lead, Term: term, Replaced: true})
	}
	g.offs.reset(index+1, next)
	g.applied, g.confs = index, nil
	clear(l.segTS)
	g.conf.Store(cloneConf(md.GetConfState()))
	g.appliedTerm.Store(md.GetTerm())
	if g.cfg.OnRestore != nil {
		g.cfg.OnRestore(state)
	}
	return nil
}

func cloneConf(cs *pb.ConfState) *pb.ConfState {
	if cs == nil {
		return &pb.ConfState{}
	}
	return proto.Clone(cs).(*pb.ConfState)
}
