package replica

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/felix-broker/felix/internal/logonce"
	"github.com/felix-broker/felix/wal"
)

// Config configures one replica of a group. Zero values mean the defaults
// written on each field.
type Config struct {
	ID    uint64   // this replica's raft id; required, never 0, never reused
	Peers []uint64 // the voters of a new group (ID among them, unless Join); a directory that holds a group keeps its own
	// Join opens a new replica that joins an existing group under a new
	// id (replacing a lost one): Peers is then the group's configuration
	// at its creation, without ID, and the replica takes no part until
	// the leader admits it (Admit; see members.go).
	Join bool
	Dir  string // the replica's directory: the log's segments and the state file; required
	Name string // the group's name in errors and logs (e.g. the shard); default Dir

	Transport Transport    // where outgoing raft messages go; required
	Logger    *slog.Logger // default slog.Default()

	ElectionTicks  int // ticks without a leader before a follower campaigns; default 10
	HeartbeatTicks int // ticks between a leader's heartbeats; default 1

	// MaxEntryBytes bounds the records of one entry (one group-commit
	// batch): more waiting records go into further entries of the same
	// Ready. A larger record fails with ErrTooLarge. Default 1 MiB.
	MaxEntryBytes int
	// MaxInflightMsgs bounds the append messages in flight to one follower;
	// default 256.
	MaxInflightMsgs int
	// MaxInflightBytes bounds the entries' data in flight to one follower
	// (raft's own bound: one more append may pass it); at least
	// MaxEntryBytes, default 4 × MaxEntryBytes: a leader keeps four full
	// batches in flight per follower (at 4 MiB and 10 ms between an
	// append and its answer, 400 MB/s per group). A replica drops the
	// peers' messages beyond four times this that wait for its goroutine
	// (Step): a leader given more than its followers may see its appends
	// dropped while a follower's fdatasync is slow.
	MaxInflightBytes uint64
	// MaxUncommittedBytes bounds the leader's entries not yet committed;
	// proposals over it are refused. Default 64 MiB.
	MaxUncommittedBytes uint64
	// CommitTimeout, when positive, bounds how long an append's caller
	// waits to hear of its record: a record whose entry is not committed
	// that long after it was proposed (no majority can write it, or the
	// leader lost its quorum) is told ErrCommitTimeout, checked once a
	// tick, and later told its fate once more. 0: no bound, and each
	// record is told once.
	CommitTimeout time.Duration
	// SegmentSize is the size at which the log starts a new segment file;
	// default 1 MiB, as package wal's and for the same reason: tidwall
	// keeps the tail segment in a byte slice that grows by reallocation
	// as entries are appended. With 64 MiB segments that growth (fresh
	// pages, copies of the whole slice) took a third of each broker's CPU
	// in the R=3 throughput bench, and up to 64 MiB per replica.
	SegmentSize int
	// SyncGroup, shared with the other logs of the process on the same
	// disk, parks this replica's fdatasyncs while at least the group's
	// threshold of its logs have entries to write, as wal's committers
	// do (see wal.SyncGroup); otherwise, and with none, they block.
	SyncGroup *wal.SyncGroup
	// TailBytes bounds the data of the most recently committed entries kept
	// in memory for reads (live subscribers read them without going to
	// disk); default 4 MiB, negative keeps none.
	TailBytes int

	// Quiesce lets an idle group stop ticking and heartbeating
	// (quiesce.go). Only for an owner that watches the liveness of the
	// group's hosts and calls Wake when one falls silent or comes back:
	// without that, a quiet group whose leader dies never elects another.
	Quiesce bool

	// RetentionBytes and RetentionAge, when positive, bound what the log
	// keeps (retention.go): the owner calls EnforceRetention to apply
	// them. Default 0: everything is kept.
	RetentionBytes int64
	RetentionAge   time.Duration

	// SnapshotState, if set, returns the owner's state to carry in a
	// snapshot this replica sends (retention.go), at most about
	// MaxEntryBytes: state built from the committed entries (the
	// broker's idempotent producers), as of every entry applied here,
	// which may be past the snapshot's index. The receiver applies the
	// entries after the snapshot's index again on top of it, so the
	// state must take an entry it already reflects as a no-op. It runs
	// on the group's goroutine and must not block.
	SnapshotState func() []byte

	// OnRestore, if set, learns that this replica installed a snapshot
	// (retention.go): its log now starts after the leader's compaction
	// point, and the committed records before it were never applied
	// here (OnSequenced did not see them). state is what the leader's
	// SnapshotState returned (nil if none): it comes from a peer, so it
	// is bad input until checked. It runs on the group's goroutine and
	// must not block.
	OnRestore func(state []byte)

	// OnSequenced, if set, learns of every committed record that carries
	// a producer sequence, as its entry applies (see sequenced.go). It
	// runs on the group's goroutine and must not block.
	OnSequenced func(producerID []byte, producerSeq, offset uint64, ts int64)

	// OnSync, if set, learns how long each write and fdatasync of
	// appended entries took (a leader's own and a follower's, once the
	// fdatasync succeeded), how many records the entries' batches held and
	// how many bytes they made durable: what package wal's OnCommit tells
	// of a shard log of replication factor 1, for the owner's metrics. It
	// runs on the group's goroutine and must not block.
	OnSync func(d time.Duration, records int, bytes int64)

	// Knobs are for tests only.
	Knobs Knobs
}

// Knobs are testing seams. They run once per Ready, never per record.
type Knobs struct {
	// BeforeSync, if set, runs before the fdatasync of appended entries
	// (last is the last index written). An error fails the fdatasync.
	BeforeSync func(last uint64) error
	// UncheckedStep hands peers' messages to raft without the checks
	// against the log (checkAgainstLog), so that a test can make raft
	// panic and see the panic contained.
	UncheckedStep bool
	// Now, if set, is the proposer's clock for the timestamps of the
	// batches it proposes (a leader whose clock is off); nil: time.Now.
	Now func() time.Time
	// AfterSnapshotState, if set, runs in a snapshot install once the new
	// state (compaction point and commit at the snapshot's index) is
	// durable and before the log is replaced: where a test copies the
	// directory as a kill -9 there would leave it. An error fails the
	// install.
	AfterSnapshotState func() error
}

func (c Config) withDefaults() (Config, error) {
	if c.ID == 0 {
		return c, errors.New("replica: Config.ID is required and must not be 0")
	}
	if c.Dir == "" {
		return c, errors.New("replica: Config.Dir is required")
	}
	if c.Transport == nil {
		return c, errors.New("replica: Config.Transport is required")
	}
	if len(c.Peers) > 0 && !c.Join && !slices.Contains(c.Peers, c.ID) {
		return c, fmt.Errorf("replica: Config.Peers %v does not hold Config.ID %d", c.Peers, c.ID)
	}
	if c.Name == "" {
		c.Name = c.Dir
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ElectionTicks == 0 {
		c.ElectionTicks = 10
	}
	if c.HeartbeatTicks == 0 {
		c.HeartbeatTicks = 1
	}
	if c.MaxEntryBytes == 0 {
		c.MaxEntryBytes = 1 << 20
	}
	if c.MaxInflightMsgs == 0 {
		c.MaxInflightMsgs = 256
	}
	if c.MaxInflightBytes == 0 {
		c.MaxInflightBytes = 4 * uint64(c.MaxEntryBytes)
	}
	if c.MaxInflightBytes < uint64(c.MaxEntryBytes) {
		return c, fmt.Errorf("replica: Config.MaxInflightBytes %d is below MaxEntryBytes %d", c.MaxInflightBytes, c.MaxEntryBytes)
	}
	if c.MaxUncommittedBytes == 0 {
		c.MaxUncommittedBytes = 64 << 20
	}
	if c.SegmentSize == 0 {
		c.SegmentSize = 1 << 20
	}
	if c.TailBytes == 0 {
		c.TailBytes = 4 << 20
	}
	return c, nil
}

// Group is one replica of a shard's raft group. One goroutine, started by
// Open and stopped by Close, owns the RawNode and the storage; the methods
// only hand it work (AppendAsync, Step, Tick) or read what it published
// (Read, Watch, NextOffset, Leader), and are safe for concurrent use.
type Group struct {
	cfg    Config
	logger *slog.Logger
	st     *storage
	rn     *raft.RawNode // run goroutine only
	// applied is the last index applied, and confs the configurations
	// applied after the compaction point, in log order (run goroutine
	// only): what a compaction and a snapshot are made of.
	applied uint64
	confs   []confAt
	offs    offsetIndex
	tail    *entryTail // recent committed entries, for Read
	// readersHeld is what the group's Readers keep between reads, at
	// most readersHold (reader.go).
	readersHeld atomic.Int64

	// in is the work handed to the run goroutine. Its own lock: appenders,
	// the transport and the ticker only contend for a brief append here.
	in struct {
		sync.Mutex
		buf   []byte // encoded records waiting to be proposed, back to back
		ends  []int  // where each record of buf ends
		dones []func(offset uint64, ts int64, err error)
		msgs  []*pb.Message
		// msgBytes is what msgs hold (stepCost), at most stepQueueBytes
		// or one message alone (Step).
		msgBytes int
		ticks    int
		// term is the term the records in buf were handed over in: they
		// are proposed in it or not at all.
		term uint64
		// transfer is the replica TransferLeadership last asked to hand
		// the leadership to, 0 for none.
		transfer uint64
		// handedBy is the replica whose MsgTimeoutNow (its leadership
		// handed over to this one) was last stepped, handedAt when; see
		// HandedOverBy.
		handedBy uint64
		handedAt time.Time
		// resign is set by Resign, until the run goroutine takes it;
		// resigned is the channel Resign returned, closed (and set to
		// nil) once the replica does not lead or has no voter to hand
		// the leadership to (see handOff).
		resign   bool
		resigned chan struct{}
		admits   []admitRequest
		retains  []retainRequest
		wake     bool   // Wake was called
		silent   uint64 // the replica WakeSilent last named
		closed   bool
		err      error // set when the group failed
	}
	wake     chan struct{} // capacity 1: there is work in in
	replayed chan struct{} // closed once the committed log was applied at open
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once

	leader atomic.Uint64 // leader known to this replica, 0 if none
	quiet  atomic.Bool   // the run goroutine's loop.quiet, for Quiesced
	term   atomic.Uint64
	// catch is where the replica stands against its leader (CatchUp).
	catch catchUp
	// appliedTerm is the term of the last entry applied (LeaderTerm).
	appliedTerm atomic.Uint64

	// conf is the configuration this replica applied: the state file's
	// (at creation) until raft replays the changes in the log.
	conf   atomic.Pointer[pb.ConfState]
	rounds atomic.Uint64 // rounds of work the run goroutine finished, for tests to wait on
	// dropped limits the log lines for peers' messages dropped by
	// checkAgainstLog to one per peer and message type, and by Step
	// (queue full) to one per peer.
	dropped logonce.Set
	// overflows counts the messages Step dropped with its queue full.
	overflows atomic.Uint64
	// lost is why the replica's log was lost (see Lost), a string once
	// set.
	lost atomic.Value
}

// Open opens (or creates) the replica in cfg.Dir and starts its goroutine.
// A new group needs cfg.Peers; the first election happens after
// ElectionTicks calls of Tick.
func Open(cfg Config) (*Group, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	st, err := openStorage(cfg.Dir, cfg.Name, cfg.Peers, cfg.SegmentSize, cfg.Logger)
	if err == nil {
		st.member = cfg.SyncGroup.Member()
	}
	if err != nil {
		return nil, err
	}
	st.beforeSync = cfg.Knobs.BeforeSync
	st.onSync = cfg.OnSync
	st.afterSnapshotState = cfg.Knobs.AfterSnapshotState
	if len(st.p.conf.GetVoters()) == 0 {
		_ = st.close()
		return nil, fmt.Errorf("replica: group %q: no voters: a new group needs Config.Peers", cfg.Name)
	}
	g := &Group{
		cfg:      cfg,
		logger:   cfg.Logger.With("group", cfg.Name, "replica", cfg.ID),
		st:       st,
		tail:     newEntryTail(cfg.TailBytes),
		wake:     make(chan struct{}, 1),
		replayed: make(chan struct{}),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	// Applied starts at the compaction point: raft hands every committed
	// entry after it to apply again, which rebuilds the offset index.
	g.offs.reset(st.p.snapIndex+1, st.p.snapNext)
	g.applied = st.p.snapIndex
	g.rn, err = raft.NewRawNode(&raft.Config{
		ID:                        cfg.ID,
		ElectionTick:              cfg.ElectionTicks,
		HeartbeatTick:             cfg.HeartbeatTicks,
		Storage:                   raftStorage{st, g},
		Applied:                   st.p.snapIndex,
		MaxSizePerMsg:             uint64(cfg.MaxEntryBytes),
		MaxCommittedSizePerReady:  uint64(4 * cfg.MaxEntryBytes),
		MaxUncommittedEntriesSize: cfg.MaxUncommittedBytes,
		MaxInflightMsgs:           cfg.MaxInflightMsgs,
		MaxInflightBytes:          cfg.MaxInflightBytes,
		CheckQuorum:               true,
		PreVote:                   true,
		DisableProposalForwarding: true,
		Logger:                    raftLogger{g.logger},
	})
	if err != nil {
		_ = st.close()
		return nil, fmt.Errorf("replica: group %q: start raft: %w", cfg.Name, err)
	}
	g.term.Store(st.p.term)
	g.conf.Store(st.p.conf)
	go g.run()
	select {
	case <-g.replayed:
	case <-g.done:
		err := g.Err()
		_ = g.st.close()
		return nil, fmt.Errorf("replica: group %q: replaying the log at open: %w", cfg.Name, err)
	}
	return g, nil
}

// raftStorage is a group's raft.Storage: its log and state, and the
// snapshot the group makes of its compaction point (retention.go).
type raftStorage struct {
	*storage
	g *Group
}

// Snapshot implements raft.Storage.
func (r raftStorage) Snapshot() (*pb.Snapshot, error) { return r.g.snapshot() }

// ID returns this replica's raft id.
func (g *Group) ID() uint64 { return g.cfg.ID }

// Leader returns the leader this replica knows of (0 if none) and the
// current term, for routing. A leader id with a term is fenced: a later
// term's leader supersedes it.
func (g *Group) Leader() (id, term uint64) { return g.leader.Load(), g.term.Load() }

// IsLeader reports whether this replica is the leader it knows of.
func (g *Group) IsLeader() bool { return g.leader.Load() == g.cfg.ID }

// AppendAsync proposes r and calls done once its fate is known, from the
// group's goroutine (done must not block): with its offset and timestamp
// once a majority of replicas has fsynced it and it is committed, or with
// an error: a *NotLeaderError (never committed), ErrUnknownOutcome (the
// group closed or failed first, or a snapshot replaced the log holding
// its entry), ErrClosed, ErrFailed or ErrTooLarge.
// With Config.CommitTimeout, done may be called twice: first with
// ErrCommitTimeout, then with the record's fate.
// Records waiting while the group's goroutine handles a Ready go into one
// entry, proposed in the term they were handed over in or not at all (a
// *NotLeaderError). Key, Value, ProducerID and Headers are copied.
func (g *Group) AppendAsync(r *wal.Record, done func(offset uint64, ts int64, err error)) {
	g.appendIn(0, r, done)
}

// appendIn is AppendAsync, and AppendInTerm for a term other than 0.
func (g *Group) appendIn(term uint64, r *wal.Record, done func(offset uint64, ts int64, err error)) {
	if size := recordSize(r); size+batchFixed+10 > g.cfg.MaxEntryBytes {
		done(0, 0, fmt.Errorf("replica: group %q: %w: %d bytes, the limit is %d", g.cfg.Name, ErrTooLarge, size, g.cfg.MaxEntryBytes))
		return
	}
	g.in.Lock()
	if err := g.refusal(); err != nil {
		g.in.Unlock()
		done(0, 0, err)
		return
	}
	// Records waiting together were all handed over in one term: the
	// leader they were handed to cannot lead in a later term before the
	// run goroutine takes them (that needs a round of votes), so a record
	// of another term is not from this leadership.
	lead, cur := g.leader.Load(), g.term.Load()
	if lead != g.cfg.ID || term != 0 && term != cur || len(g.in.dones) > 0 && g.in.term != cur {
		g.in.Unlock()
		done(0, 0, &NotLeaderError{Group: g.cfg.Name, Leader: lead, Term: cur})
		return
	}
	g.in.term = cur
	g.in.buf = appendBatchRecord(g.in.buf, r)
	g.in.ends = append(g.in.ends, len(g.in.buf))
	g.in.dones = append(g.in.dones, done)
	g.in.Unlock()
	g.signal()
}

// AppendNow is AppendAsync: a group has no inline commit to offer (every
// entry goes through the group's goroutine and the replicas). It exists so
// that *Group and *wal.Log fit one interface.
func (g *Group) AppendNow(r *wal.Record, done func(offset uint64, ts int64, err error)) {
	g.AppendAsync(r, done)
}

// refusal is why new work is refused, or nil. Callers hold g.in.
func (g *Group) refusal() error {
	switch {
	case g.in.err != nil:
		return fmt.Errorf("replica: group %q: %w: %w", g.cfg.Name, ErrFailed, g.in.err)
	case g.in.closed:
		return fmt.Errorf("replica: group %q: %w", g.cfg.Name, ErrClosed)
	}
	return nil
}

// Step hands the group a message a peer sent it. It never blocks on the
// group's work. A message that no correct peer of this version sends (see
// step.go) gets ErrBadMessage and never reaches raft; a closed group
// ErrClosed, a failed one ErrFailed. Whatever a peer sends, raft's panics
// included, cannot take the process down: at worst this group fails.
//
// The messages waiting for the group's goroutine are bounded: while it is
// held up (a slow fdatasync), a message that would take them past four
// times Config.MaxInflightBytes (stepCost: about what they hold decoded)
// is dropped, as a network may lose it, and logged once per peer; Step
// returns nil. Raft sends again what is lost (the next append or
// heartbeat finds this replica behind). A message is taken whatever its
// size when nothing waits: a leader configured for larger entries than
// this replica (brokers' record limits changed one at a time) sends
// appends over the bound, which would otherwise be dropped every time
// and never committed; what it costs is bounded by the caller's frame
// limit. A correct leader has at most MaxInflightBytes of entries' data
// and one append in flight to it, which with the smallest entries (a
// batch of one record, 38 bytes) counts under three times that, so only
// a peer that ignores the bound, or the appends of a leader that probes
// this replica while its earlier ones still wait, can lose messages
// here.
func (g *Group) Step(m *pb.Message) error {
	if err := checkMessage(m, g.cfg.ID); err != nil {
		return fmt.Errorf("replica: group %q: %w", g.cfg.Name, err)
	}
	cost := stepCost(m)
	g.in.Lock()
	if err := g.refusal(); err != nil {
		g.in.Unlock()
		return err
	}
	if g.in.msgBytes > 0 && g.in.msgBytes+cost > g.stepQueueBytes() {
		queued := g.in.msgBytes
		g.in.Unlock()
		g.overflows.Add(1)
		if g.dropped.First(fmt.Sprintf("%d/queue", m.GetFrom())) {
			g.logger.Warn("replica: dropped a peer's message: too much waits for the group's goroutine (logged once per peer)",
				"peer", m.GetFrom(), "type", m.GetType().String(), "term", m.GetTerm(), "bytes", cost, "queued", queued)
		}
		return nil
	}
	g.in.msgs = append(g.in.msgs, m)
	g.in.msgBytes += cost
	g.in.Unlock()
	g.signal()
	return nil
}

// stepQueueBytes bounds the messages waiting for the group's goroutine
// (Step), as stepCost counts them.
func (g *Group) stepQueueBytes() int {
	return int(min(4*g.cfg.MaxInflightBytes, 1<<40))
}

// Fixed costs of a message and of an entry in Step's bound: about what
// one holds decoded besides its data (the structs, the pointers to their
// fields).
const (
	stepMsgCost   = 256
	stepEntryCost = 64
)

// stepCost is what m counts against Step's bound: its entries' and
// snapshot's data and its context, and fixed costs for the message and
// each entry.
func stepCost(m *pb.Message) int {
	n := stepMsgCost + len(m.GetContext()) + len(m.GetSnapshot().GetData())
	for _, e := range m.GetEntries() {
		n += stepEntryCost + len(e.GetData())
	}
	return n
}

// Tick advances the group's logical clock by one tick (elections and
// heartbeats count ticks). The owner calls it at its tick interval, so
// that one timer can drive many groups. It never blocks.
func (g *Group) Tick() {
	if g.quiet.Load() {
		return // a quiet group takes no ticks (quiesce.go)
	}
	g.in.Lock()
	g.in.ticks++
	g.in.Unlock()
	g.signal()
}

func (g *Group) signal() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// Close stops the group's goroutine and closes its files. Records not yet
// proposed fail with ErrClosed, proposed ones whose fate is not known yet
// with ErrUnknownOutcome. It returns the storage's close error, if any.
func (g *Group) Close() error {
	var err error
	g.once.Do(func() {
		g.in.Lock()
		g.in.closed = true
		g.in.Unlock()
		close(g.stop)
		<-g.done
		err = g.st.close()
	})
	return err
}

// Read returns committed records from offset from on, at most max records
// and about maxBytes of keys and values (at least one record if any).
// It returns no records at NextOffset, and ErrOutOfRange below the first
// retained offset. A read that meets an error (a damaged entry) after it
// has records returns those, and the next read, from the record after
// them, the error. Recent records come from memory (Config.TailBytes):
// their Key, Value and Headers may share memory with the Group and other
// readers, so do not modify them.
func (g *Group) Read(from uint64, max int, maxBytes int) ([]wal.Record, error) {
	return g.offs.read(g.tail, g.cfg.Name, diskEntries{g.st}, from, max, maxBytes)
}

// TransferLeadership asks this replica, if it leads, to hand the
// leadership to replica to, provided to is responsive and has every
// committed entry (raft's leader transfer: to campaigns at once). Proposals made meanwhile are dropped (their
// callers get ErrDropped, never committed); a transfer that does not end
// within an election timeout is abandoned. It never blocks.
func (g *Group) TransferLeadership(to uint64) {
	g.in.Lock()
	g.in.transfer = to
	g.in.Unlock()
	g.signal()
}

// HandedOverBy returns the replica that last handed this one its
// leadership (raft's leader transfer: its MsgTimeoutNow), and when; 0 if
// none has. A replica hands its leadership over when it resigns (Resign:
// it is closing), so a caller that hands leaderships back to a preferred
// replica waits a while before it hands one back to the replica that
// gave it away.
func (g *Group) HandedOverBy() (id uint64, at time.Time) {
	g.in.Lock()
	defer g.in.Unlock()
	return g.in.handedBy, g.in.handedAt
}

// Resign makes the replica give the leadership away for good, as a
// replica about to be closed does: while it leads, it hands the
// leadership to the voter that answers and holds the most of the log
// (raft's leader transfer, as TransferLeadership), and hands it on again
// whenever it comes back (an election won, a peer handing it back),
// until Close. Proposals made during a transfer are dropped (ErrDropped);
// those proposed before it keep their fate: the new leader commits them
// or replaces them (NotLeaderError with Replaced), so a record is never
// acked falsely. It never blocks. The channel returned is closed once the
// replica does not lead, or leads with no voter that answers to take
// over, or is closed.
func (g *Group) Resign() <-chan struct{} {
	g.in.Lock()
	defer g.in.Unlock()
	if g.in.resigned == nil {
		g.in.resigned = make(chan struct{})
	}
	ch := g.in.resigned
	if g.in.closed || g.in.err != nil {
		g.resignedLocked()
	} else {
		g.in.resign = true
		g.signal()
	}
	return ch
}

// resignedLocked closes the channel Resign last returned, if still open;
// g.in is held.
func (g *Group) resignedLocked() {
	if g.in.resigned != nil {
		close(g.in.resigned)
		g.in.resigned = nil
	}
}

// Err returns why the group takes no more work (it failed: ErrFailed; or
// it is closed: ErrClosed), nil while it runs. A reader of a failed
// replica gets what it had, and nothing more.
func (g *Group) Err() error {
	g.in.Lock()
	defer g.in.Unlock()
	return g.refusal()
}

// Lost returns an error matching ErrLogLost once a leader's heartbeat said
// this replica holds committed entries that its log lacks (its directory
// was lost while it was down), else nil. Raft will not send those entries
// again to the same replica id, so it never catches up; the group keeps
// running (it never acks, see step.go), but a reader waiting on it would
// wait forever and should read from another replica.
func (g *Group) Lost() error {
	if why, ok := g.lost.Load().(string); ok {
		return fmt.Errorf("replica: group %q: %w: %s", g.cfg.Name, ErrLogLost, why)
	}
	return nil
}

// Size returns the bytes of this replica's segment files, as of its last
// write or retention pass. It does no I/O.
func (g *Group) Size() int64 { return g.st.bytes.Load() }

// NextOffset returns the offset the next committed record will get.
func (g *Group) NextOffset() uint64 { return g.offs.nextOffset() }

// FirstOffset returns the first offset Read can return.
func (g *Group) FirstOffset() uint64 { return g.offs.firstOffset() }

// Watch returns NextOffset and a channel closed when it moves on.
func (g *Group) Watch() (next uint64, changed <-chan struct{}) { return g.offs.watch() }
