package replica

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/felix-broker/felix/internal/syncbuf"
)

// failure returns why g stopped, or nil.
func failure(g *Group) error {
	g.in.Lock()
	defer g.in.Unlock()
	return g.in.err
}

// waitTaken waits until g's goroutine has taken all the work handed to
// it so far (appends, peers' messages, ticks) and finished the round that
// took it, or has stopped. It looks at the work itself, not at a count of
// rounds: appends made in a row can be taken over more than one round,
// and a count read before the work was handed over can be passed by
// rounds that did not take it (the ticker's, while the caller was
// descheduled).
func waitTaken(t testing.TB, g *Group) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	wait := func(what string, done func() bool) bool {
		for !done() {
			select {
			case <-g.done:
				return false
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d: %s within 20s", g.ID(), what)
			}
			time.Sleep(time.Millisecond)
		}
		return true
	}
	if !wait("work not taken", func() bool {
		g.in.Lock()
		defer g.in.Unlock()
		return len(g.in.dones)+len(g.in.msgs)+g.in.ticks == 0
	}) {
		return
	}
	// A wake-up with nothing new makes a round that ends after any round
	// in progress.
	r := g.rounds.Load()
	g.signal()
	wait("no round of work", func() bool { return g.rounds.Load() > r })
}

func entries(first, term uint64, n int) []*pb.Entry {
	var ents []*pb.Entry
	for i := range n {
		ents = append(ents, &pb.Entry{Index: new(first + uint64(i)), Term: new(term), Type: pb.EntryNormal.Enum()})
	}
	return ents
}

// Step refuses, before raft sees them, messages no correct peer sends.
func TestStepRefusesWhatNoPeerSends(t *testing.T) {
	c := newCluster(t, 3, 21, nil)
	lead := c.waitLeader()
	c.commit([]byte("before"))
	var f *Group
	for _, g := range c.running() {
		if g != lead {
			f = g
		}
	}
	_, term := f.Leader()
	from := lead.ID()
	msg := func(typ pb.MessageType) *pb.Message {
		return &pb.Message{Type: typ.Enum(), To: new(f.ID()), From: new(from), Term: new(term)}
	}
	cases := map[string]*pb.Message{}
	cases["wrong to"] = msg(pb.MsgHeartbeat)
	cases["wrong to"].To = new(uint64(9))
	cases["from 0"] = msg(pb.MsgHeartbeat)
	cases["from 0"].From = new(uint64(0))
	cases["from self"] = msg(pb.MsgHeartbeat)
	cases["from self"].From = new(f.ID())
	for _, typ := range []pb.MessageType{pb.MsgHup, pb.MsgBeat, pb.MsgProp, pb.MsgUnreachable, pb.MsgSnapStatus,
		pb.MsgCheckQuorum, pb.MsgTransferLeader, pb.MsgReadIndex, pb.MsgReadIndexResp, pb.MsgStorageAppend,
		pb.MsgStorageAppendResp, pb.MsgStorageApply, pb.MsgStorageApplyResp, pb.MsgForgetLeader, pb.MessageType(99)} {
		cases["type "+typ.String()] = msg(typ)
	}
	cases["term 0"] = msg(pb.MsgApp)
	cases["term 0"].Term = new(uint64(0))
	cases["term over the bound"] = msg(pb.MsgVote)
	cases["term over the bound"].Term = new(uint64(1<<64 - 1))
	cases["log term above term"] = msg(pb.MsgVote)
	cases["log term above term"].LogTerm = new(term + 1)
	cases["snapshot"] = msg(pb.MsgHeartbeat)
	cases["snapshot"].Snapshot = &pb.Snapshot{Metadata: &pb.SnapshotMetadata{Index: new(uint64(5)), Term: new(term)}}
	snap := func(name string, index, snapTerm uint64, data []byte, cs *pb.ConfState) {
		m := msg(pb.MsgSnap)
		m.Snapshot = &pb.Snapshot{Data: data, Metadata: &pb.SnapshotMetadata{Index: new(index), Term: new(snapTerm), ConfState: cs}}
		cases["snapshot: "+name] = m
	}
	good := &pb.ConfState{Voters: []uint64{1, 2, 3}}
	cases["snapshot: none"] = msg(pb.MsgSnap)
	snap("index 0", 0, term, snapshotData(5, nil), good)
	snap("index past the bound", 1<<63, term, snapshotData(5, nil), good)
	snap("term above the message's", 50, term+1, snapshotData(5, nil), good)
	snap("data of another version", 50, term, []byte{3, 0, 0, 0, 0, 0, 0, 0, 0, 1}, good)
	snap("version 2 data without state", 50, term, []byte{2, 0, 0, 0, 0, 0, 0, 0, 0}, good)
	snap("data cut short", 50, term, snapshotData(5, nil)[:4], good)
	snap("no voters", 50, term, snapshotData(5, nil), &pb.ConfState{Learners: []uint64{4}})
	snap("replica 0", 50, term, snapshotData(5, nil), &pb.ConfState{Voters: []uint64{0, 1}})
	snap("voter twice", 50, term, snapshotData(5, nil), &pb.ConfState{Voters: []uint64{1, 1, 2}})
	snap("voter and learner", 50, term, snapshotData(5, nil), &pb.ConfState{Voters: []uint64{1, 2}, Learners: []uint64{2}})
	snap("next learner not outgoing", 50, term, snapshotData(5, nil), &pb.ConfState{Voters: []uint64{1, 2}, LearnersNext: []uint64{3}})
	snap("auto leave outside a joint configuration", 50, term, snapshotData(5, nil), &pb.ConfState{Voters: []uint64{1, 2}, AutoLeave: new(true)})
	cases["entries in a heartbeat"] = msg(pb.MsgHeartbeat)
	cases["entries in a heartbeat"].Entries = entries(3, term, 1)
	gap := msg(pb.MsgApp)
	gap.Index, gap.LogTerm = new(uint64(2)), new(term)
	gap.Entries = append(entries(3, term, 1), entries(5, term, 1)...)
	cases["entries not contiguous"] = gap
	notNext := msg(pb.MsgApp)
	notNext.Index, notNext.LogTerm = new(uint64(2)), new(term)
	notNext.Entries = entries(4, term, 2)
	cases["entries not after index"] = notNext
	future := msg(pb.MsgApp)
	future.Index, future.LogTerm = new(uint64(2)), new(term)
	future.Entries = entries(3, term+5, 1)
	cases["entry of a later term than the message"] = future
	falling := msg(pb.MsgApp)
	falling.Index, falling.LogTerm = new(uint64(2)), new(term)
	falling.Entries = append(entries(3, term, 1), entries(4, term-1, 1)...)
	cases["entry terms decrease"] = falling
	conf := msg(pb.MsgApp)
	conf.Index, conf.LogTerm = new(uint64(2)), new(term)
	conf.Entries = entries(3, term, 1)
	conf.Entries[0].Type = pb.EntryConfChangeV2.Enum()
	conf.Entries[0].Data = []byte{0xff, 0xff, 0xff}
	cases["configuration change that does not decode"] = conf
	confV1 := msg(pb.MsgApp)
	confV1.Index, confV1.LogTerm = new(uint64(2)), new(term)
	confV1.Entries = entries(3, term, 1)
	confV1.Entries[0].Type = pb.EntryConfChange.Enum()
	cases["configuration change of version 1"] = confV1
	overflow := msg(pb.MsgApp)
	overflow.Index, overflow.LogTerm = new(uint64(1<<64-1)), new(term)
	overflow.Entries = entries(0, term, 1)
	cases["index overflow"] = overflow

	for name, m := range cases {
		if err := f.Step(m); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: Step = %v, want ErrBadMessage", name, err)
		}
	}
	c.commit([]byte("after"))
	c.waitConverged(2)
	if err := failure(f); err != nil {
		t.Fatalf("follower failed: %v", err)
	}
}

// loggedCluster starts three replicas that log into logs, commits three
// records and returns the leader.
func loggedCluster(t *testing.T, seed uint64, opts func(*Config)) (c *cluster, lead *Group, logs *syncbuf.Buffer) {
	t.Helper()
	logs = &syncbuf.Buffer{}
	c = newCluster(t, 3, seed, func(cfg *Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
		if opts != nil {
			opts(cfg)
		}
	})
	lead = c.waitLeader()
	for i := range 3 {
		c.commit(fmt.Appendf(nil, "r%d", i))
	}
	c.waitConverged(3)
	return c, lead, logs
}

// commitBomb passes Step's checks but makes etcd raft panic when stepped:
// a heartbeat of a newer term whose commit index lies far beyond the log
// (a leader becomes a follower and commits to it; raft asserts that the
// log reaches it).
func commitBomb(to, from, term uint64) *pb.Message {
	return &pb.Message{Type: pb.MsgHeartbeat.Enum(), To: new(to), From: new(from), Term: new(term + 1), Commit: new(uint64(1 << 40))}
}

// Messages that contradict the log are dropped by the check against it:
// the group goes on, and says so once per peer and type.
func TestStepDropsMessagesThatContradictTheLog(t *testing.T) {
	c, lead, logs := loggedCluster(t, 22, nil)
	_, term := lead.Leader()
	peer := lead.ID()%3 + 1
	f := c.group(peer)
	for _, s := range []struct {
		g *Group
		m *pb.Message
	}{
		{lead, commitBomb(lead.ID(), peer, term)},
		{f, &pb.Message{Type: pb.MsgHeartbeat.Enum(), To: new(peer), From: new(lead.ID()), Term: new(term), Commit: new(uint64(1 << 40))}},
		{lead, &pb.Message{Type: pb.MsgAppResp.Enum(), To: new(lead.ID()), From: new(peer), Term: new(term), Index: new(uint64(1 << 40))}},
	} {
		if err := s.g.Step(s.m); err != nil {
			t.Fatalf("Step %s: %v", s.m.GetType(), err)
		}
		waitTaken(t, s.g)
		if err := failure(s.g); err != nil {
			t.Fatalf("replica %d failed on %s: %v", s.g.ID(), s.m.GetType(), err)
		}
	}
	c.commit([]byte("after"))
	c.checkSame(c.waitConverged(4))
	for _, want := range []string{"type=MsgHeartbeat", "type=MsgAppResp", "dropped a peer's message"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no log line with %q", want)
		}
	}
}

// With the check against the log off (Knobs.UncheckedStep), the same
// message makes raft panic on the leader's goroutine: the panic is
// contained. The leader fails with a *RaftPanicError naming the peer and
// the message type, its pending appends get ErrUnknownOutcome, later
// calls ErrFailed, a log line names
// the peer and type, and the other replicas elect a leader and go on.
// Without the containment this test takes the test binary down.
func TestRaftPanicIsContained(t *testing.T) {
	c, lead, logs := loggedCluster(t, 23, func(cfg *Config) {
		cfg.Knobs.UncheckedStep = true
		cfg.ElectionTicks = 30
	})
	_, term := lead.Leader()
	peer := lead.ID()%3 + 1
	// Keep the leader's next appends from committing: its messages to the
	// followers are lost.
	for _, id := range c.ids {
		if id != lead.ID() {
			c.net.Cut(lead.ID(), id)
		}
	}
	var pending []<-chan result
	for i := range 5 {
		pending = append(pending, appendTo(lead, fmt.Appendf(nil, "pending%d", i)))
	}
	waitTaken(t, lead) // proposed and written, not committed
	if err := lead.Step(commitBomb(lead.ID(), peer, term)); err != nil {
		t.Fatalf("Step: %v", err)
	}
	select {
	case <-lead.done:
	case <-time.After(20 * time.Second):
		t.Fatal("the leader did not stop within 20s")
	}
	err := failure(lead)
	var pe *RaftPanicError
	if !errors.As(err, &pe) || !errors.Is(err, ErrFailed) {
		t.Fatalf("group failed with %v, want a *RaftPanicError", err)
	}
	if pe.From != peer || pe.Type != "MsgHeartbeat" || !strings.Contains(fmt.Sprint(pe.Value), "out of range") {
		t.Fatalf("RaftPanicError names %d %s %v, want peer %d MsgHeartbeat and raft's commit panic", pe.From, pe.Type, pe.Value, peer)
	}
	for i, ch := range pending {
		select {
		case r := <-ch:
			if !errors.Is(r.err, ErrUnknownOutcome) {
				t.Errorf("pending append %d: offset %d, err %v; want ErrUnknownOutcome", i, r.offset, r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("pending append %d: no outcome", i)
		}
	}
	if r := <-appendTo(lead, []byte("later")); !errors.Is(r.err, ErrFailed) {
		t.Errorf("append after the panic: %v, want ErrFailed", r.err)
	}
	if err := lead.Step(commitBomb(lead.ID(), peer, term)); !errors.Is(err, ErrFailed) {
		t.Errorf("Step after the panic: %v, want ErrFailed", err)
	}
	line := ""
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "raft panicked") {
			line = l
			break
		}
	}
	if !strings.Contains(line, fmt.Sprintf("peer=%d", peer)) || !strings.Contains(line, "type=MsgHeartbeat") {
		t.Errorf("log line %q does not name peer %d and MsgHeartbeat", line, peer)
	}
	// The others go on without it.
	c.kill(lead.ID())
	c.waitLeader()
	c.commit([]byte("after"))
}

// oneRound holds replica 1's goroutine in the fdatasync of the append it
// is handed first, so that the messages stepped meanwhile are taken
// together, in one round: block(first) steps first and returns once the
// goroutine waits; release lets it go on.
type oneRound struct {
	armed, blocking, unblock chan struct{}
}

func newOneRound() *oneRound {
	return &oneRound{armed: make(chan struct{}, 1), blocking: make(chan struct{}, 1), unblock: make(chan struct{})}
}

// beforeSync is replica 1's Knobs.BeforeSync.
func (r *oneRound) beforeSync(uint64) error {
	select {
	case <-r.armed:
		r.blocking <- struct{}{}
		<-r.unblock
	default:
	}
	return nil
}

func (r *oneRound) block(t *testing.T, g *Group, first *pb.Message) {
	t.Helper()
	r.armed <- struct{}{}
	if err := g.Step(first); err != nil {
		t.Fatal(err)
	}
	<-r.blocking
}

// cutLogInOneRound starts three replicas ticked by hand and stops 2 and 3,
// whose messages the test writes. In 2's name, at term 2, it appends
// entries 1..5 of term 1 to replica 1, none committed, and holds 1's
// goroutine in their fdatasync; then it steps an append at term 2 that
// conflicts at index 1 (raft cuts its in-memory log back to index 1,
// while 5 entries are still on disk) followed by then, all taken in the
// next round.
func cutLogInOneRound(t *testing.T, seed uint64, then ...*pb.Message) *Group {
	t.Helper()
	round := newOneRound()
	c := newClusterTickedByHand(t, 3, seed, func(cfg *Config) {
		if cfg.ID == 1 {
			cfg.Knobs.BeforeSync = round.beforeSync
		}
	})
	c.kill(2)
	c.kill(3)
	g := c.group(1)
	app := &pb.Message{Type: pb.MsgApp.Enum(), To: new(uint64(1)), From: new(uint64(2)), Term: new(uint64(2)),
		Index: new(uint64(0)), LogTerm: new(uint64(0)), Commit: new(uint64(0)), Entries: entries(1, 1, 5)}
	round.block(t, g, app)
	conflict := &pb.Message{Type: pb.MsgApp.Enum(), To: new(uint64(1)), From: new(uint64(2)), Term: new(uint64(2)),
		Index: new(uint64(0)), LogTerm: new(uint64(0)), Commit: new(uint64(0)), Entries: entries(1, 2, 1)}
	for _, m := range append([]*pb.Message{conflict}, then...) {
		if err := g.Step(m); err != nil {
			t.Fatal(err)
		}
	}
	close(round.unblock)
	waitTaken(t, g)
	return g
}

// A heartbeat whose commit index lies beyond raft's log, cut back by an
// append earlier in the same round, is dropped, though the log on disk
// still reaches it (the cut is written at the end of the round): raft
// would panic "tocommit(5) is out of range [lastIndex(1)]".
func TestHeartbeatBeyondALogCutInTheSameRoundIsDropped(t *testing.T) {
	hb := &pb.Message{Type: pb.MsgHeartbeat.Enum(), To: new(uint64(1)), From: new(uint64(2)), Term: new(uint64(2)), Commit: new(uint64(5))}
	g := cutLogInOneRound(t, 77, hb)
	if err := failure(g); err != nil {
		t.Fatalf("replica failed on a heartbeat Step should have dropped: %v", err)
	}
}

// The same on a leader's side: an acknowledgement, in the round in which
// raft's log was cut back and the replica then elected, of entries on
// disk but no longer in raft's log is dropped. raft would take the peer
// to hold them and send it from beyond its own log (it panics: "need
// non-empty snapshot").
func TestAcknowledgementBeyondALogCutInTheSameRoundIsDropped(t *testing.T) {
	msg := func(typ pb.MessageType, from, term uint64) *pb.Message {
		return &pb.Message{Type: typ.Enum(), To: new(uint64(1)), From: new(from), Term: new(term)}
	}
	// 2, leading term 2, hands its leadership to 1, which campaigns at
	// term 3 and gets the votes of 2 and 3; 2 then acknowledges index 5.
	ack := msg(pb.MsgAppResp, 2, 3)
	ack.Index = new(uint64(5))
	g := cutLogInOneRound(t, 78, msg(pb.MsgTimeoutNow, 2, 2), msg(pb.MsgVoteResp, 2, 3), msg(pb.MsgVoteResp, 3, 3), ack)
	if err := failure(g); err != nil {
		t.Fatalf("replica failed on an acknowledgement Step should have dropped: %v", err)
	}
	if !g.IsLeader() {
		t.Fatalf("replica 1 was not elected in the round; the test does not test what it says")
	}
}

// A MsgTimeoutNow makes raft's follower start an election at once (term+1,
// no pre-vote, the leader lease ignored). One from a replica that does not
// lead is dropped and logged: it does not depose the leader.
func TestTimeoutNowFromAReplicaNotLeadingIsDropped(t *testing.T) {
	c, lead, logs := loggedCluster(t, 91, nil)
	var f, other *Group
	for _, g := range c.running() {
		switch {
		case g == lead:
		case f == nil:
			f = g
		default:
			other = g
		}
	}
	_, term := f.Leader()
	for _, m := range []*pb.Message{
		{Type: pb.MsgTimeoutNow.Enum(), To: new(f.ID()), From: new(other.ID()), Term: new(term)},
		{Type: pb.MsgTimeoutNow.Enum(), To: new(f.ID()), From: new(lead.ID()), Term: new(term + 1)},
	} {
		if err := f.Step(m); err != nil {
			t.Fatalf("Step: %v", err)
		}
	}
	waitTaken(t, f)
	time.Sleep(300 * time.Millisecond) // an election, if one started, ends
	if _, nt := lead.Leader(); !lead.IsLeader() || nt != term {
		t.Fatalf("a MsgTimeoutNow from a replica that does not lead deposed leader %d (term %d -> %d)", lead.ID(), term, nt)
	}
	if !strings.Contains(logs.String(), "dropped a MsgTimeoutNow") {
		t.Errorf("no log line for the dropped MsgTimeoutNow")
	}
}

// A snapshot beyond what a follower applied that starts below the offsets
// the follower already assigned (a leader's bug) is dropped: installed, it
// would give offsets already handed out to other records.
func TestSnapshotBelowAssignedOffsetsIsDropped(t *testing.T) {
	c, lead, logs := loggedCluster(t, 92, nil)
	var f *Group
	for _, g := range c.running() {
		if g != lead {
			f = g
		}
	}
	next := f.NextOffset() // 3
	_, term := f.Leader()
	m := &pb.Message{Type: pb.MsgSnap.Enum(), To: new(f.ID()), From: new(lead.ID()), Term: new(term),
		Snapshot: &pb.Snapshot{Data: snapshotData(next-1, nil), Metadata: &pb.SnapshotMetadata{
			Index: new(uint64(1000)), Term: new(term), ConfState: &pb.ConfState{Voters: c.ids}}}}
	if err := f.Step(m); err != nil {
		t.Fatalf("Step: %v", err)
	}
	waitTaken(t, f)
	if got := f.NextOffset(); got < next {
		t.Fatalf("the follower's next offset went from %d back to %d", next, got)
	}
	if err := failure(f); err != nil {
		t.Fatalf("follower failed: %v", err)
	}
	if !strings.Contains(logs.String(), "below offset") {
		t.Errorf("no log line for the dropped snapshot")
	}
	c.commit([]byte("after"))
	c.checkSame(c.waitConverged(next + 1))
}
