package replica

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// waiter is the records of one proposed entry, waiting for its fate.
type waiter struct {
	seq         uint64
	index, term uint64 // where the entry is in the log, once a Ready has shown it
	dones       []func(offset uint64, ts int64, err error)
	proposed    time.Time // for Config.CommitTimeout: time.Now, with its monotonic reading
	timedOut    bool      // told ErrCommitTimeout; told its fate again later
}

// loop is the run goroutine's own state.
type loop struct {
	// seq numbers this run's proposals. It starts at a random point, so
	// that an entry an earlier run of this replica proposed (same raft
	// id), met again in a Ready after a restart, cannot be taken for one
	// of this run's and acked in its place.
	seq       uint64
	unindexed map[uint64]*waiter // proposed, not yet seen in a Ready, by seq
	byIndex   map[uint64]*waiter // appended to the log, by index
	entry     []byte
	stepping  *pb.Message                  // the peer message raft is stepping, for a panic's report
	taken     []func(uint64, int64, error) // appends taken from g.in, not yet proposed
	// ticks counts the ticks this run has handed to raft; heard is, per
	// peer, the value of ticks when a message from it was last stepped:
	// whether a peer answers, for a leader transfer (see transfer).
	ticks uint64
	heard map[uint64]uint64
	// quiet is whether the replica is quiesced (quiesce.go): it hands no
	// ticks to raft. lastActive is the value of ticks when a record was
	// last proposed (or the replica last woke).
	quiet      bool
	lastActive uint64
	// resigning is whether Resign was called: the replica hands its
	// leadership away whenever it has it (handOff).
	resigning bool
	woke      uint64 // the value of ticks when the replica last woke
	// segTS is, per complete segment (by its first index), the timestamp
	// of its newest record, read once for retention by age.
	segTS map[uint64]int64
	// cut is a lower bound of the last index of raft's in-memory log,
	// lowered by the appends and snapshots stepped since the last Ready
	// was handled (noteCut), which may have cut that log back below the
	// disk's; math.MaxUint64 when none was, and raft's log is the disk's
	// plus what the pending Ready appends.
	cut uint64
	// leadID and leadTerm are the leader and term whose messages set
	// leadCommit, the highest commit index that leader told this replica;
	// caughtSince is the value of ticks since when the replica has been
	// caught up, noTick if it is not (health.go).
	leadID, leadTerm, leadCommit uint64
	caughtSince                  uint64
}

// run owns the RawNode and the storage: it takes the work handed in, and
// handles each Ready, until Close or a storage failure.
//
// A panic on this goroutine (raft's assertions, which a peer's message can
// break) is contained: the group fails with a *RaftPanicError naming the
// message being stepped, and drain completes what was waiting; the process
// goes on.
func (g *Group) run() {
	defer close(g.done)
	l := &loop{seq: rand.Uint64() >> 1, unindexed: map[uint64]*waiter{}, byIndex: map[uint64]*waiter{}, heard: map[uint64]uint64{}, segTS: map[uint64]int64{}, cut: math.MaxUint64, caughtSince: noTick}
	defer g.drain(l)
	defer g.contain(l)
	// Replay the committed log first (offsets, configuration changes),
	// before any peer's message is stepped and before Open returns.
	if err := g.handleReadies(l); err != nil {
		g.fail(err)
		return
	}
	close(g.replayed)
	for {
		select {
		case <-g.stop:
			return
		case <-g.wake:
		}
		g.in.Lock()
		buf, ends, dones, msgs, ticks, term := g.in.buf, g.in.ends, g.in.dones, g.in.msgs, g.in.ticks, g.in.term
		g.in.buf, g.in.ends, g.in.dones, g.in.msgs, g.in.msgBytes, g.in.ticks = nil, nil, nil, nil, 0, 0
		transfer, admits, wake, silent, retains := g.in.transfer, g.in.admits, g.in.wake, g.in.silent, g.in.retains
		g.in.transfer, g.in.admits, g.in.wake, g.in.silent, g.in.retains = 0, nil, false, 0, nil
		resign := g.in.resign
		g.in.resign = false
		g.in.Unlock()

		l.taken = dones // to be failed by drain if raft panics before they are proposed
		l.resigning = l.resigning || resign
		work := len(dones) > 0 || transfer != 0 || len(admits) > 0 || resign
		if l.quiet {
			woken, byLeader := wake || work, false
			for _, m := range msgs {
				if wakes(m) {
					if !woken {
						byLeader = m.GetFrom() == g.leader.Load()
					}
					woken = true
				}
			}
			if woken {
				g.unquiesce(l, byLeader, silent)
			}
		}
		if silent != 0 {
			g.leaderSilent(l, silent)
		}
		if !l.quiet {
			for range ticks {
				g.rn.Tick()
			}
			l.ticks += uint64(ticks)
		}
		if work {
			l.lastActive = l.ticks
		}
		// quiesceBy is a quiesce heartbeat that no waking message followed.
		var quiesceBy *pb.Message
		for _, m := range msgs {
			switch {
			case isQuiesceHeartbeat(m):
				m.Context = nil // raft answers an ordinary heartbeat
				quiesceBy = m
			case wakes(m):
				quiesceBy = nil
			}
			if err := g.step(l, m); err != nil {
				g.fail(err)
				return
			}
		}
		if transfer != 0 && g.IsLeader() && transfer != g.cfg.ID {
			g.transfer(l, transfer)
		}
		for _, req := range admits {
			a, err := g.admit(req)
			req.reply <- admitReply{a, err}
		}
		if len(dones) > 0 {
			g.propose(l, term, buf, ends, dones)
		}
		// After the proposals taken with it: raft sends them to the
		// replica it hands over to before that one campaigns.
		if l.resigning && g.handOff(l) {
			g.in.Lock()
			g.resignedLocked()
			g.in.Unlock()
		}
		l.taken = nil
		if err := g.handleReadies(l); err != nil {
			g.fail(err)
			return
		}
		if ticks > 0 {
			g.expire(l)
		}
		for _, req := range retains {
			dropped, err, fatal := g.retain(l, req.now)
			if fatal != nil {
				req.reply <- retainReply{err: fatal}
				g.fail(fatal)
				return
			}
			req.reply <- retainReply{dropped, err}
		}
		switch {
		case l.quiet || work || wake || l.resigning: // a resigning leader hands over; it does not go quiet
		case quiesceBy != nil && g.followerQuiesces(quiesceBy):
			l.quiet = true
			g.quiet.Store(true)
		case ticks > 0:
			g.maybeQuiesce(l)
		}
		g.noteCatchUp(l)
		g.st.settle()
		g.rounds.Add(1)
	}
}

func (g *Group) handleReadies(l *loop) error {
	for g.rn.HasReady() {
		if err := g.handleReady(l); err != nil {
			return err
		}
	}
	l.cut = math.MaxUint64 // raft's log is the disk's now
	return nil
}

// step hands a peer's message to raft unless it contradicts the log
// (step.go), and returns only a storage error. The check runs against
// the shorter of the storage's log and raft's (checkAgainstLog): the
// storage lags raft when earlier messages of this round moved it on, and
// raft's may have been cut back by them. A message that fails it then is
// checked again once the pending Readys are written, after which the two
// are the same (which a correct peer's messages never need: a leader's
// commit index and a follower's acknowledgement only cover entries
// already on disk here, and that a conflicting append did not replace).
func (g *Group) step(l *loop, m *pb.Message) error {
	l.heard[m.GetFrom()] = l.ticks
	if m.GetType() == pb.MsgTimeoutNow {
		// raft's follower takes it as "campaign now": a forced election
		// at term+1, with no pre-vote and the leader lease ignored. Only
		// the leader of raft's current term sends it, handing over its
		// leadership (raft's leader transfer); from another replica (a
		// buggy or out-of-date one) it would depose a leader doing fine.
		if st := g.rn.BasicStatus(); m.GetFrom() != st.Lead || m.GetTerm() != st.GetTerm() {
			if g.dropped.First(fmt.Sprintf("%d/%s/not-leader", m.GetFrom(), m.GetType())) {
				g.logger.Warn("replica: dropped a MsgTimeoutNow from a replica that does not lead this term (logged once per peer)",
					"peer", m.GetFrom(), "term", m.GetTerm(), "leader", st.Lead, "current_term", st.GetTerm())
			}
			return nil
		}
		g.in.Lock()
		g.in.handedBy, g.in.handedAt = m.GetFrom(), time.Now()
		g.in.Unlock()
	}
	if !g.cfg.Knobs.UncheckedStep {
		why := g.checkAgainstLog(l, m)
		if why != "" && g.rn.HasReady() {
			if err := g.handleReadies(l); err != nil {
				return err
			}
			why = g.checkAgainstLog(l, m)
		}
		if why != "" {
			if cur := g.term.Load(); m.GetType() == pb.MsgHeartbeat &&
				(m.GetTerm() > cur || m.GetTerm() == cur && m.GetFrom() == g.leader.Load()) {
				// A leader sends min(match, commit): it holds this
				// replica's log to reach that far, so it was lost. Only
				// the leader of this replica's term, or a replica of a
				// later term, says so: raft ignores an older term's
				// heartbeat, a term has one leader, and a replica found
				// lost votes no more, so a stale or wrong message must
				// not be taken for it.
				g.lost.CompareAndSwap(nil, fmt.Sprintf("a heartbeat from %d at term %d: %s", m.GetFrom(), m.GetTerm(), why))
			}
			if g.dropped.First(fmt.Sprintf("%d/%s", m.GetFrom(), m.GetType())) {
				g.logger.Warn("replica: dropped a peer's message that contradicts the log (logged once per peer and type)",
					"peer", m.GetFrom(), "type", m.GetType().String(), "term", m.GetTerm(), "reason", why)
			}
			return nil
		}
	}
	if t := m.GetType(); (t == pb.MsgVote || t == pb.MsgPreVote) && g.lost.Load() != nil {
		// A replica whose log was lost forgot what it acknowledged: its
		// vote could elect a candidate that lacks an entry it helped
		// commit. It stays out of elections.
		if g.dropped.First(fmt.Sprintf("%d/%s/lost", m.GetFrom(), t)) {
			g.logger.Warn("replica: log lost; not voting", "peer", m.GetFrom(), "type", t.String(), "term", m.GetTerm())
		}
		return nil
	}
	l.stepping = m
	if err := g.rn.Step(m); err != nil {
		g.logger.Debug("replica: message refused by raft", "type", m.GetType().String(), "from", m.GetFrom(), "err", err)
	}
	l.stepping = nil
	noteCut(l, m)
	g.leaderTold(l, m)
	return nil
}

// contain turns a panic on the run goroutine into the group's failure.
// It runs before drain, which then fails what was waiting.
func (g *Group) contain(l *loop) {
	v := recover()
	if v == nil {
		return
	}
	e := &RaftPanicError{Group: g.cfg.Name, Value: v, Stack: debug.Stack()}
	if m := l.stepping; m != nil {
		e.From, e.Type = m.GetFrom(), m.GetType().String()
	}
	g.logger.Error("replica: raft panicked; the group stops until reopened, the process goes on",
		"peer", e.From, "type", e.Type, "panic", fmt.Sprint(v), "stack", string(e.Stack))
	g.stopWith(e)
}

// transfer starts a leader transfer to replica to if it is responsive and
// caught up with the commit (else nothing: a transfer to a replica that
// cannot take over would only drop proposals until it is abandoned).
//
// Responsive means a message from it was stepped within the last election
// timeout, counted here: not raft's Progress.RecentActive, which the
// leader's quorum check clears for every peer once per election timeout,
// until their next answers. A transfer asked for in the round of that
// tick would see every peer inactive, and a caller that asks every n
// election timeouts (the broker's preferOwners) would hit that tick every
// time once in phase with it, and never hand over.
func (g *Group) transfer(l *loop, to uint64) {
	st := g.rn.Status()
	if pr, ok := st.Progress[to]; ok && g.answers(l, to) && pr.Match >= st.GetCommit() {
		g.logger.Info("replica: handing the leadership over", "to", to)
		g.rn.TransferLeader(to)
	}
}

// answers reports whether a message from replica id was stepped within
// the last election timeout (see transfer).
func (g *Group) answers(l *loop, id uint64) bool {
	h, heard := l.heard[id]
	return heard && l.ticks-h <= uint64(g.cfg.ElectionTicks)
}

// handOff, while the replica resigns (Resign), starts a leader transfer
// to the voter that answers and holds the most of the log (raft sends it
// what it lacks first, then has it campaign), unless one is under way.
// It reports whether the resignation is done for now: the replica does
// not lead, or leads with no voter that answers to take over.
func (g *Group) handOff(l *loop) bool {
	st := g.rn.Status()
	if st.RaftState != raft.StateLeader {
		return true
	}
	if st.LeadTransferee != 0 {
		return false // raft abandons it after an election timeout; then another is tried
	}
	var to, match uint64
	for id, pr := range st.Progress {
		if id == g.cfg.ID || pr.IsLearner || !g.answers(l, id) {
			continue
		}
		if to == 0 || pr.Match > match || pr.Match == match && id < to { // ties: the same choice on every run
			to, match = id, pr.Match
		}
	}
	if to == 0 {
		return true
	}
	g.logger.Info("replica: resigning; handing the leadership over", "to", to, "match", match, "commit", st.GetCommit())
	g.rn.TransferLeader(to)
	return false
}

// propose turns the waiting records, handed over in term, into entries of
// at most MaxEntryBytes of records each, and proposes them: in term, or
// not at all. Once raft drops one entry, the entries after it are not
// proposed either (they fail alike), so that a drop never lets a later
// record in ahead of an earlier one.
func (g *Group) propose(l *loop, term uint64, buf []byte, ends []int, dones []func(uint64, int64, error)) {
	st := g.rn.BasicStatus()
	if st.RaftState != raft.StateLeader || st.GetTerm() != term {
		err := &NotLeaderError{Group: g.cfg.Name, Leader: st.Lead, Term: st.GetTerm()}
		for _, done := range dones {
			done(0, 0, err)
		}
		return
	}
	now := time.Now
	if g.cfg.Knobs.Now != nil {
		now = g.cfg.Knobs.Now
	}
	// The stamp is the proposer's wall clock; CommitTimeout is measured
	// from proposed, on the monotonic clock, so that a step of the wall
	// clock neither stretches nor cuts it.
	ts, proposed := now().UnixNano(), time.Now()
	start, first := 0, 0
	var dropped error
	for i := range ends {
		if i+1 < len(ends) && ends[i+1]-start <= g.cfg.MaxEntryBytes {
			continue // the next record fits too
		}
		l.seq++
		w := &waiter{seq: l.seq, dones: dones[first : i+1], proposed: proposed}
		if dropped != nil {
			w.fail(dropped)
			start, first = ends[i], i+1
			continue
		}
		l.entry = appendBatchHeader(l.entry[:0], batchHeader{proposer: g.cfg.ID, seq: w.seq, ts: ts, count: i + 1 - first})
		l.entry = append(l.entry, buf[start:ends[i]]...)
		data := make([]byte, len(l.entry)) // raft keeps it
		copy(data, l.entry)
		if err := g.rn.Propose(data); err != nil {
			if errors.Is(err, raft.ErrProposalDropped) {
				st := g.rn.BasicStatus()
				err = &NotLeaderError{Group: g.cfg.Name, Leader: st.Lead, Term: st.GetTerm()}
				if st.RaftState == raft.StateLeader {
					err = fmt.Errorf("replica: group %q: %w (too much uncommitted, or a leadership transfer)", g.cfg.Name, ErrDropped)
				}
			}
			dropped = err
			w.fail(err)
		} else {
			l.unindexed[w.seq] = w
		}
		start, first = ends[i], i+1
	}
}

// handleReady handles one Ready as raft's synchronous-storage contract
// asks: persist entries and HardState, send messages, apply committed
// entries (those already on disk here first), Advance. The leader sends its appends and heartbeats before its
// own fdatasync (raft thesis 10.2.1), so its write runs in parallel with
// the followers'; every other message, and every message of a Ready that
// changes term or vote, waits for the write. A leader counts its own entry
// towards a majority only at Advance, after its fdatasync, and a follower
// acknowledges only after its fdatasync: an entry is committed only once a
// majority has it on disk.
func (g *Group) handleReady(l *loop) error {
	rd := g.rn.Ready()
	if rd.SoftState != nil {
		g.leader.Store(rd.SoftState.Lead)
	}
	if !raft.IsEmptySnap(rd.Snapshot) {
		// Installed before this Ready's entries, which follow it.
		if err := g.restore(l, rd.Snapshot); err != nil {
			return err
		}
	}
	hs := rd.HardState
	termVote := hs != nil && (hs.GetTerm() != g.st.p.term || hs.GetVote() != g.st.p.vote)
	if hs != nil {
		g.term.Store(hs.GetTerm())
	}

	msgs := rd.Messages
	readied := false // whether this round woke other goroutines before its write
	if !termVote {
		var later []*pb.Message
		var early []*pb.Message
		for _, m := range msgs {
			switch {
			case m.GetType() == pb.MsgApp && len(m.GetEntries()) == 0:
				// Entries none: the leader telling a follower how far
				// its log is committed (raft sends one to each
				// follower once a round commits). It goes after this
				// round's acks, which it would otherwise go before:
				// measured at R=3 on a 2-vCPU VM, the acks' packets
				// waited behind the two sends to the followers. Raft
				// takes messages late and in any order.
				later = append(later, m)
			case m.GetType() == pb.MsgApp, m.GetType() == pb.MsgHeartbeat:
				early = append(early, m)
			default:
				later = append(later, m)
			}
		}
		if len(early) > 0 {
			g.cfg.Transport.Send(early)
			readied = true
		}
		msgs = later
	}

	// Committed entries this replica already holds on disk apply before
	// this Ready's write, so their acks do not wait for another fdatasync.
	// Not those at or past this Ready's first entry: the entries on disk
	// there are an uncommitted suffix the write replaces (raft hands the
	// committed ones from the new log in the same Ready), and a reader
	// woken by their offsets would read the old ones from disk. They, and
	// any committed entries in this Ready's own Entries, apply after the
	// write, as the contract says.
	committed := rd.CommittedEntries
	onDisk := g.st.last
	if len(rd.Entries) > 0 {
		onDisk = min(onDisk, rd.Entries[0].GetIndex()-1)
	}
	stable := len(committed)
	for stable > 0 && committed[stable-1].GetIndex() > onDisk {
		stable--
	}
	if err := g.apply(l, committed[:stable]); err != nil {
		return err
	}
	readied = readied || stable > 0

	if len(rd.Entries) > 0 {
		if readied {
			// The goroutines just woken (the transport's: in a broker,
			// the quic-go connection loops that send what this goroutine
			// queued; the acks' writers) wait in this goroutine's
			// run-next slot, and a blocking fdatasync keeps them there
			// until it returns: measured, the leader's appends left
			// 190 µs (its fsync) after they were handed over instead of
			// 28 µs. Yield, so that they run before the write, or beside
			// it.
			runtime.Gosched()
		}
		g.index(l, rd.Entries)
		if err := g.st.append(rd.Entries); err != nil {
			return err
		}
	}
	// The rest of the messages (answers to appends, commit-only appends,
	// votes) go once the entries are durable, and before the hard state
	// is written unless its term or vote changed: a commit index need
	// not be durable before anyone hears of it (raft learns it again from
	// the quorum), and a follower's answer, which the leader's commit
	// waits for, no longer waits for that write as well.
	send := func() {
		if len(msgs) == 0 {
			return
		}
		if stable > 0 && len(rd.Entries) == 0 {
			// The acks just written wait to be sent (the connection
			// loops they woke); the goroutines these messages wake
			// would run first (the one woken last does). Yield, so
			// that the acks go out first.
			runtime.Gosched()
		}
		g.cfg.Transport.Send(msgs)
	}
	if !termVote {
		send()
	}
	if hs != nil || len(rd.Entries) > 0 { // with the entries: the index synced (state.go)
		if err := g.st.setState(hs, nil, termVote); err != nil {
			return err
		}
	}
	if termVote {
		send()
	}
	if err := g.apply(l, committed[stable:]); err != nil {
		return err
	}
	g.rn.Advance(rd)
	for _, m := range msgs {
		if m.GetType() == pb.MsgSnap {
			// The snapshot is one small message, sent like the others:
			// raft may go on sending the log after it. Were it lost, the
			// follower refuses the entries that follow, and raft sends
			// the snapshot again.
			g.rn.ReportSnapshot(m.GetTo(), raft.SnapshotFinish)
		}
	}
	return nil
}

// index notes where this replica's proposals landed in the log, and fails
// those that ents replace: raft sends entries from the first index that
// conflicts with ours, so every entry of ours from there on is gone.
func (g *Group) index(l *loop, ents []*pb.Entry) {
	if first := ents[0].GetIndex(); first <= g.st.last {
		lead, term := g.leader.Load(), g.term.Load()
		for i, w := range l.byIndex {
			if i >= first {
				delete(l.byIndex, i)
				w.fail(&NotLeaderError{Group: g.cfg.Name, Leader: lead, Term: term, Replaced: true})
			}
		}
	}
	if len(l.unindexed) == 0 {
		return
	}
	for _, e := range ents {
		if e.GetType() != pb.EntryNormal || len(e.GetData()) == 0 {
			continue
		}
		h, _, err := decodeBatchHeader(e.GetData())
		if err != nil || h.proposer != g.cfg.ID {
			continue
		}
		if w := l.unindexed[h.seq]; w != nil {
			delete(l.unindexed, h.seq)
			w.index, w.term = e.GetIndex(), e.GetTerm()
			l.byIndex[w.index] = w
		}
	}
}

// apply assigns offsets to committed entries, in log order, and completes
// the proposals among them. An entry's records get [next, next+n). An
// entry whose data does not decode (it cannot come from this code) gets
// no offsets on every replica alike, and is logged.
func (g *Group) apply(l *loop, ents []*pb.Entry) error {
	if len(ents) == 0 {
		return nil
	}
	type completion struct {
		w    *waiter
		base uint64
		ts   int64
		err  error
	}
	var completed []completion
	for _, e := range ents {
		idx, n := e.GetIndex(), 0
		var ts int64
		var data []byte // kept for reads
		switch e.GetType() {
		case pb.EntryNormal:
			if len(e.GetData()) > 0 {
				h, _, err := decodeBatchHeader(e.GetData())
				if err != nil {
					g.logger.Error("replica: committed entry is not a batch; it holds no records", "index", idx, "err", err)
				} else {
					data = e.GetData()
				}
				n, ts = h.count, h.ts
			}
		case pb.EntryConfChange, pb.EntryConfChangeV2:
			if err := g.applyConfChange(e); err != nil {
				return err
			}
		}
		base, err := g.offs.add(idx, n)
		if err != nil {
			return err
		}
		g.applied = idx
		if data != nil && g.cfg.OnSequenced != nil {
			g.sequenced(idx, data, base)
		}
		g.tail.add(idx, data)
		if w := l.byIndex[idx]; w != nil {
			delete(l.byIndex, idx)
			c := completion{w: w, base: base, ts: ts}
			if w.term != e.GetTerm() {
				c.err = &NotLeaderError{Group: g.cfg.Name, Leader: g.leader.Load(), Term: g.term.Load(), Replaced: true}
			}
			completed = append(completed, c)
		}
	}
	g.offs.publish()
	g.appliedTerm.Store(ents[len(ents)-1].GetTerm())
	for _, c := range completed {
		if c.err != nil {
			c.w.fail(c.err)
			continue
		}
		for k, done := range c.w.dones {
			done(c.base+uint64(k), c.ts, nil)
		}
	}
	return nil
}

func (g *Group) applyConfChange(e *pb.Entry) error {
	var cc pb.ConfChangeI
	if e.GetType() == pb.EntryConfChange {
		var c pb.ConfChange
		if err := proto.Unmarshal(e.GetData(), &c); err != nil {
			return fmt.Errorf("replica: group %q: conf change at %d: %w", g.cfg.Name, e.GetIndex(), err)
		}
		cc = &c
	} else {
		var c pb.ConfChangeV2
		if err := proto.Unmarshal(e.GetData(), &c); err != nil {
			return fmt.Errorf("replica: group %q: conf change at %d: %w", g.cfg.Name, e.GetIndex(), err)
		}
		cc = &c
	}
	// The state file keeps the configuration as of the compaction point
	// (at creation until the first): the changes after it are in the log,
	// and raft replays them on every open.
	cs := g.rn.ApplyConfChange(cc)
	g.conf.Store(cs)
	g.confs = append(g.confs, confAt{e.GetIndex(), cs})
	return nil
}

// expire tells the records of every entry proposed more than
// Config.CommitTimeout ago and not committed yet ErrCommitTimeout, once
// each; their fate is told again when it is known.
func (g *Group) expire(l *loop) {
	if g.cfg.CommitTimeout <= 0 || len(l.byIndex)+len(l.unindexed) == 0 {
		return
	}
	cutoff := time.Now().Add(-g.cfg.CommitTimeout)
	for _, ws := range []map[uint64]*waiter{l.unindexed, l.byIndex} {
		for _, w := range ws {
			if !w.timedOut && w.proposed.Before(cutoff) {
				w.timedOut = true
				w.fail(fmt.Errorf("replica: group %q: %w: not committed within %v of its proposal", g.cfg.Name, ErrCommitTimeout, g.cfg.CommitTimeout))
			}
		}
	}
}

func (w *waiter) fail(err error) {
	for _, done := range w.dones {
		done(0, 0, err)
	}
}

// fail stops the group after a storage error: raft's state and the disk
// may disagree now, so only reopening is safe.
func (g *Group) fail(err error) {
	g.logger.Error("replica: storage failed; the group stops until reopened", "err", err)
	g.stopWith(err)
}

// stopWith records why the group stopped: new work is refused with
// ErrFailed wrapping err.
func (g *Group) stopWith(err error) {
	g.in.Lock()
	g.in.err = err
	g.in.Unlock()
	g.leader.Store(0)
}

// drain completes everything still waiting when the run goroutine exits.
func (g *Group) drain(l *loop) {
	g.in.Lock()
	if g.in.err == nil {
		g.in.closed = true
	}
	dones := append(l.taken, g.in.dones...)
	admits, retains := g.in.admits, g.in.retains
	g.in.buf, g.in.ends, g.in.dones, g.in.msgs, g.in.msgBytes, g.in.admits, g.in.retains = nil, nil, nil, nil, 0, nil, nil
	refusal := g.refusal()
	g.in.Unlock()
	for _, req := range admits {
		req.reply <- admitReply{err: refusal}
	}
	for _, req := range retains {
		req.reply <- retainReply{err: refusal}
	}
	for _, done := range dones {
		done(0, 0, refusal)
	}
	unknown := fmt.Errorf("replica: group %q: %w", g.cfg.Name, ErrUnknownOutcome)
	for _, w := range l.unindexed {
		w.fail(unknown)
	}
	for _, w := range l.byIndex {
		w.fail(unknown)
	}
	g.leader.Store(0)
	g.in.Lock()
	g.resignedLocked()
	g.in.Unlock()
}
