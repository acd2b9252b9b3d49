package replica

import (
	"errors"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// FuzzStep hands arbitrary decoded raft messages to the replicas of a
// 3-replica in-memory cluster, addressed from one replica to another
// (when the input asks) so that they get past the id checks. Whatever the
// message, the process must not go down, and no replica may fail: what
// raft would panic on must be refused by Step (ErrBadMessage) or dropped
// by the check against the log. Every few inputs the cluster must still
// commit a record. That last check is stronger than raft gives: raft
// trusts what a peer claims (a leader of some term, a commit index, a
// snapshot), so fabricated claims in a peer's name can stall the group,
// and after several seconds of fuzzing this target does meet such a
// sequence and reports it (the commit's wait is taken for a hung input).
// Authentication keeps strangers from making claims; a peer's bugs are
// what these checks are for.
func FuzzStep(f *testing.F) {
	add := func(to, from byte, m *pb.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(to, from, b)
	}
	add(1, 2, &pb.Message{Type: pb.MsgHeartbeat.Enum(), Term: new(uint64(3)), Commit: new(uint64(1 << 40))})
	add(2, 1, &pb.Message{Type: pb.MsgHeartbeat.Enum(), Term: new(uint64(1)), Commit: new(uint64(3))})
	add(1, 2, &pb.Message{Type: pb.MsgAppResp.Enum(), Term: new(uint64(1)), Index: new(uint64(1 << 40))})
	add(1, 2, &pb.Message{Type: pb.MsgAppResp.Enum(), Term: new(uint64(1)), Index: new(uint64(1)), Reject: new(true), RejectHint: new(uint64(1 << 40)), LogTerm: new(uint64(1))})
	add(3, 1, &pb.Message{Type: pb.MsgApp.Enum(), Term: new(uint64(2)), Index: new(uint64(1)), LogTerm: new(uint64(1)), Commit: new(uint64(9)),
		Entries: entries(2, 2, 3)})
	add(3, 1, &pb.Message{Type: pb.MsgApp.Enum(), Term: new(uint64(5)), Index: new(uint64(0)), LogTerm: new(uint64(0)), Commit: new(uint64(1)),
		Entries: entries(1, 5, 2)})
	add(2, 3, &pb.Message{Type: pb.MsgVote.Enum(), Term: new(uint64(9)), Index: new(uint64(1 << 40)), LogTerm: new(uint64(9))})
	add(2, 3, &pb.Message{Type: pb.MsgPreVote.Enum(), Term: new(uint64(2)), Index: new(uint64(3)), LogTerm: new(uint64(1))})
	add(1, 3, &pb.Message{Type: pb.MsgTimeoutNow.Enum(), Term: new(uint64(1))})
	add(0, 0, &pb.Message{Type: pb.MsgSnap.Enum(), To: new(uint64(1)), From: new(uint64(2)), Term: new(uint64(1))})
	add(2, 1, &pb.Message{Type: pb.MsgSnap.Enum(), Term: new(uint64(4)), Snapshot: &pb.Snapshot{Data: snapshotData(7, nil),
		Metadata: &pb.SnapshotMetadata{Index: new(uint64(40)), Term: new(uint64(3)), ConfState: &pb.ConfState{Voters: []uint64{1, 2, 3}}}}})
	add(3, 2, &pb.Message{Type: pb.MsgSnap.Enum(), Term: new(uint64(1)), Snapshot: &pb.Snapshot{Data: snapshotData(0, nil),
		Metadata: &pb.SnapshotMetadata{Index: new(uint64(1)), Term: new(uint64(1)), ConfState: &pb.ConfState{Voters: []uint64{1, 2}, Learners: []uint64{3}}}}})

	c := newCluster(f, 3, 31, nil)
	c.waitLeader()
	inputs := 0
	f.Fuzz(func(t *testing.T, to, from byte, data []byte) {
		c.t = t // the cluster's helpers report to this input's test
		defer func() { c.t = f }()
		m := &pb.Message{}
		if proto.Unmarshal(data, m) != nil {
			return
		}
		if to != 0 {
			m.To = new(uint64(to%3 + 1))
		}
		if from != 0 {
			m.From = new(uint64(from%3 + 1))
		}
		g := c.group(m.GetTo())
		if g == nil {
			g = c.group(1)
		}
		if err := g.Step(m); err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("Step: %v", err)
			}
			return
		}
		waitTaken(t, g)
		for _, g := range c.running() {
			if err := failure(g); err != nil {
				t.Fatalf("replica %d failed after %v: %v", g.ID(), m, err)
			}
		}
		if inputs++; inputs%50 == 0 {
			c.commit([]byte("still going"))
		}
	})
}
