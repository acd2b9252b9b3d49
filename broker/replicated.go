package broker

// # Replicated shards (replication factor 3)
//
// A shard of a stream created with Replicas 3 is a raft group (package
// replica) on the three brokers of its replica set. Each of them opens its
// replica when a map assigns it (openGroup; pinned: never closed for the
// open-log budget) in the shard's data directory, and raftNet carries
// their messages. The shard's log is the raft log; an ack comes only from
// replica's commit callback (a majority fsynced the entry), never from a
// replica that merely appended it, so an old leader cannot ack.
//
// Routing (dispatchReplicated): the leader takes the publish; a replica
// that is not the leader forwards a client's publish to the leader its
// group knows, and answers a peer's forward with NotOwner naming it, or
// naming no one if it knows no leader; a broker outside the replica set,
// or a replica whose group knows no leader, forwards to the leader it
// last heard of (a NotOwner's Owner, kept in Broker.leaders) or else to
// the first live replica, owner first (guessLeader). A replica that
// refuses a record knowing no leader (an election, or its group failed,
// or lost its quorum and stepped down while its broker stays live), or
// refuses it shutting_down naming itself (it is closing, took nothing
// in, and resigned its leadership: pubSession.answer), or that cannot
// be reached, is forgotten as the leader, and the record
// tries the other replicas before it comes back to that one: it carries
// the replicas that passed on it so (inbound.passed, a bit per replica;
// a replica named as the leader is taken out of it, and it is emptied
// once every live replica has passed). Before, such a record was sent to
// the owner again and again, and never reached the leader the other two
// had elected. While no leader is known the record waits in the
// session's retrier and is routed again after a sixteenth of a RaftTick,
// then after twice as long each time, up to a RaftTick (leaderWait: a
// leadership handed over takes milliseconds, an election after a loss an
// election timeout), until ForwardTimeout after it first needed a
// leader; then it fails unavailable, nothing written (never not_owner:
// the publisher's map is not what is behind). A record the group drops
// or a new leader's entries replace (never committed) is routed again
// the same way. A record proposed but not committed within CommitTimeout
// (no majority can write it) is answered timeout, its outcome unknown;
// the producer table waits for the entry's fate, which
// replica.Config.CommitTimeout has the group tell in a second call.
//
// Subscribers read committed records only (Group.Read), from whichever
// replica they subscribe at.
//
// Leadership goes back to a shard's owner, its preferred leader: every 50
// ticks raftNet asks the groups this broker leads and does not own to
// hand over to their owner if it is live (Group.TransferLeadership, which
// does so only to a replica that answers and has every committed entry;
// the proposals dropped during the hand-over are routed again).
//
// A replica whose log was lost (the broker's data directory deleted, or
// the shard's) cannot rejoin under its old raft id. A broker that starts
// without its shard data directory (noteLostLocked), or finds the
// directory of a replica it created empty (the replica marks,
// replicamarks.go), opens a new replica under a new raft id that joins
// the group in the lost one's place and is caught up from the leader's
// log (rejoin.go); the shard goes on with its majority of two meanwhile,
// and the joining replica's subscribers are sent to the others. A replica
// that runs with a lost log anyway (its state restored without its log,
// say) drops the leader's heartbeats that contradict its empty log and
// never acks; once one came, Group.Lost says so and subscribers are
// refused there (or ended) with unavailable, so that the SDK reads from
// another replica.
//
// Idempotent publish works as on a shard of replication factor 1 (see
// producers.go, "Replicated shards"): every replica keeps the shard's
// producer table, filled from the committed records as their entries
// apply, and the leader judges each idempotent publish against it before
// proposing. A leader judges only once it has applied everything
// committed before its term (replica.Group.LeaderTerm; until then the
// publish waits in the retrier, as for an election), and its record is
// proposed in the term it was judged in or not at all
// (replica.Group.AppendInTerm). Why a duplicate never gets a second
// offset, across a failover: say the old leader proposed (p, s) at term
// T, lost the leadership with the entry uncommitted, and the publisher,
// told unknown outcome or unavailable, sent it again to the new leader of
// term T' > T. Either the new leader holds the old entry in its log: raft
// commits it together with the empty entry the new leader appends first
// in T', so it has applied (p, s), and answers the retry with its ack
// (Duplicate) before it judges anything; or it does not: then the entry
// was not committed (a leader holds every committed entry) and never will
// be: every later leader holds the new leader's log up to that first
// entry, which lacks it, and a term-T entry cannot follow a term-T' one in
// a log; so writing (p, s) again is its only write. A record of the old
// leader that raft dropped or replaced gives its sequence back on the old
// leader (never below what has been applied there), which decides
// nothing until it leads again and has applied its new term's first
// entry.
//
// Retention: each replica applies the stream's to its own log
// (replica.Group.EnforceRetention, whole segments), from one pass over
// every hosted group each Config.RetentionCheck (raftNet.runRetention).

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/felix-broker/felix/replica"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
	"github.com/felix-broker/felix/wal"
)

// shardLog is what the publish and subscribe paths use of a shard's log,
// a *wal.Log (replication factor 1) or a *replica.Group (3).
type shardLog interface {
	AppendAsync(r *wal.Record, done func(offset uint64, ts int64, err error))
	AppendNow(r *wal.Record, done func(offset uint64, ts int64, err error))
	Read(from uint64, maxRecords int, maxBytes int) ([]wal.Record, error)
	FirstOffset() uint64
	NextOffset() uint64
	Size() int64
	Watch() (next uint64, changed <-chan struct{})
}

var (
	_ shardLog = (*wal.Log)(nil)
	_ shardLog = (*replica.Group)(nil)
)

var (
	errNoMap     = errors.New("broker: no shard map yet")
	errNotMember = errors.New("broker: peer not in the shard map")
)

// noteLostLocked marks as lost, when the broker started with no shard data
// directory, every replica of a replicated shard the first map m gives it:
// a replica set is placed only over members, and a member's broker has
// run with its data directory, so those replicas existed and are gone.
// Each rejoins its group under a new raft id when it opens (rejoin.go).
//
// The lost replicas are marked (replicaMarks) before the fresh marker is
// removed, so a broker that stops before it opened them all still treats
// them as lost when it starts again: they were once opened empty under
// their old raft ids, as voters that had forgotten their votes and log,
// and could elect a replica lacking acked records.
func (s *shardSet) noteLostLocked(m *shardmap.Map) {
	var ids []string
	var lost []shardmap.ShardID
	for _, id := range m.ReplicatedBy(s.node) {
		if st, ok := m.Stream(id.Stream); ok && st.Replicas > 1 {
			s.mu.lost[id] = true
			lost = append(lost, id)
			if len(ids) < maxListed {
				ids = append(ids, id.String())
			}
		}
	}
	if len(s.mu.lost) > 0 {
		s.logger.Error("this broker started with no shard data, but the map names it a replica of replicated shards: those replicas were lost with the data directory; each joins its group again under a new raft id and is caught up by the others",
			"replicas", len(s.mu.lost), "first", ids, "dir", s.root.Name())
	}
	if err := s.marks.add(lost...); err != nil {
		s.logger.Error("could not mark the lost replicas; this broker starts as fresh again next time", "err", err)
		return
	}
	if err := s.root.Remove(freshFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.logger.Warn("could not remove the fresh-start marker; this broker starts as fresh again next time", "err", err)
	}
}

// freshFile, at the top of the shard data directory, says the broker
// started with none and has not yet marked the replicas it lost with it.
const freshFile = ".fresh"

// entryBytes is the largest raft entry of a replicated shard: room for
// one record of MaxPayload and its framing.
func entryBytes(cfg Config) int { return max(1<<20, cfg.MaxPayload+entryFraming) }

// entryFraming is what an entry holds besides its records' bytes, with
// room to spare.
const entryFraming = 64 << 10

// openGroup opens this broker's replica of the replicated shard of e in
// dir and registers it for raft messages.
//
// A replica whose storage is damaged (replica.ErrCorrupt: an entry that
// fails its checksum, a log that ends below its committed index, a state
// file with no valid slot) cannot be trusted with its votes or its log,
// as one whose disk was lost: its directory is set aside (setAside, kept
// for inspection) and a new, empty replica joins the group in its place
// under a new raft id, caught up from its peers (rejoin.go).
func (s *shardSet) openGroup(e *shardEntry, dir string, st *shardmap.Stream) error {
	err := s.openReplica(e, dir, st)
	if !errors.Is(err, replica.ErrCorrupt) {
		return err
	}
	aside, aerr := s.setAside(e.id)
	if aerr != nil {
		return errors.Join(err, aerr)
	}
	s.logger.Error("replica's storage is damaged: set aside for inspection, and a new replica joins the group in its place, caught up from its peers",
		"shard", e.id.String(), "err", err, "set_aside_in", aside)
	if dir, err = s.shardDir(e.id); err != nil {
		return err
	}
	return s.openReplica(e, dir, st)
}

// damagedPrefix starts the name of a damaged replica's directory set
// aside in the streams directory (never removed by the broker).
const damagedPrefix = ".damaged-"

// setAside moves the directory of shard id to
// <streams>/.damaged-<stream>-<shard>-<unix ns> and returns that path.
// One copy per shard is kept: an older one of the same shard is removed
// first, so a disk that keeps failing cannot fill up with them.
func (s *shardSet) setAside(id shardmap.ShardID) (string, error) {
	prefix := fmt.Sprintf("%s%s-%d-", damagedPrefix, id.Stream, id.Shard)
	if ents, err := fs.ReadDir(s.root.FS(), "."); err == nil {
		for _, ent := range ents {
			if rest, ok := strings.CutPrefix(ent.Name(), prefix); ok && strings.Trim(rest, "0123456789") == "" {
				if err := s.root.RemoveAll(ent.Name()); err != nil {
					s.logger.Error("removing an older copy of a damaged replica", "dir", ent.Name(), "err", err)
				}
			}
		}
	}
	name := prefix + strconv.FormatInt(time.Now().UnixNano(), 10)
	if err := s.root.Rename(filepath.Join(id.Stream, strconv.Itoa(id.Shard)), name); err != nil {
		return "", fmt.Errorf("set aside the damaged replica of %s: %w", id, err)
	}
	return filepath.Join(s.root.Name(), name), nil
}

// replicaKnobs passes Config.Knobs.ReplicaBeforeSync and Now to shard
// id's replica.
func (s *shardSet) replicaKnobs(id shardmap.ShardID) replica.Knobs {
	k := replica.Knobs{Now: s.wallClock}
	if s.beforeSync != nil {
		k.BeforeSync = func(last uint64) error { return s.beforeSync(id, last) }
	}
	return k
}

// replaceEvery bounds how often one shard's failed replica is replaced.
const replaceEvery = time.Minute

// replaceFailed replaces this broker's replica of shard id whose group g
// failed while it ran (a storage error, or a peer's message that made
// raft panic, contained): a replica stays failed until reopened, and its
// files cannot be trusted as they stand (after a failed fdatasync the
// kernel may have dropped the data it could not write, while reads still
// see it). So it is replaced as a damaged one is at open: set aside, and
// a new replica joins in its place under a new raft id, caught up from
// its peers. So is a replica whose log was lost under it (Group.Lost: its
// raft state kept, its entries gone), which never catches up under its
// raft id. At most once per replaceEvery per shard. Called by the
// retention pass (raftNet.runRetention).
func (s *shardSet) replaceFailed(id shardmap.ShardID, g *replica.Group) {
	s.mu.Lock()
	e := s.mu.entries[id]
	if s.mu.closed || e == nil || e.gone != nil || e.group != g || s.mu.removing[id.Stream] != nil ||
		time.Since(s.mu.replaced[id]) < replaceEvery {
		s.mu.Unlock()
		return
	}
	s.mu.replaced[id] = time.Now()
	e.gone = make(chan struct{})
	ch := make(chan struct{})
	s.mu.removing[id.Stream] = ch // no open of the stream's shards until the old files are aside
	m := s.mu.latest
	s.mu.Unlock()
	cause := cmp.Or(g.Err(), g.Lost())
	s.finish(e) // the failed group's close error is its failure again
	aside, err := s.setAside(id)
	s.mu.Lock()
	delete(s.mu.removing, id.Stream)
	s.mu.Unlock()
	close(ch)
	if err != nil {
		s.logger.Error("replica failed and could not be set aside; it stays closed", "shard", id.String(), "cause", cause, "err", err)
		return
	}
	s.logger.Error("replica failed: set aside for inspection, and a new replica joins the group in its place, caught up from its peers",
		"shard", id.String(), "cause", cause, "set_aside_in", aside)
	if e, err := s.acquire(m, id); err != nil {
		s.logger.Error("replacing a failed replica: the new one did not open; the next map or use tries again", "shard", id.String(), "err", err)
	} else {
		e.release()
	}
}

// openReplica opens this broker's replica of e's shard in dir: under its
// raft id, or, if it was lost, as a new replica that joins (rejoin.go).
func (s *shardSet) openReplica(e *shardEntry, dir string, st *shardmap.Stream) error {
	slots := e.slots
	nodes := slots.nodes()
	id := raftID(nodes, s.node)
	if id == 0 {
		return fmt.Errorf("%w: %s is not among the replicas %v of %s", errShardGone, s.node, nodes, e.id)
	}
	has, err := replica.HasState(dir)
	if err != nil {
		return err
	}
	moveID := st.Placement.MoveID(e.id.Shard, s.node)
	moved := moveID != 0
	if has && moved {
		// Data of an earlier stay (moved away and back while this broker
		// did not remove it) is never reopened: the group replaced its
		// raft id. Only the replica of this move is.
		stored, ok, err := readMoveID(dir)
		if err != nil {
			return fmt.Errorf("shard %s: %w (its data is kept, not removed on a guess)", e.id, err)
		}
		if ok && stored > moveID {
			// Moved here by a move newer than this map knows (a control
			// plane that lags): that replica may be a voter; it is not
			// this map's to judge (as movedInAfter for removeMoved).
			return fmt.Errorf("shard %s: its replica here came with move %d, newer than move %d of the map of epoch %d: kept, and opened on a map that knows it",
				e.id, stored, moveID, slots.p.Load().epoch)
		}
		if !ok || stored != moveID {
			if err := s.removeShardDir(e.id, moveID); err != nil {
				return err
			}
			s.logger.Warn("replica moved here again while this broker held the data of an earlier stay: that data is removed, and a new replica joins",
				"shard", e.id.String(), "move", moveID, "data_of_move", stored)
			if dir, err = s.shardDir(e.id); err != nil {
				return err
			}
			has = false
		}
	}
	// The lost flag is dropped only once the replica's mark is written
	// (below): until then it is all that says the replica lost its log,
	// and an attempt that fails before must leave it for the next one.
	s.mu.Lock()
	lost := s.mu.lost[e.id]
	s.mu.Unlock()
	join := false
	switch {
	case has:
		stored, ok, err := readRaftID(dir)
		if err != nil {
			return err
		}
		if ok {
			id = stored
		}
	case lost || moved || s.marks.has(e.id):
		// Created here before (or the whole data directory is new): the
		// replica was lost, and joins again under a new id (rejoin.go);
		// or it was moved here, and joins (moves.go).
		id, join = newRaftID(slotOf(id)), true
		if moved {
			if err := writeMoveID(dir, moveID); err != nil {
				return err
			}
		}
		if err := writeRaftID(dir, id); err != nil {
			return err
		}
	}
	if !s.marks.has(e.id) {
		if err := s.marks.add(e.id); err != nil {
			return err
		}
	}
	if lost {
		s.mu.Lock()
		delete(s.mu.lost, e.id) // marked: marks.has says it from now on
		s.mu.Unlock()
	}
	// The voters of a new group. A replica that holds its group's state
	// keeps the configuration stored there, and one that replaced a lost
	// replica is not among these ids: so none for it.
	var peers []uint64
	if !has {
		peers = make([]uint64, len(nodes))
		for i := range peers {
			peers[i] = uint64(i) + 1
		}
	}
	g, err := replica.Open(replica.Config{
		ID: id, Peers: peers, Join: join, Dir: dir, Name: e.id.String(),
		Transport:     s.raft.transport(e.id, slots),
		Logger:        s.logger,
		ElectionTicks: s.electionTicks,
		// A leader's heartbeats are one message per group per follower:
		// three per election timeout rather than ten halves what idle
		// groups cost (measured: 300 idle R=3 shards on three in-process
		// brokers, 24.5% of a core with 1, 12.9% with 3). Commits do not
		// wait for them (a leader sends each new commit index at once).
		HeartbeatTicks: max(1, s.electionTicks/3),
		MaxEntryBytes:  s.entryBytes,
		CommitTimeout:  s.commitTimeout,
		// Idle groups go quiet; raftNet watches their members' liveness
		// per pair of brokers and wakes them (raft.go).
		Quiesce:     !s.noQuiesce,
		SegmentSize: s.segmentSize,
		// As a shard log's, so that LogMemory's estimate covers it.
		TailBytes: cmp.Or(s.tailBytes, defaultTailBytes),
		SyncGroup: s.syncGroup, // with the shard logs': one disk, one P
		// Applied by each replica to its own log, from raftNet's
		// retention pass.
		RetentionBytes: st.RetentionBytes,
		RetentionAge:   st.RetentionAge,
		OnSequenced:    e.producers.applied, // see producers.go
		OnSync:         s.tel.onReplicaSync(),
		Knobs:          s.replicaKnobs(e.id),
		// A snapshot carries the producer table (producers_snapshot.go),
		// in at most an entry's bytes: the raft frame takes four.
		SnapshotState: func() []byte { return e.producers.snapshotState(s.entryBytes) },
		OnRestore: func(state []byte) {
			if err := e.producers.restoreState(state); err != nil {
				s.logger.Warn("replicated shard: the leader's snapshot carried a producer table that does not decode; its producers are forgotten, as if expired",
					"shard", e.id.String(), "err", err)
			}
		},
	})
	if err != nil {
		return err
	}
	e.producers.replayed() // Open applied the committed log again
	e.group, e.sl = g, g
	// A replica that was joining when the broker stopped asks again.
	// So does a replica moved here whose move the control plane has not
	// yet heard is done (moves.go).
	_, pending := st.Placement.Pending(e.id.Shard)
	s.raft.register(e.id, g, slots, e.move, join || membership(g) != replica.Voter || pending != 0 && pending == e.move)
	return nil
}

// replicaReport says where this broker's replicas of the shards of the
// last map it applied stand (transport.ReplicaReport), for the control
// plane, which refuses to move another replica of a shard while this
// one is not a voter of its group: the member sends it with every
// heartbeat, and at once after each map applied.
func (b *Broker) replicaReport() *transport.ReplicaReport {
	m := b.applied.Load()
	if m == nil {
		return &transport.ReplicaReport{}
	}
	r := &transport.ReplicaReport{Applied: m.Epoch}
	for _, id := range m.ReplicatedBy(b.cfg.NodeID) {
		if !replicated(m, id) || b.raft.voting(id) {
			continue
		}
		if len(r.Unready) == transport.MaxUnreadyReported {
			r.More = true
			break
		}
		r.Unready = append(r.Unready, id)
	}
	return r
}

// opReplicaStatus asks a broker about its replicas of a stream's shards.
const opReplicaStatus = "replica.status"

// replicaStates returns what this broker's open replicas of stream's
// shards know: leader, term, committed offsets, failure.
func (b *Broker) replicaStates(stream string) []transport.ReplicaState {
	var out []transport.ReplicaState
	b.shards.mu.RLock()
	var es []*shardEntry
	for id, e := range b.shards.mu.entries {
		if id.Stream == stream && e.gone == nil && e.pinned {
			es = append(es, e)
		}
	}
	b.shards.mu.RUnlock()
	for _, e := range es {
		select {
		case <-e.ready:
		default:
			continue // opening
		}
		if e.group == nil {
			continue // failed to open
		}
		_, term := e.group.Leader()
		st := transport.ReplicaState{Shard: e.id.Shard, Node: b.cfg.NodeID, Leader: e.leaderNode(), Term: term, Next: e.group.NextOffset(), First: e.group.FirstOffset(),
			Member: membershipName(e.group)}
		if err := e.group.Err(); err != nil {
			st.Err = err.Error()
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b transport.ReplicaState) int { return a.Shard - b.Shard })
	return out
}

// leaderNode returns the node of the leader e's group knows, "" if none.
func (e *shardEntry) leaderNode() string {
	id, _ := e.group.Leader()
	return e.slots.nodeOf(id)
}

// noteLeader remembers that node leads shard id, as a replica said.
func (b *Broker) noteLeader(id shardmap.ShardID, node string) {
	if node != "" {
		b.leaders.Store(id, node)
	}
}

// forgetLeader forgets that node leads shard id, if that is what it knew.
func (b *Broker) forgetLeader(id shardmap.ShardID, node string) {
	b.leaders.CompareAndDelete(id, node)
}

// noteRefusal notes that replica by did not take in, a record of shard
// id: it named leader as the shard's leader, or knew none (leader ""), or
// could not be reached. The leader named is remembered, and tried for in
// again even if it passed on in before. A replica that knows no leader,
// or cannot be reached, is not the leader: it is forgotten as such, and
// in goes to the other replicas first (in.passed, see guessLeader).
func (b *Broker) noteRefusal(in *inbound, id shardmap.ShardID, by, leader string) {
	var set []string
	if st, ok := b.routingMap().Stream(id.Stream); ok {
		set = st.Placement.Replicas(id.Shard)
	}
	if leader != "" {
		b.noteLeader(id, leader)
		in.passed = in.passed.without(slices.Index(set, leader))
		return
	}
	b.forgetLeader(id, by)
	in.passed = in.passed.with(slices.Index(set, by))
}

// replicaMask is a set of a shard's replicas, by place in its replica
// set (bit i: Placement.Replicas(shard)[i], of at most 3). A map that
// moves a replica changes what a bit names: a replica is then tried
// once more, or once less, before a record starts over (guessLeader).
type replicaMask uint8

// has reports whether the replica at place i is in r.
func (r replicaMask) has(i int) bool { return i >= 0 && r&(1<<i) != 0 }

// with returns r and the replica at place i (none if i < 0).
func (r replicaMask) with(i int) replicaMask {
	if i < 0 {
		return r
	}
	return r | 1<<i
}

// without returns r less the replica at place i (none if i < 0).
func (r replicaMask) without(i int) replicaMask {
	if i < 0 {
		return r
	}
	return r &^ (1 << i)
}

// guessLeader returns where to send a publish of shard id when this
// broker's own replica (if any) knows no leader: the leader last heard
// of, if it is a live replica, else the first live replica (the owner
// first); never not, and "" if none will do. It passes over the replicas
// in *passed, those that refused the record knowing no leader or could
// not be reached (noteRefusal), so that a record tries each replica in
// turn rather than the owner again and again; once every live one has
// passed, *passed is cleared and the record starts over with the owner.
// The record waited a leaderWait after each refusal (pubSession.answer).
func (b *Broker) guessLeader(m *shardmap.Map, id shardmap.ShardID, set []string, not string, passed *replicaMask) string {
	for {
		if v, ok := b.leaders.Load(id); ok {
			if n := v.(string); n != not && live(m, n) {
				if i := slices.Index(set, n); i >= 0 && !passed.has(i) {
					return n
				}
			}
		}
		for i, n := range set {
			if n != not && !passed.has(i) && live(m, n) {
				return n
			}
		}
		if *passed == 0 {
			return ""
		}
		*passed = 0
	}
}

func live(m *shardmap.Map, node string) bool {
	n, ok := m.Node(node)
	return ok && n.Live
}

// dispatchReplicated routes a publish of a replicated shard (see the
// comment at the top of this file).
func (p *pubSession) dispatchReplicated(in inbound, m *shardmap.Map, st *shardmap.Stream, shard, attempt int) {
	b, pub := p.b, in.pub
	if !in.replicated() {
		in.deadline = max(monoNow()+int64(b.cfg.ForwardTimeout), 1) // never 0: replicated()
	}
	id := shardmap.ShardID{Stream: pub.Stream, Shard: shard}
	set := st.Placement.Replicas(shard)
	if len(set) == 0 {
		p.fail(in, &transport.Error{Code: transport.CodeUnavailable, Epoch: m.Epoch,
			Message: fmt.Sprintf("%s has no replicas placed yet (the cluster has too few members)", id)})
		return
	}
	var target string
	if slices.Contains(set, b.cfg.NodeID) {
		e, err := b.shards.acquire(m, id)
		if err != nil {
			// This broker's replica cannot serve (it failed to open):
			// the others still can. A client's publish goes to one of
			// them, as from a broker that holds no replica; a peer's is
			// answered with one.
			if target := b.guessLeader(m, id, set, b.cfg.NodeID, &in.passed); target != "" {
				p.forwardReplicated(in, m, id, target, attempt)
				return
			}
			p.fail(in, &transport.Error{Code: transport.CodeUnavailable,
				Message: fmt.Sprintf("%s cannot open its replica of %s (%v), and no other replica is live", b.cfg.NodeID, id, err)})
			return
		}
		target = e.leaderNode()
		if target == b.cfg.NodeID {
			in.ev.route(shard, target)
			p.appendReplicated(in, e, id, attempt)
			e.release() // the group is pinned: it stays open
			return
		}
		e.release()
		if target != "" && !live(m, target) {
			target = "" // its lease ran out: wait for the election
		}
		if target == "" && p.peerID == "" {
			// This replica knows no leader (an election, or its group
			// failed or lost its quorum): another replica may. (A peer's
			// forward is answered with no leader instead: the forwarder
			// tries the other replicas, a leaderWait after each, rather
			// than be sent on between replicas that do not know.)
			target = b.guessLeader(m, id, set, b.cfg.NodeID, &in.passed)
		}
	} else {
		target = b.guessLeader(m, id, set, "", &in.passed)
	}
	if target == "" && p.peerID != "" && slices.Contains(set, b.cfg.NodeID) {
		p.fail(in, &transport.Error{Code: transport.CodeNotOwner, Epoch: m.Epoch,
			Message: fmt.Sprintf("%s knows no leader of %s yet", b.cfg.NodeID, id)})
		return
	}
	p.forwardReplicated(in, m, id, target, attempt)
}

// forwardReplicated sends in to target, the leader of id as far as this
// broker knows: it waits for one when target is "", and answers a peer's
// forward with NotOwner naming target.
func (p *pubSession) forwardReplicated(in inbound, m *shardmap.Map, id shardmap.ShardID, target string, attempt int) {
	b := p.b
	switch {
	case target == "":
		p.awaitLeader(in, attempt, id, "no leader of %s is known yet")
	case p.peerID != "":
		p.fail(in, &transport.Error{Code: transport.CodeNotOwner, Epoch: m.Epoch, Owner: target,
			Message: fmt.Sprintf("%s is not the leader of %s; %s is", b.cfg.NodeID, id, target)})
	default:
		in.ev.route(id.Shard, target)
		p.forward(in, m, id.Shard, target, attempt)
	}
}

// awaitLeader routes in again a tick later (by the session's retrier),
// until its deadline, then fails it unavailable: nothing was written.
func (p *pubSession) awaitLeader(in inbound, attempt int, id shardmap.ShardID, format string) {
	if in.expired() {
		p.fail(in, &transport.Error{Code: transport.CodeUnavailable,
			Message: fmt.Sprintf(format+" after %v (ForwardTimeout); nothing was written", id, p.b.cfg.ForwardTimeout)})
		return
	}
	p.requeue(refused{in: in.rerouted(), attempt: attempt, delay: p.b.cfg.leaderWait(attempt), by: p.b.cfg.NodeID}, id)
}

// leaderWait is how long a record of a replicated shard waits for a leader
// before it is routed again, on its attempt-th routing: a sixteenth of a
// raft tick at first, twice as long each time, at most a tick. The
// leadership handed over to a shard's preferred leader moves within
// milliseconds, while an election after a leader is lost takes an
// election timeout (10 ticks or more): the short waits come first.
func (c Config) leaderWait(attempt int) time.Duration {
	return min(c.RaftTick, c.RaftTick/16<<min(attempt, 4))
}

// appendReplicated proposes in's record to e's group, whose leader this
// broker is; the answer is written from the group's commit callback. An
// idempotent publish is judged first by the shard's producer table, once
// this leader has applied everything committed before its term, and
// proposed in the term it was judged in (see the top of this file).
func (p *pubSession) appendReplicated(in inbound, e *shardEntry, id shardmap.ShardID, attempt int) {
	if !p.onRoute(&in, id, nil, attempt, true) {
		return // waits behind the shard's earlier records (order.go)
	}
	b, pub := p.b, in.pub
	idem := pub.ProducerID != "" && pub.ProducerSeq > 0
	if !idem { // an idempotent record is checked once judged (below)
		if werr := p.diskFull(); werr != nil {
			p.fail(in, werr)
			return
		}
	}
	via := pub.Via
	if via == "" {
		via = b.cfg.NodeID
	}
	var prod *producer // set for an idempotent publish to append
	var term uint64
	pseq := pub.ProducerSeq
	if idem {
		if term = e.group.LeaderTerm(); term == 0 {
			// A new leader still applying what its predecessors
			// committed: its table may lack some of it.
			p.awaitLeader(in, attempt, id, "the leader of %s had not applied the records committed before its term")
			return
		}
		if prod = p.admitIdempotent(in, e, id.Shard, via, attempt); prod == nil {
			return // answered, or shares the outcome of the same record in flight
		}
		if p.refusedForDisk(in, e, prod) {
			return
		}
	}
	b.tel.stampRouted(&in.ev)
	seq, stream, shard := pub.Seq, pub.Stream, id.Shard
	r := &wal.Record{ProducerID: pub.ProducerID, ProducerSeq: pseq, Headers: pub.Headers, Key: pub.Key, Value: pub.Value}
	timedOut := false // the publisher was answered timeout; only the group's goroutine reads or sets it
	done := func(offset uint64, ts int64, err error) {
		if errors.Is(err, replica.ErrCommitTimeout) {
			// Answered now; the entry's fate comes in a second call,
			// for the producer table only: an idempotent retry of the
			// record shares it meanwhile (it is still in flight).
			timedOut = true
			p.reply(&in, &transport.Error{Seq: seq, Code: transport.CodeTimeout,
				Message: fmt.Sprintf("%s proposed the record to %s, and its group did not commit it within %v (CommitTimeout): fewer than a majority of the replicas have written it so far; it may still be committed", b.cfg.NodeID, id, b.cfg.CommitTimeout)})
			return
		}
		if prod != nil {
			e.producers.committed(prod, pseq, offset, ts, err)
		}
		if timedOut {
			return
		}
		if err != nil {
			p.replicatedFailed(in, e, id, attempt, err)
			return
		}
		p.reply(&in, &transport.Ack{Seq: seq, Stream: stream, Shard: int32(shard), Offset: offset,
			Timestamp: ts, Owner: b.cfg.NodeID, Via: via, Forwarded: via != b.cfg.NodeID})
	}
	switch {
	case prod != nil:
		e.group.AppendInTerm(term, r, done)
		e.producers.enqueued(prod) // a later sequence of prod may now be queued
	case in.last:
		e.group.AppendNow(r, done)
	default:
		e.group.AppendAsync(r, done)
	}
}

// replicatedFailed answers in, whose record e's group did not commit
// (err): one that never was and never will be is routed again; otherwise
// the publisher is told.
func (p *pubSession) replicatedFailed(in inbound, e *shardEntry, id shardmap.ShardID, attempt int, err error) {
	b, seq := p.b, in.pub.Seq
	var nl *replica.NotLeaderError
	switch {
	case errors.As(err, &nl) || errors.Is(err, replica.ErrDropped):
		// Never committed, and never will be: route it again.
		var leader string
		if nl != nil {
			leader = e.slots.nodeOf(nl.Leader)
		}
		if p.peerID != "" && leader != "" && leader != b.cfg.NodeID {
			p.reply(&in, &transport.Error{Seq: seq, Code: transport.CodeNotOwner, Owner: leader,
				Message: fmt.Sprintf("%s lost the leadership of %s before committing; %s leads it", b.cfg.NodeID, id, leader)})
			return
		}
		p.awaitLeader(in, attempt, id, "%s changed leaders and none took the record")
		return
	}
	code := transport.CodeInternal
	switch {
	case errors.Is(err, replica.ErrClosed):
		code = transport.CodeShuttingDown
	case errors.Is(err, replica.ErrTooLarge):
		code = transport.CodePayloadTooLarge
	case errors.Is(err, replica.ErrUnknownOutcome), errors.Is(err, replica.ErrFailed):
		// May or may not be committed: the publisher is told so.
		code = transport.CodeUnavailable
	}
	p.reply(&in, &transport.Error{Seq: seq, Code: code,
		Message: fmt.Sprintf("%s could not write %s: %v", b.cfg.NodeID, id, err)})
}
