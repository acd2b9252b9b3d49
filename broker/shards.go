package broker

// # Shard data on disk
//
// A broker keeps the log of shard s of stream x in
// <DataDir>/streams/<x>/<s>: one directory per stream, named by the
// stream's name, holding one directory per shard, named by its number in
// decimal. A valid stream name is one plain path element (see
// shardmap.ValidateStreamName: no separator, never "." or "..", never
// starting with '.'), and a shard number is digits only, so two distinct
// (stream, shard) pairs never share a directory and no stream's directory
// lies inside another's. (On a case-insensitive filesystem "Orders" and
// "orders" would share one: the control plane refuses to create a name
// that differs from an existing one only in case.) Names starting with '.' are the broker's own: a
// deleted stream's directory is first renamed to .deleted-<x>-<epoch>
// (atomic: a crash leaves the stream whole or in the trash, never half of
// it, and a stream of the same name may be created at once), then removed;
// trash left by a crash is removed when the broker starts. A stream's
// directory holds its Created epoch (createdFile, written durably before
// any shard of it), so that data of an earlier stream of the same name,
// deleted while this broker was down or in maps it never applied, is
// removed as the deletion would have removed it, never served as the new
// stream's (claimDir; the new incarnation is also found by retain while
// the broker runs), and the data of a stream deleted while this broker
// was down is removed by the first map it applies (sweepDeleted).
//
// Every directory is created, inspected, renamed and removed through an
// os.Root opened on <DataDir>/streams, so no name — one that slipped past
// validation, one from a hand-edited control-plane state, or a rule of a
// future version — can reach outside it: the root refuses "..", absolute
// paths and symbolic links leading out. Names are also checked before any
// disk access, so an invalid name is refused, not merely contained.
// tidwall/wal (under package wal) opens its files by path; so a shard's
// directory is created through the root and checked there to be a real
// directory (not a symbolic link), and only then is its path — the root's
// path joined with the two checked elements — handed to wal.Open. (What
// this leaves open is a race with someone who can write the data directory
// itself, swapping a checked directory for a link before wal opens it;
// such a user can destroy the data anyway.) package wal builds no path of
// its own beyond segment files inside the directory it is given.
//
// # Open logs under a budget
//
// An open shard log holds three file descriptors (tidwall's tail segment,
// ours for fdatasync and the high-water mark; four once its committer has
// parked an fdatasync: that fdatasync's eventfd), a committer goroutine, its
// tail cache and up to a segment of tidwall's in-memory tail. So logs are
// opened on first use
// (and, while under the budget, when a map assigns the shard), and at most
// Config.MaxOpenShards are open at once (lowered so that their memory stays
// within Config.LogMemory: logMemory): opening one more first closes the
// least recently used log that nobody is using. Users hold a reference
// while they use a log (a publish from its lookup until its append is
// queued; a subscription for its lifetime), and only a log with none is
// ever closed for the budget, so closing never fails an append or a read.
// The hot path adds to the reference count of the entry it already looked
// up (under the read lock it took before) and drops it after the append is
// queued, and reads the clock; recency is a clock advanced by opens, not by
// records.
//
// A closed log's retention is kept by a sweep that opens it again within
// the budget when it is due (shards_retention.go).
//
// A replicated shard's replica (a raft group, see replicated.go) is the
// exception: it is opened when a map assigns it, whatever the budget, and
// never closed for it (a follower must keep taking its leader's entries),
// though it counts against the budget like any log.
//
// A broker holds at most Config.MaxShards shards, counted in whole streams:
// a stream is admitted (all its shards on this broker) or refused, and
// admitted streams stay admitted, so creating a stream never takes
// another's place.

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/felix-broker/felix/internal/atomicfile"
	"github.com/felix-broker/felix/replica"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/wal"
)

var (
	errShardsClosed = errors.New("broker: shard logs closed")
	// errShardLimit: admitting the stream would pass Config.MaxShards.
	errShardLimit = errors.New("broker: shard limit reached")
	// errOpenLimit: Config.MaxOpenShards logs are open and all in use.
	errOpenLimit = errors.New("broker: open shard log limit reached")
	// errShardGone: the shard is no longer this broker's (moved or deleted).
	errShardGone = errors.New("broker: shard not on this broker")
)

// failRetry is how long a failed open is remembered: uses of the shard
// within it get the same error without another attempt. The next map
// retries at once.
const failRetry = time.Second

// trashPrefix starts the name a deleted stream's directory is renamed to.
const trashPrefix = ".deleted-"

// shardSet holds the logs of the shards this broker owns.
type shardSet struct {
	root        *os.Root // <DataDir>/streams
	node        string
	segmentSize int
	// commitTimeout is Config.CommitTimeout, given to the replicas.
	commitTimeout time.Duration
	parkedSync    bool           // wal.Options.ParkedSync
	syncGroup     *wal.SyncGroup // every log's wal.Options.SyncGroup
	tailBytes     int
	// retentionCheck is Config.RetentionCheck, for the logs' own passes.
	retentionCheck time.Duration
	maxOpen        int
	maxShards      int
	logger         *slog.Logger
	tel            *telemetry
	walFS          wal.FS                               // Config.Knobs.WALFS
	noQuiesce      bool                                 // Config.Knobs.NoQuiesce
	beforeSync     func(shardmap.ShardID, uint64) error // Config.Knobs.ReplicaBeforeSync
	wallClock      func() time.Time                     // Config.Knobs.Now
	acceptLoss     map[string]bool                      // Config.AcceptLoss, by ShardID.String()

	producerLimits producerLimits // of every shard's producer table

	// Replicated shards: the raft traffic of their groups, and how they
	// are opened.
	raft          *raftNet
	electionTicks int
	entryBytes    int
	// fresh: <DataDir>/streams did not exist when the broker started, so
	// the replicas the first map gives it were lost with it (see
	// replicated.go).
	fresh bool
	// marks are the replicas of replicated shards this broker created
	// (replicamarks.go).
	marks *replicaMarks
	// swept: the first map applied has been compared with the stream
	// directories on disk (sweepDeleted).
	swept atomic.Bool

	// sweep is the goroutine that keeps closed logs within their
	// retention (shards_retention.go): quit stops it.
	sweep struct {
		quit chan struct{}
		stop sync.Once
		wg   sync.WaitGroup
	}

	// clock is advanced by every open; a use stamps it on the entry, so
	// the entry with the smallest stamp is (about) the least recently used.
	clock atomic.Uint64

	// mu guards the entries and the bookkeeping of maps applied, not the
	// logs: an entry is published before its log has opened so that
	// concurrent users wait on ready instead of opening twice.
	mu struct {
		sync.RWMutex
		closed bool
		// entries holds every log opening, open or closing (retired).
		entries map[shardmap.ShardID]*shardEntry
		// removing holds the streams whose data is being removed; opens
		// of their shards wait until it is gone.
		removing map[string]chan struct{}
		// admitted holds the streams admitted under maxShards, with the
		// number of their shards this broker owns; total is their sum.
		admitted map[string]int
		total    int
		// failed holds the shards whose last open failed, until retried.
		failed map[shardmap.ShardID]failure
		// latest is the newest map seen, applied or used to open a log;
		// nil before the first. Opens and deletions judge by it, so a
		// use by an older map cannot revive a deleted stream and an apply
		// of an older map cannot delete a stream a newer one created.
		latest *shardmap.Map
		// closedStats holds what the logs closed for the budget last
		// showed, for the per-shard gauges (see shards_metrics.go), while
		// their shards are this broker's.
		closedStats map[shardmap.ShardID]shardStats
		// retention holds what the sweep knows of the closed logs of
		// this broker's shards of streams of replication factor 1 with a
		// retention limit (shards_retention.go); an entry may outlive a
		// close by a reopen, and is replaced when the log closes again.
		retention map[shardmap.ShardID]closedLog
		// keptMoved are the replicas moved away whose directories are
		// kept until their move settles (moves.go).
		keptMoved map[shardmap.ShardID]struct{}
		// lost holds the replicas of replicated shards this broker held
		// before its data directory was lost, until each opens (and
		// rejoins its group under a new raft id: rejoin.go).
		lost map[shardmap.ShardID]bool
		// incarnation holds, per stream whose directory this run has
		// claimed (claimDir), the Created epoch of the stream it holds
		// data of.
		incarnation map[string]uint64
		// replaced is when each shard's failed replica was last
		// replaced (replaceFailed).
		replaced map[shardmap.ShardID]time.Time
	}
}

type failure struct {
	err error
	at  time.Time
}

type shardEntry struct {
	id shardmap.ShardID
	// created is the incarnation of the stream whose log this is
	// (shardmap.Stream.Created).
	created uint64
	ready   chan struct{} // closed once sl or err is set
	// sl is the shard's log: log for a stream of replication factor 1,
	// group (this broker's replica of the shard's raft group, see
	// replicated.go) for factor 3; the other is nil.
	sl    shardLog
	log   *wal.Log
	group *replica.Group
	slots *raftSlots // group's raft slots (moves.go); nil for a log
	// move is the id of the move that brought the replica here (0 for
	// one the group was created with), as of the map it opened by.
	move uint64
	err  error
	// pinned: the shard is replicated; its group stays open while this
	// broker holds a replica (a follower must keep taking the leader's
	// entries), so it is never closed for the open-log budget.
	pinned bool

	refs atomic.Int64  // holders: its opener, publishes, subscriptions
	used atomic.Uint64 // shardSet.clock at the last use
	// gone is set (under shardSet.mu) when the entry is retired, and
	// closed once its log is closed: from then on nobody may acquire it.
	gone chan struct{}

	// commits is what telemetry keeps of the log's commits
	// (telemetry.go).
	commits shardCommits

	// answers are the publisher streams the log's current commit has
	// answered on (acks.go); touched only by the goroutine committing.
	answers batchAnswers

	// producers is the shard's idempotent producer table, set with log
	// (see producers.go).
	producers *producerTable
}

// release drops a reference taken by acquire.
func (e *shardEntry) release() { e.refs.Add(-1) }

// newShardSet opens (creating it if need be) <DataDir>/streams and removes
// the trash a crash may have left there.
func newShardSet(cfg Config, log *slog.Logger, tel *telemetry) (*shardSet, error) {
	dir := filepath.Join(cfg.DataDir, "streams")
	_, statErr := os.Stat(dir)
	fresh := errors.Is(statErr, fs.ErrNotExist)
	if err := atomicfile.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create shard data dir: %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open shard data dir: %w", err)
	}
	s := &shardSet{
		root: root, node: cfg.NodeID, segmentSize: cfg.SegmentSize, commitTimeout: cfg.CommitTimeout, parkedSync: cfg.ParkedSync, syncGroup: wal.NewSyncGroup(parkAtBusyLogs), tailBytes: cfg.TailBytes, retentionCheck: cfg.RetentionCheck,
		maxOpen: cfg.MaxOpenShards, maxShards: cfg.MaxShards,
		logger: log, tel: tel,
		walFS: cfg.Knobs.WALFS, noQuiesce: cfg.Knobs.NoQuiesce, beforeSync: cfg.Knobs.ReplicaBeforeSync, wallClock: cfg.Knobs.Now, acceptLoss: map[string]bool{},
	}
	for _, id := range cfg.AcceptLoss {
		s.acceptLoss[id] = true
	}
	// Fresh until the first map's lost replicas are marked (noteLostLocked):
	// a broker that stops before that must start fresh again, not open
	// those replicas empty under their old raft ids.
	if fresh {
		err = atomicfile.WriteFileIn(root, freshFile, nil, 0o640)
	} else if _, serr := root.Stat(freshFile); serr == nil {
		fresh = true
	}
	if err != nil {
		root.Close()
		return nil, err
	}
	s.fresh = fresh
	if s.marks, err = loadReplicaMarks(root); err != nil {
		root.Close()
		return nil, err
	}
	s.mu.lost = map[shardmap.ShardID]bool{}
	s.producerLimits = cfg.producerLimits()
	s.electionTicks, s.entryBytes = cfg.RaftElectionTicks, entryBytes(cfg)
	s.mu.entries = map[shardmap.ShardID]*shardEntry{}
	s.mu.removing = map[string]chan struct{}{}
	s.mu.incarnation = map[string]uint64{}
	s.mu.replaced = map[shardmap.ShardID]time.Time{}
	s.mu.admitted = map[string]int{}
	s.mu.failed = map[shardmap.ShardID]failure{}
	s.mu.closedStats = map[shardmap.ShardID]shardStats{}
	s.mu.retention = map[shardmap.ShardID]closedLog{}
	s.sweep.quit = make(chan struct{})
	s.mu.keptMoved = map[shardmap.ShardID]struct{}{}
	s.emptyTrash()
	return s, nil
}

// emptyTrash removes what deletions interrupted by a crash left.
func (s *shardSet) emptyTrash() {
	ents, err := fs.ReadDir(s.root.FS(), ".")
	if err != nil {
		s.logger.Error("listing shard data dir", "dir", s.root.Name(), "err", err)
		return
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), trashPrefix) {
			continue
		}
		if err := s.root.RemoveAll(e.Name()); err != nil {
			s.logger.Error("removing data of a deleted stream", "dir", e.Name(), "err", err)
		} else {
			s.logger.Info("removed data of a stream deleted before a crash", "dir", e.Name())
		}
	}
}

// createdFile, in a stream's directory, holds the Created epoch of the
// stream whose data the directory holds (shardmap.Stream.Created).
const createdFile = ".created"

// claimDir makes the directory of stream st hold st's data: if it holds
// the data of an earlier stream of the same name (one deleted while this
// broker was down, or in maps it never applied), that data is removed as
// a deletion would have removed it; then the directory is created if
// need be and marked with st's Created epoch, durably, before any shard
// of st writes there. A directory without a mark holds data written
// before marks existed, or none: it is st's. A mark newer than st's
// Created is data of a later stream than the map knows (a restarted
// broker's first map, from a control plane behind the one that created
// it): it is neither removed nor opened, and a newer map claims it.
// epoch names the trash.
func (s *shardSet) claimDir(st *shardmap.Stream, epoch uint64) error {
	if st.Created == 0 {
		return nil // created by a control plane that does not tell incarnations apart
	}
	have, marked, err := s.createdMark(st.Name)
	switch {
	case err != nil:
		return err
	case marked && have == st.Created:
		return nil
	case marked && have > st.Created:
		return fmt.Errorf("%w: this broker holds the data of stream %q created at map epoch %d, after the stream of this map (epoch %d) created at %d: kept until a newer map",
			errShardGone, st.Name, have, epoch, st.Created)
	case marked:
		s.logger.Warn("removing the data of an earlier stream of the same name: it was deleted and created again while this broker did not see it",
			"stream", st.Name, "data_of_stream_created_at_epoch", have, "stream_created_at_epoch", st.Created)
		if err := s.removeStream(st.Name, epoch); err != nil {
			return err
		}
	}
	if _, err := atomicfile.MkdirIn(s.root, st.Name, 0o750); err != nil {
		return err
	}
	return atomicfile.WriteFileIn(s.root, filepath.Join(st.Name, createdFile), []byte(strconv.FormatUint(st.Created, 10)+"\n"), 0o640)
}

// createdMark reads the Created epoch marking the directory of stream
// name; marked is false if there is no mark. A mark that does not parse
// is an error: the data is neither removed nor opened on a guess.
func (s *shardSet) createdMark(name string) (created uint64, marked bool, err error) {
	mark := filepath.Join(name, createdFile)
	b, err := s.root.ReadFile(mark)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("read %s in %s: %w", mark, s.root.Name(), err)
	}
	created, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("%s in %s is damaged (%q): restore it or remove the stream's directory: %w", mark, s.root.Name(), b, err)
	}
	return created, true, nil
}

// shardDir creates the directory of shard id through the root, durably
// (a power loss loses a new directory whose parent was not fsynced, with
// every file under it), checks that it is a real directory inside it,
// and returns its path.
func (s *shardSet) shardDir(id shardmap.ShardID) (string, error) {
	if err := shardmap.ValidateStreamName(id.Stream); err != nil {
		return "", err // never reaches the disk
	}
	if id.Shard < 0 {
		return "", fmt.Errorf("broker: shard %s: negative shard number", id)
	}
	shard := strconv.Itoa(id.Shard)
	for _, rel := range []string{id.Stream, filepath.Join(id.Stream, shard)} {
		if _, err := atomicfile.MkdirIn(s.root, rel, 0o750); err != nil {
			return "", err
		}
		fi, err := s.root.Lstat(rel)
		if err != nil {
			return "", fmt.Errorf("check %q in %s: %w", rel, s.root.Name(), err)
		}
		if !fi.IsDir() {
			return "", fmt.Errorf("%q in %s is a %v, not a directory", rel, s.root.Name(), fi.Mode().Type())
		}
	}
	return filepath.Join(s.root.Name(), id.Stream, shard), nil
}

// acquire returns the entry of shard id with its log open, opening (and
// recovering) it first if need be, and holds a reference to it: the caller
// must call release once it no longer uses the log. m is the map the caller
// routed by; only the first use of a shard reads it (or the last map
// applied, if that is newer).
func (s *shardSet) acquire(m *shardmap.Map, id shardmap.ShardID) (*shardEntry, error) {
	s.mu.RLock()
	e := s.mu.entries[id]
	if e != nil && e.gone == nil {
		if err := e.of(m); err != nil {
			s.mu.RUnlock()
			return nil, err
		}
		e.refs.Add(1) // under the read lock: eviction checks refs under the write lock
		s.mu.RUnlock()
		return s.ready(e)
	}
	s.mu.RUnlock()
	return s.acquireSlow(m, id)
}

// of returns nil if e's log is of the stream m holds by e's name, or an
// error matching errShardGone if it is of another incarnation (deleted
// and created again in a map not applied yet, or in one the caller has
// not seen). A log open is served to a use by another incarnation's map
// only through this check: a record acked in the earlier stream's log
// was removed with its data when the map was applied.
func (e *shardEntry) of(m *shardmap.Map) error { return incarnationIn(m, e.id, e.created) }

// incarnationIn returns nil if m holds id's stream as created at epoch
// created, else an error matching errShardGone.
func incarnationIn(m *shardmap.Map, id shardmap.ShardID, created uint64) error {
	st, ok := m.Stream(id.Stream)
	if !ok {
		return fmt.Errorf("%w: %s is not in map epoch %d", errShardGone, id, m.Epoch)
	}
	if st.Created != created {
		return fmt.Errorf("%w: %s of map epoch %d is the stream created at epoch %d; this broker's log is of the stream of epoch %d", errShardGone, id, m.Epoch, st.Created, created)
	}
	return nil
}

// ready waits for e's log to open and stamps the use.
func (s *shardSet) ready(e *shardEntry) (*shardEntry, error) {
	<-e.ready
	if e.err != nil {
		e.release()
		return nil, e.err
	}
	if now := s.clock.Load(); e.used.Load() != now {
		e.used.Store(now)
	}
	return e, nil
}

func (s *shardSet) acquireSlow(m *shardmap.Map, id shardmap.ShardID) (*shardEntry, error) {
	for {
		s.mu.Lock()
		if s.mu.closed {
			s.mu.Unlock()
			return nil, errShardsClosed
		}
		if e := s.mu.entries[id]; e != nil {
			if e.gone == nil {
				if err := e.of(m); err != nil {
					s.mu.Unlock()
					return nil, err
				}
				e.refs.Add(1)
				s.mu.Unlock()
				return s.ready(e)
			}
			gone := e.gone // being closed: wait, then open it again
			s.mu.Unlock()
			<-gone
			continue
		}
		if ch := s.mu.removing[id.Stream]; ch != nil {
			s.mu.Unlock()
			<-ch
			continue
		}
		st, err := s.checkLocked(m, id)
		if err == nil {
			// By the newest map seen, which may hold a newer stream
			// than m's.
			err = incarnationIn(m, id, st.Created)
		}
		if err != nil {
			s.mu.Unlock()
			return nil, err
		}
		if inc, ok := s.mu.incarnation[st.Name]; !ok {
			// First use this run: make sure the directory holds this
			// stream's data, not an earlier one's of the same name. Opens
			// of its shards wait meanwhile.
			ch := make(chan struct{})
			s.mu.removing[st.Name] = ch
			epoch := s.mu.latest.Epoch
			s.mu.Unlock()
			err := s.claimDir(st, epoch)
			s.mu.Lock()
			delete(s.mu.removing, st.Name)
			if err == nil {
				s.mu.incarnation[st.Name] = st.Created
			}
			s.mu.Unlock()
			close(ch)
			if err != nil {
				return nil, fmt.Errorf("shard %s: %w", id, err)
			}
			continue
		} else if inc != st.Created {
			// Deleted and created again in maps this broker has not
			// applied yet: the apply that does removes the old data.
			s.mu.Unlock()
			return nil, fmt.Errorf("%w: %s was created again at map epoch %d; this broker still holds the stream of epoch %d", errShardGone, id, st.Created, inc)
		}
		if f, ok := s.mu.failed[id]; ok && time.Since(f.at) < failRetry {
			s.mu.Unlock()
			return nil, f.err
		}
		pinned := st.Factor() > 1
		victims, closing, err := s.makeRoomLocked(pinned)
		if err != nil {
			s.mu.Unlock()
			return nil, fmt.Errorf("shard %s: %w", id, err)
		}
		if closing != nil {
			s.mu.Unlock()
			<-closing // a log being closed still holds its files
			continue
		}
		e := &shardEntry{id: id, created: st.Created, ready: make(chan struct{}), pinned: pinned}
		if pinned {
			// Created under s.mu with the newest map: every later map's
			// slots reach it (updateSlotsLocked).
			e.slots = newRaftSlots(s.mu.latest.Epoch, st.Placement.Slots(id.Shard), st.Placement.Owner(id.Shard))
			e.move = st.Placement.MoveID(id.Shard, s.node)
		}
		e.refs.Store(1)
		s.mu.entries[id] = e
		s.mu.Unlock()
		for _, v := range victims {
			if err := s.finish(v); err != nil {
				s.logger.Error("closing idle shard log", "shard", v.id.String(), "err", err)
			}
		}
		s.open(e, st)
		return s.ready(e)
	}
}

// checkLocked returns the stream of id, by m or by the newest map seen if
// that is newer, once id is known to be this broker's and admitted.
func (s *shardSet) checkLocked(m *shardmap.Map, id shardmap.ShardID) (*shardmap.Stream, error) {
	if err := shardmap.ValidateStreamName(id.Stream); err != nil {
		return nil, fmt.Errorf("shard %s: %w", id, err) // never admitted, never on disk
	}
	m = s.latestLocked(m)
	st, ok := m.Stream(id.Stream)
	if !ok || !st.Placement.IsReplica(id.Shard, s.node) {
		return nil, fmt.Errorf("%w: %s at map epoch %d", errShardGone, id, m.Epoch)
	}
	if _, ok := s.mu.admitted[st.Name]; !ok {
		n := ownedBy(st, s.node)
		if s.mu.total+n > s.maxShards {
			return nil, fmt.Errorf("%w: stream %q would add %d shards to the %d this broker holds (MaxShards %d)",
				errShardLimit, st.Name, n, s.mu.total, s.maxShards)
		}
		s.mu.admitted[st.Name] = n
		s.mu.total += n
	}
	return st, nil
}

// latestLocked returns the newer of m and the newest map seen, and
// remembers it.
func (s *shardSet) latestLocked(m *shardmap.Map) *shardmap.Map {
	if s.mu.latest == nil && s.fresh {
		s.noteLostLocked(m)
	}
	if m.NewerThan(s.mu.latest) {
		s.mu.latest = m
	}
	return s.mu.latest
}

// makeRoomLocked retires as many unused logs, least recently used first,
// as it takes for one more to open within the budget, and returns them for
// the caller to close (with finish) once it has released the lock. Logs
// being closed count against the budget until they are: if there are not
// enough unused logs but some are closing, it returns one of those for the
// caller to wait for and try again.
//
// A replica (pinned) opens whatever the budget: a follower must take its
// leader's entries, and first use never comes to it. For one, the unused
// logs there are are retired, without waiting for logs being closed, and
// it is no error when they are not enough.
func (s *shardSet) makeRoomLocked(pinned bool) (victims []*shardEntry, closing chan struct{}, err error) {
	over := len(s.mu.entries) + 1 - s.maxOpen
	if over <= 0 {
		return nil, nil, nil
	}
	var idle []*shardEntry
	closingN := 0
	for _, e := range s.mu.entries {
		switch {
		case e.gone != nil:
			closing = e.gone
			closingN++
		case e.pinned:
		case e.refs.Load() != 0:
			// In use, or still opening: its log is not read (open sets
			// it outside the lock).
		case e.log != nil && e.log.Err() != nil:
			// Failed (a write or an fdatasync): it stays open, refusing
			// records, until the broker restarts. Reopened now, it would
			// read back from the page cache what the failed batch left
			// there, which the kernel may have dropped from the disk,
			// and go on appending after it as if durable (fsyncgate).
		default:
			idle = append(idle, e)
		}
	}
	// The logs already closing make room as they close: only the rest is
	// retired. (Counted as retired, they had K first uses at once, each
	// retiring all the others had, retire K(K+1)/2 logs.)
	if over -= closingN; over <= 0 {
		if pinned {
			return nil, nil, nil
		}
		return nil, closing, nil
	}
	if len(idle) < over {
		switch {
		case pinned:
			over = len(idle)
		case closing != nil:
			return nil, closing, nil
		default:
			return nil, nil, fmt.Errorf("%w: %d logs open, all in use (at most %d: --max-open-shards and --log-memory)", errOpenLimit, len(s.mu.entries), s.maxOpen)
		}
	}
	slices.SortFunc(idle, func(a, b *shardEntry) int { return cmp.Compare(a.used.Load(), b.used.Load()) })
	idle = idle[:over]
	for _, e := range idle {
		e.gone = make(chan struct{})
	}
	return idle, nil, nil
}

// pinBudget is how many logs subscriptions may keep open at once
// (limits.pin): all of them together, and one principal's.
type pinBudget struct{ all, principal int }

// pinBudget returns the budget of subscriptions' logs: three quarters of
// the open-log budget together, and always one log less than all of it
// (a budget of 3 left none), half of it for one principal.
func (s *shardSet) pinBudget() pinBudget {
	return pinBudget{all: max(1, min(s.maxOpen-1, s.maxOpen-s.maxOpen/4)), principal: max(1, s.maxOpen/2)}
}

// open opens e's log (or replica, for a replicated stream st) and makes e
// ready.
func (s *shardSet) open(e *shardEntry, st *shardmap.Stream) {
	defer close(e.ready)
	e.used.Store(s.clock.Add(1))
	cfg := st.StreamConfig
	dir, err := s.shardDir(e.id)
	if err == nil && e.pinned {
		// Filled as the replica applies its committed log (producers.go),
		// first all of it again as it opens (replaying to replayed).
		e.producers = newProducerTable(e.id.String(), s.producerLimits, s.wallClock)
		e.producers.replaying()
		err = s.openGroup(e, dir, st)
	} else if err == nil {
		e.log, err = wal.Open(dir, wal.Options{
			Name:           e.id.String(),
			SegmentSize:    s.segmentSize,
			TailBytes:      s.tailBytes,
			RetentionBytes: cfg.RetentionBytes,
			RetentionAge:   cfg.RetentionAge,
			RetentionCheck: s.retentionCheck,
			Logger:         s.logger,
			OnCommit:       s.tel.onCommit(e),
			Answered:       e.answers.flush,
			AcceptLoss:     s.acceptLoss[e.id.String()],
			ParkedSync:     s.parkedSync,
			SyncGroup:      s.syncGroup,
			FS:             s.walFS,
			Now:            s.wallClock,
		})
		if err == nil {
			e.sl = e.log
		}
	}
	if err != nil {
		e.err = fmt.Errorf("open log of %s: %w", e.id, err)
		s.mu.Lock()
		if s.mu.entries[e.id] == e && e.gone == nil {
			delete(s.mu.entries, e.id) // the next use tries again
		}
		_, again := s.mu.failed[e.id]
		s.mu.failed[e.id] = failure{err: e.err, at: time.Now()}
		s.mu.Unlock()
		var lost *wal.LostRecordsError
		if errors.As(err, &lost) && !again {
			s.reportLost(e.id, lost)
		}
		return
	}
	s.mu.Lock()
	delete(s.mu.failed, e.id)
	s.mu.Unlock()
	if e.log != nil {
		s.openProducers(e)
	}
	first, next := e.sl.FirstOffset(), e.sl.NextOffset()
	s.logger.Debug("shard opened", "shard", e.id.String(), "records", next-first, "first", first, "next", next)
}

// reportLost tells the operator, once per failing streak of opens, that
// the log of id lost acknowledged records: an error line and the metric.
// The shard stays unavailable (its publishes and subscriptions get
// unavailable with the error) until its files are restored or the loss is
// accepted (Config.AcceptLoss), because reusing the offsets would ack new
// records at offsets that were acked before to others.
func (s *shardSet) reportLost(id shardmap.ShardID, lost *wal.LostRecordsError) {
	s.logger.Error("shard log lost acknowledged records; shard unavailable until its files are restored or the loss is accepted with --accept-loss="+id.String(),
		"shard", id.String(), "from", lost.From, "to", lost.To-1, "records", lost.To-lost.From,
		"dir", lost.Dir, "reason", lost.Reason)
	s.tel.countLost(id, lost.To-lost.From)
}

// finish closes the log of a retired entry, once it has opened, and drops
// the entry. A log that stays this broker's takes a last retention pass
// first, and the sweep notes when it is due (closingRetention).
func (s *shardSet) finish(e *shardEntry) error {
	<-e.ready
	var err error
	var last shardStats
	var closed closedLog
	var swept bool
	if e.log != nil {
		closed, swept = s.closingRetention(e)
		last = statsOf(e.log)
		err = e.log.Close()
	}
	if e.group != nil {
		s.raft.unregister(e.id, e.group)
		err = e.group.Close()
	}
	s.mu.Lock()
	if s.mu.entries[e.id] == e {
		delete(s.mu.entries, e.id)
	}
	if e.log != nil && !s.mu.closed && ownedIn(s.mu.latest, e.id, s.node) && sameIncarnation(s.mu.latest, e) {
		s.mu.closedStats[e.id] = last // closed for the budget: still ours
		if swept {
			s.mu.retention[e.id] = closed
		}
	}
	close(e.gone)
	s.mu.Unlock()
	return err
}

// sameIncarnation says whether e's log is of the stream m holds under
// its name, not of one deleted before a stream of that name was created
// again (whose stats and retention are not the old log's).
func sameIncarnation(m *shardmap.Map, e *shardEntry) bool {
	st, ok := m.Stream(e.id.Stream)
	return ok && (e.created == 0 || st.Created == 0 || st.Created == e.created)
}

// openLogs returns the number of logs open (or opening, or closing).
func (s *shardSet) openLogs() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.mu.entries)
}

// close closes every log and the root.
// stopGroups closes every open replica group now; its records still
// waiting for a commit fail with replica.ErrUnknownOutcome. Close calls
// it when the sessions did not drain in time: a group that cannot commit
// (two of its three replicas' disks below the free-space line, say)
// would hold their records, and the sessions with them, forever. The
// entries stay, for close.
func (s *shardSet) stopGroups() {
	s.mu.RLock()
	var groups []*shardEntry
	for _, e := range s.mu.entries {
		select {
		case <-e.ready:
			if e.group != nil {
				groups = append(groups, e)
			}
		default: // still opening: close finishes it
		}
	}
	s.mu.RUnlock()
	for _, e := range groups {
		s.raft.unregister(e.id, e.group)
		if err := e.group.Close(); err != nil { // close's Close of it is a no-op
			s.logger.Error("closing a replica at shutdown", "shard", e.id.String(), "err", err)
		}
	}
}

func (s *shardSet) close() error {
	s.stopSweep()
	s.mu.Lock()
	s.mu.closed = true
	var entries []*shardEntry
	for _, e := range s.mu.entries {
		if e.gone == nil {
			e.gone = make(chan struct{})
			entries = append(entries, e)
		}
	}
	s.mu.Unlock()
	var errs []error
	for _, e := range entries {
		if err := s.finish(e); err != nil {
			errs = append(errs, fmt.Errorf("close shard %s: %w", e.id, err))
		}
	}
	// Entries retired by others are closed by them; wait for them so no
	// log outlives close.
	for {
		s.mu.Lock()
		var gone chan struct{}
		for _, e := range s.mu.entries {
			gone = e.gone
			break
		}
		s.mu.Unlock()
		if gone == nil {
			break
		}
		<-gone
	}
	s.marks.close()
	if err := s.root.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
