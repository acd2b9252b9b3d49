package broker

// # Idempotent publish
//
// A publish with a ProducerID and a ProducerSeq > 0 is idempotent: the
// owner of its shard writes each (producer id, sequence) at most once, so a
// producer may retry a record whose outcome it does not know (a lost
// connection, an unavailable owner) without writing it twice. Sequences
// are per producer and per shard, start at 1 and go up by one (Publish
// carries ProducerID of at most transport.MaxProducerIDLen bytes): a
// producer's records on one shard are committed in
// sequence order. ProducerSeq 0 means "not idempotent": the producer id is
// then metadata only, stored with the record as before.
//
// Each shard's owner keeps a producer table (producerTable) beside its
// log: per producer id, the last sequence committed, the acks (offset,
// commit time) of its most recent Config.ProducerWindow sequences, the
// highest sequence accepted (queued for the log, maybe not yet
// committed), and when it was last used: when a record of it was last
// accepted for the log or applied (an answer that writes nothing, a
// duplicate, is no use, so that every replica of a replicated shard,
// which sees only what is written, dates it alike). A publish of
// sequence s, where
// committed <= accepted are the producer's:
//
//   - s == accepted+1, or s == 1 and the producer is unknown (new,
//     expired or evicted): accepted and appended;
//   - s > 1 and the producer is unknown: unknown_producer (as Kafka's
//     UNKNOWN_PRODUCER_ID); nothing is written. It may be the retry of a
//     record written before the producer was forgotten, or follow a first
//     record that was refused: the client goes on under a new producer
//     id, which is safe because nothing of this one after it was written;
//   - committed < s <= accepted (in flight: queued, not yet committed):
//     not appended again; it waits for the queued record and shares its
//     outcome (the same ack, marked Duplicate, or the same error);
//   - s <= committed and its ack is remembered: answered with the
//     original ack (stream, shard, offset, timestamp, owner), marked
//     Duplicate, and nothing is written;
//   - s <= committed and older than the acks remembered:
//     duplicate_sequence (it is in the log once; its offset is not known
//     any more); nothing is written;
//   - s > accepted+1 (a gap), or s older than anything known of a
//     producer the table learned of midway: out_of_order_sequence;
//     nothing is written.
//
// Records of one producer on one shard reach the log in sequence order:
// one publisher stream dispatches its records one at a time, and should a
// producer have records on two streams at once (a retry on a new
// connection while the old one's records are still being queued), a
// publish waits until the record accepted before it is queued
// (producer.enqueuing), so the log never holds s+1 before s.
//
// A failed append (the log failed or closed) gives its sequence back:
// accepted drops below it (never below committed), so the retry is
// appended.
//
// The table is bounded: at most Config.MaxProducers producers per shard
// (past it the least recently used one with nothing in flight is
// forgotten; when every one has records in flight a new producer is
// refused limit_exceeded), and a producer unused for
// Config.ProducerExpiry is forgotten on its next use or when room is
// needed. A forgotten producer's next record is refused unknown_producer
// unless it is sequence 1 (above): a retry of a later record that comes
// after its producer was forgotten is never written again under it, a
// retry of its first record is (nothing tells it from a new producer's
// first record); the client's new producer id may write a record again,
// as Kafka's producer does after UNKNOWN_PRODUCER_ID. Memory: about 200
// bytes per producer plus its id (at most 128 bytes, kept under its
// principal's name: at most 385, producerscope.go) and 16 bytes per
// remembered ack, at most MaxProducers × (600 + 16 × ProducerWindow) per
// open shard log (about 47 MB with the defaults, if 10,000 producers each
// published 256 records to the same shard within the expiry;
// TestProducerTableMemoryBound measures it). Per broker that is per
// shard log open: R=1 logs up to the open-log budget (MaxOpenShards),
// and every replica of a replicated shard this broker holds, which stays
// open; shards come only from stream creation, which takes the create
// grant.
//
// # Rebuilt from the log
//
// The table is not persisted: when a shard's log is opened (at start, or
// again after the open-log budget closed it), the table is rebuilt by
// reading the log backwards from its end (wal.Log.Read, a chunk at a
// time), newest record first, until it reaches a record ProducerExpiry
// older than the newest (see "Clocks"), has read Config.ProducerRebuildBytes of records (keys,
// values, headers, producer ids), knows MaxProducers producers, or reaches
// the log's first record. Memory is bounded by one chunk of record
// headers; time by the bytes read. A producer whose last record lies
// before where the scan stopped is unknown after the restart (as if it had
// expired), and one whose recent records go back further than the scan
// has fewer acks remembered (older retries get duplicate_sequence). A
// damaged record met by the scan is skipped.
//
// # Replicated shards
//
// A replicated shard (replication factor 3, replicated.go) keeps the same
// table, with the same code, on every replica: not rebuilt by a scan, but
// filled as committed records apply (applied, called by the replica for
// each record with a producer sequence, in log order, with the offset and
// timestamp every replica gives it): committed and the acks follow the
// log as committed does for the owner above. When a replica opens, raft
// applies its whole committed log again (before replica.Open returns),
// which refills the table (bounded
// by MaxProducers and ProducerWindow as always; producers whose last
// record is ProducerExpiry older than the newest, see "Clocks", are
// forgotten on their next use or when room is needed). So whichever
// replica becomes leader has the table. A replica that installs a snapshot (it was behind a retention
// pass of the leader's, see package replica) never applied the records
// it skipped: it takes the leader's table, which the snapshot carries
// (producers_snapshot.go). The leader alone admits (accepted, enqueuing, waiters are its
// own proposals), and only once it has applied everything committed
// before its term; its records are proposed in that term or not at all.
// A record raft drops, or another leader's entries replace, gives its
// sequence back as a failed append does; a publish waiting for it is
// routed again with it. Why this never writes a sequence twice across a
// failover is written at the top of replicated.go.
//
// One order is not kept in every case: if raft drops s (a leadership
// transfer that is then abandoned, or the uncommitted-bytes limit) and
// s+1 of the same producer, admitted before the drop was known and handed
// to the group just after it took s, is proposed and commits, the log
// holds s+1 before the retry of s, or, if s is sent again only after s+1
// committed, without s (the retry gets out_of_order_sequence). Nothing is
// written twice. Records handed to the group together are never split
// this way: after a drop it proposes none of the rest of them.
//
// # Clocks
//
// A producer's last use and its expiry are measured on the table's
// monotonic clock (producerTable.clock): a step of the wall clock neither
// forgets a producer used a moment ago (its retry would be refused
// unknown_producer, and the SDK would write the record again under a new
// producer id) nor keeps one for ever. A replica that applies a
// producer's record as it commits counts that as a use, when it applies
// it: never by the leader's stamp, whose clock may be skewed from this
// one's by more than ProducerExpiry.
//
// Record stamps (the wall clock of the owner, or of the leader) date a
// producer only where the table learns it from records rather than
// seeing it used: the rebuild from the log, a replica's replay of its log
// at open (replaying, replayed), and a snapshot's state. There, as Kafka
// restores producer state from its log, a producer was last used at its
// newest record's stamp; but that is dated against the newest stamp among
// the records read (on a replica, among its producers' records), or the
// wall clock if that is earlier, not against the wall clock alone. So a
// stamp in the future (a clock that was ahead) counts as a use at the
// open, not later: unused, the producer expires ProducerExpiry after the
// open, not once the clock gets there; and a wall clock stepped forward
// since the records were stamped does not expire every producer at the
// open. The price: time the log lay closed, or the broker was down, does
// not count toward expiry, so after a restart a producer may be
// remembered up to ProducerExpiry longer than Kafka would (never shorter;
// bounded by MaxProducers as always).

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
	"github.com/felix-broker/felix/wal"
)

// Defaults of the idempotent-publish bounds, as documented on Config.
const (
	DefaultMaxProducers         = 10000
	DefaultProducerExpiry       = 15 * time.Minute
	DefaultProducerWindow       = 256
	DefaultProducerRebuildBytes = 64 << 20
)

// producerLimits are the bounds of every shard's producer table.
type producerLimits struct {
	max          int
	expiry       time.Duration
	window       int
	rebuildBytes int64
}

// seqAck is what is remembered of a committed sequence: its ack.
type seqAck struct {
	offset uint64
	ts     int64 // commit time, unix ns
}

// producer is one producer's entry in a shard's producer table. Its fields
// are guarded by the table's mu.
type producer struct {
	id        string
	floor     uint64 // sequences <= floor are before anything known of the producer
	committed uint64 // last sequence committed (floor when none known)
	accepted  uint64 // highest sequence queued or committed; >= committed
	// acks holds the acks of sequences committed-n+1 .. committed, the
	// oldest at acks[head]; it grows up to the window, then wraps.
	acks      []seqAck
	head, n   int
	seen      int64 // last use, on the table's monotonic clock (producerTable.clock)
	enqueuing bool  // a record accepted is being queued for the log
	// waiters are publishes of in-flight sequences waiting for the
	// outcome of the record queued with that sequence.
	waiters map[uint64][]*seqWaiter

	prev, next *producer // recency list, most recent first
}

// push remembers the ack of seq, committed.
func (p *producer) push(seq uint64, a seqAck, window int) {
	if seq != p.committed+1 {
		// The sequence jumped (a new producer, or a gap the owner let
		// through after forgetting it): what is remembered is no longer
		// a run ending at committed.
		p.head, p.n = 0, 0
		p.acks = p.acks[:0]
		p.floor = seq - 1
	}
	p.committed = seq
	if p.n < window {
		if len(p.acks) < window {
			if len(p.acks) == cap(p.acks) {
				// Grown by hand, never past the window: append's
				// doubling took a window of 300 to 512 acks.
				grown := make([]seqAck, len(p.acks), min(window, max(4, 2*cap(p.acks))))
				copy(grown, p.acks)
				p.acks = grown
			}
			p.acks = append(p.acks, a)
		} else {
			p.acks[(p.head+p.n)%len(p.acks)] = a
		}
		p.n++
		return
	}
	p.acks[p.head] = a
	p.head = (p.head + 1) % len(p.acks)
}

// ackOf returns the remembered ack of seq, if any.
func (p *producer) ackOf(seq uint64) (seqAck, bool) {
	if seq > p.committed || p.committed-seq >= uint64(p.n) {
		return seqAck{}, false
	}
	i := p.n - 1 - int(p.committed-seq)
	return p.acks[(p.head+i)%len(p.acks)], true
}

// producerTable is one shard's table of producers (see the top of this
// file). Its mutex guards every producer entry: it is taken briefly to
// judge a publish, after its record is queued, and when it commits; no
// wait (except for a concurrent queueing of the same producer, cond) and
// no I/O happens under it.
type producerTable struct {
	shard string
	lim   producerLimits
	// wall is the broker's wall clock (Config.Knobs.Now): it dates
	// record stamps and a snapshot's last uses (see "Clocks"), never an
	// expiry.
	wall func() time.Time
	// born is the origin of the table's monotonic clock (clock).
	born time.Time

	mu struct {
		sync.Mutex
		byID map[string]*producer
		lru  producer   // sentinel of the recency list
		cond *sync.Cond // signalled when a producer stops enqueuing
		// replay, while a replica applies its log again at open
		// (replaying to replayed), holds the newest record stamp of
		// each producer it learns; nil otherwise.
		replay map[*producer]int64
	}
}

// newProducerTable returns an empty table; wall nil means time.Now.
func newProducerTable(shard string, lim producerLimits, wall func() time.Time) *producerTable {
	if wall == nil {
		wall = time.Now
	}
	t := &producerTable{shard: shard, lim: lim, wall: wall, born: time.Now()}
	t.mu.byID = map[string]*producer{}
	t.mu.lru.next, t.mu.lru.prev = &t.mu.lru, &t.mu.lru
	t.mu.cond = sync.NewCond(&t.mu.Mutex)
	return t
}

// clock is the table's monotonic clock, in nanoseconds since it was
// made: producers' last uses and their expiry are measured on it.
func (t *producerTable) clock() int64 { return int64(time.Since(t.born)) }

// lastUse dates, on the table's clock at now, the last use of a producer
// learnt from a record stamped ts rather than seen in use (see "Clocks"):
// ref is the newest stamp of those records, or the wall clock if that is
// earlier.
func lastUse(now, ref, ts int64) int64 { return now - max(0, ref-ts) }

// admitKind is what to do with an idempotent publish.
type admitKind int

const (
	admitAppend     admitKind = iota // append it, then call enqueued and committed
	admitWait                        // in flight: the waiter will get the outcome
	admitDuplicate                   // committed: answer ack
	admitTooOld                      // committed, ack forgotten: duplicate_sequence
	admitOutOfOrder                  // a gap, or before what is known: out_of_order_sequence
	admitUnknown                     // a sequence past 1 of a producer not known: unknown_producer
	admitFull                        // a new producer, and every one known has records in flight: limit_exceeded
)

type admission struct {
	kind admitKind
	p    *producer
	ack  seqAck // admitDuplicate
	// For the error messages: the producer's last committed and accepted
	// sequences, and floor.
	committed, accepted, floor uint64
}

// admit judges sequence seq (> 0) of producer id. For admitAppend the
// caller must queue the record, then call enqueued(a.p), and pass the
// record's outcome to committed. For admitWait the caller registers with
// await.
func (t *producerTable) admit(id string, seq uint64) admission {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock()
	p := t.mu.byID[id]
	for p != nil && p.enqueuing {
		t.mu.cond.Wait()
		p = t.mu.byID[id] // it may have been evicted meanwhile
	}
	if p != nil && t.expired(p, now) {
		t.removeLocked(p)
		p = nil
	}
	if p == nil {
		if seq > 1 {
			// Not its first record: the producer was forgotten (expired,
			// evicted, or beyond what a rebuild read), or its first was
			// refused. What it sent before is unknown here, so this may
			// be a retry of a record written: refused, never written,
			// and the client starts a new producer (Kafka's
			// UNKNOWN_PRODUCER_ID).
			return admission{kind: admitUnknown}
		}
		if !t.makeRoomLocked(now) {
			return admission{kind: admitFull}
		}
		p = &producer{id: strings.Clone(id), floor: seq - 1, committed: seq - 1, accepted: seq - 1}
		t.mu.byID[p.id] = p
		t.pushFrontLocked(p)
		p.seen = now
	}
	a := admission{p: p, committed: p.committed, accepted: p.accepted, floor: p.floor}
	switch {
	case seq == p.accepted+1:
		p.accepted = seq
		p.enqueuing = true
		a.kind = admitAppend
		// A use: what it appends. An answer that writes nothing (a
		// duplicate, a wait, a refusal) is none, as on the replicas of
		// a replicated shard, which see only what is written (applied):
		// so that every replica forgets the same producers (Kafka, too,
		// dates a producer by its last write).
		t.unlinkLocked(p)
		t.pushFrontLocked(p)
		p.seen = now
	case seq > p.accepted || seq <= p.floor:
		a.kind = admitOutOfOrder
	case seq > p.committed:
		a.kind = admitWait
	default:
		if ack, ok := p.ackOf(seq); ok {
			a.kind, a.ack = admitDuplicate, ack
		} else {
			a.kind = admitTooOld
		}
	}
	return a
}

// seqWaiter is a publish waiting for the outcome of an in-flight sequence
// (admitWait): it is called once, by whoever takes it from the table.
type seqWaiter func(seqAck, error)

// await registers w for the outcome of sequence seq of p, in flight when
// admit said admitWait. It returns false if seq is no longer in flight
// there (it completed, or p was forgotten, meanwhile): admit it again.
func (t *producerTable) await(p *producer, seq uint64, w *seqWaiter) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mu.byID[p.id] != p || seq <= p.committed || seq > p.accepted {
		return false
	}
	if p.waiters == nil {
		p.waiters = map[uint64][]*seqWaiter{}
	}
	p.waiters[seq] = append(p.waiters[seq], w)
	return true
}

// unwait takes w, registered by await, back from the table, and reports
// whether it was still there: if so the caller answers it, which the
// outcome of seq, when it comes, no longer does.
func (t *producerTable) unwait(p *producer, seq uint64, w *seqWaiter) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	ws := p.waiters[seq]
	i := slices.Index(ws, w)
	if i < 0 {
		return false
	}
	if ws = slices.Delete(ws, i, i+1); len(ws) == 0 {
		delete(p.waiters, seq)
	} else {
		p.waiters[seq] = ws
	}
	return true
}

// enqueued says the record admitted for p is queued (or failed to be).
func (t *producerTable) enqueued(p *producer) {
	t.mu.Lock()
	p.enqueuing = false
	t.mu.Unlock()
	t.mu.cond.Broadcast()
}

// committed records the outcome of sequence seq of p, queued after
// admitAppend, and hands it to the publishes waiting for it.
func (t *producerTable) committed(p *producer, seq uint64, offset uint64, ts int64, err error) {
	a := seqAck{offset: offset, ts: ts}
	t.mu.Lock()
	waiting := t.settleLocked(p, seq, a, err)
	t.mu.Unlock()
	for _, w := range waiting {
		(*w)(a, err)
	}
}

// settleLocked records the outcome of sequence seq of p and returns the
// publishes waiting for it.
func (t *producerTable) settleLocked(p *producer, seq uint64, a seqAck, err error) []*seqWaiter {
	if err != nil {
		// Not written: the sequence may be sent again. (Never below
		// committed: on a replicated shard a record the proposer saw
		// replaced may have committed after all, from another leader's
		// log, and applied here.)
		if p.accepted >= seq {
			p.accepted = max(seq-1, p.committed)
		}
	} else if seq > p.committed {
		p.push(seq, a, t.lim.window)
		p.accepted = max(p.accepted, seq)
	}
	waiting := p.waiters[seq]
	delete(p.waiters, seq)
	return waiting
}

// applied records that sequence seq of producer id committed at offset
// with timestamp ts: on every replica of a replicated shard, as the
// record's entry applies (replica.Config.OnSequenced), in log order. It
// learns the producer if the table does not know it, and hands the ack
// to the publishes waiting for it. The producer was last used when the
// entry applied here, or, while the replica replays its log at open, as
// its stamp dates it (replayed).
func (t *producerTable) applied(id []byte, seq, offset uint64, ts int64) {
	a := seqAck{offset: offset, ts: ts}
	now := t.clock()
	t.mu.Lock()
	p := t.mu.byID[string(id)]
	if p == nil {
		t.makeRoomLocked(now)
		p = &producer{id: string(id), floor: seq - 1, committed: seq - 1, accepted: seq - 1}
		t.mu.byID[p.id] = p
		t.pushFrontLocked(p)
	} else {
		t.unlinkLocked(p)
		t.pushFrontLocked(p)
		if last, ok := p.ackOf(p.committed); seq <= p.committed && (!ok || offset > last.offset) {
			// Committed after everything this table knows of the
			// producer, at a sequence it already had: the leader that
			// admitted it had forgotten the producer (expired or
			// evicted by its own clock and LRU) and took a new run
			// from seq. The log decides, on every replica alike.
			p.head, p.n, p.acks = 0, 0, p.acks[:0]
			p.floor, p.committed, p.accepted = seq-1, seq-1, seq-1
		}
	}
	p.seen = now
	if t.mu.replay != nil {
		t.mu.replay[p] = max(t.mu.replay[p], ts)
	}
	waiting := t.settleLocked(p, seq, a, nil)
	t.mu.Unlock()
	for _, w := range waiting {
		(*w)(a, nil)
	}
}

// replaying says a replica is about to apply its committed log again
// (it is opening): until replayed, applied notes the stamps of the
// producers it learns.
func (t *producerTable) replaying() {
	t.mu.Lock()
	t.mu.replay = map[*producer]int64{}
	t.mu.Unlock()
}

// replayed says the replay begun by replaying is over: the producers it
// learnt are dated by their newest stamps (see "Clocks"), not by when
// the replay applied them.
func (t *producerTable) replayed() {
	t.mu.Lock()
	defer t.mu.Unlock()
	stamps := t.mu.replay
	t.mu.replay = nil
	if len(stamps) == 0 {
		return
	}
	ref := t.wall().UnixNano()
	newest := int64(math.MinInt64)
	for _, ts := range stamps {
		newest = max(newest, ts)
	}
	ref, now := min(ref, newest), t.clock()
	for p, ts := range stamps {
		p.seen = lastUse(now, ref, ts)
	}
}

// forget forgets every producer, as if each had expired. A replica of a
// replicated shard does it before taking the table a snapshot carries
// (restoreState): it skipped the committed records before the leader's
// compaction point, which may hold later sequences than the table knows,
// and a producer known with an older sequence than its last would have
// its next record refused as out of order. Records in flight still
// complete, as after makeRoomLocked.
func (t *producerTable) forget() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for p := t.mu.lru.next; p != &t.mu.lru; p = t.mu.lru.next {
		t.removeLocked(p)
	}
}

// expired reports whether p has been unused for the expiry and has
// nothing in flight.
func (t *producerTable) expired(p *producer, now int64) bool {
	return now-p.seen > int64(t.lim.expiry) && idle(p)
}

// makeRoomLocked forgets expired producers from the least recently used
// end, then, while the table is full, the least recently used one with
// nothing in flight. It reports whether there is room. A producer with a
// record in flight is never forgotten: its retry would be written again
// (and any client could make that happen to others' producers by making
// new ones).
func (t *producerTable) makeRoomLocked(now int64) bool {
	for last := t.mu.lru.prev; last != &t.mu.lru && t.expired(last, now); last = t.mu.lru.prev {
		t.removeLocked(last)
	}
	for p := t.mu.lru.prev; len(t.mu.byID) >= t.lim.max && p != &t.mu.lru; {
		prev := p.prev
		if idle(p) {
			t.removeLocked(p)
		}
		p = prev
	}
	return len(t.mu.byID) < t.lim.max
}

// idle reports whether p has nothing in flight.
func idle(p *producer) bool {
	return p.accepted == p.committed && !p.enqueuing && len(p.waiters) == 0
}

func (t *producerTable) removeLocked(p *producer) {
	delete(t.mu.byID, p.id)
	delete(t.mu.replay, p)
	t.unlinkLocked(p)
}

func (t *producerTable) unlinkLocked(p *producer) {
	p.prev.next, p.next.prev = p.next, p.prev
	p.prev, p.next = nil, nil
}

func (t *producerTable) pushFrontLocked(p *producer) {
	p.prev, p.next = &t.mu.lru, t.mu.lru.next
	p.prev.next, p.next.prev = p, p
}

func (t *producerTable) pushBackLocked(p *producer) {
	p.prev, p.next = t.mu.lru.prev, &t.mu.lru
	p.prev.next, p.next.prev = p, p
}

// size returns the producers in the table.
func (t *producerTable) size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.mu.byID)
}

// rebuildChunk is how many records the rebuild reads back at a time.
const rebuildChunk = 1024

// rebuildStats says what a rebuild read.
type rebuildStats struct {
	records   int    // records read
	bytes     int64  // their bytes (keys, values, headers, producer ids)
	from      uint64 // offset the scan reached back to
	producers int
	skipped   int    // damaged records skipped
	stop      string // why the scan stopped
}

// rebuildLog is what rebuild reads of a *wal.Log.
type rebuildLog interface {
	FirstOffset() uint64
	NextOffset() uint64
	Read(from uint64, maxRecords, maxBytes int) ([]wal.Record, error)
}

// rebuild fills the table, which must be empty and unused, from the end of
// l (see "Rebuilt from the log" above).
func (t *producerTable) rebuild(l rebuildLog) (rebuildStats, error) {
	type rec struct {
		id  string // points into the log's memory until cloned
		seq uint64
		ack seqAck
	}
	type learnt struct {
		p    *producer
		acks []seqAck // newest first
		done bool     // the run of consecutive sequences has ended
	}
	// Producers are dated by their newest records against ref: the
	// newest record read, or the wall clock if that is earlier (see
	// "Clocks").
	ref, dated, now := t.wall().UnixNano(), false, t.clock()
	found := map[string]*learnt{}
	var order []*learnt // newest producer first
	var st rebuildStats
	first, hi := l.FirstOffset(), l.NextOffset()
	st.from = hi
	chunk := make([]rec, 0, rebuildChunk)
	var err error
scan:
	for {
		switch {
		case hi <= first:
			st.stop = "reached the first record"
			break scan
		case st.bytes >= t.lim.rebuildBytes:
			st.stop = "read ProducerRebuildBytes"
			break scan
		case len(found) >= t.lim.max:
			st.stop = "found MaxProducers producers"
			break scan
		}
		lo := first
		if hi-first > rebuildChunk {
			lo = hi - rebuildChunk
		}
		chunk = chunk[:0]
		for off := lo; off < hi; {
			recs, rerr := l.Read(off, int(hi-off), 1<<20)
			var cerr *wal.CorruptError
			switch {
			case errors.As(rerr, &cerr):
				st.skipped++
				off++
				continue
			case errors.Is(rerr, wal.ErrOutOfRange) && l.FirstOffset() > off:
				// Retention dropped the chunk's start while it was read
				// (the log's background pass): the rest is still there.
				first = min(l.FirstOffset(), hi)
				lo, off = max(lo, first), max(off, first)
				continue
			case rerr != nil:
				err = fmt.Errorf("reading %s at offset %d: %w", t.shard, off, rerr)
				st.stop = "read failed"
				break scan
			case len(recs) == 0:
				off = hi
				continue
			}
			for i := range recs {
				r := &recs[i]
				if r.Offset >= hi {
					break
				}
				st.records++
				st.bytes += int64(len(r.Key) + len(r.Value) + len(r.ProducerID) + headersLen(r.Headers))
				chunk = append(chunk, rec{id: r.ProducerID, seq: r.ProducerSeq, ack: seqAck{offset: r.Offset, ts: r.Timestamp}})
				off = r.Offset + 1
			}
		}
		for i := len(chunk) - 1; i >= 0; i-- {
			r := chunk[i]
			if !dated {
				ref, dated = min(ref, r.ack.ts), true
			}
			if r.ack.ts < ref-int64(t.lim.expiry) {
				st.from = r.ack.offset + 1
				st.stop = "reached ProducerExpiry"
				break scan
			}
			if r.id == "" || r.seq == 0 {
				continue
			}
			lp := found[r.id]
			if lp == nil {
				if len(found) >= t.lim.max {
					continue
				}
				lp = &learnt{p: &producer{id: strings.Clone(r.id), committed: r.seq, accepted: r.seq, seen: lastUse(now, ref, r.ack.ts)}}
				found[lp.p.id] = lp
				order = append(order, lp)
				lp.acks = append(lp.acks, r.ack)
				continue
			}
			if lp.done {
				continue
			}
			if want := lp.p.committed - uint64(len(lp.acks)); r.seq == want && len(lp.acks) < t.lim.window {
				lp.acks = append(lp.acks, r.ack)
			} else {
				lp.done = true // a gap, an older run, or the window is full
			}
		}
		st.from = lo
		hi = lo
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, lp := range order {
		p := lp.p
		p.floor = p.committed - uint64(len(lp.acks))
		p.acks = make([]seqAck, len(lp.acks))
		for i, a := range lp.acks {
			p.acks[len(lp.acks)-1-i] = a
		}
		p.n = len(p.acks)
		t.mu.byID[p.id] = p
		t.pushBackLocked(p) // found newest first
	}
	st.producers = len(order)
	return st, err
}

// openProducers gives e, whose log has just opened, its producer table,
// rebuilt from the log. A failed rebuild leaves what it learnt before the
// failure and is logged; the shard serves all the same.
func (s *shardSet) openProducers(e *shardEntry) {
	t := newProducerTable(e.id.String(), s.producerLimits, s.wallClock)
	began := time.Now()
	st, err := t.rebuild(e.log)
	e.producers = t
	if err != nil {
		s.logger.Error("rebuilding the idempotent producer table from the log; producers older than where it stopped are unknown (their retries are written again)",
			"shard", e.id.String(), "producers", st.producers, "records", st.records, "from", st.from, "err", err)
		return
	}
	if st.skipped > 0 {
		s.logger.Warn("rebuilding the idempotent producer table skipped damaged records", "shard", e.id.String(), "skipped", st.skipped)
	}
	if st.producers > 0 {
		s.logger.Debug("idempotent producer table rebuilt", "shard", e.id.String(), "producers", st.producers,
			"records", st.records, "bytes", st.bytes, "from", st.from, "stop", st.stop, "took", time.Since(began))
	}
}

// admitIdempotent judges an idempotent publish (ProducerID set,
// ProducerSeq > 0) on the shard's owner, before it is appended. It
// returns the producer to append it for, or nil when in has been answered
// (a duplicate, a refusal) or will be, with the outcome of the same
// sequence in flight.
// A publish that waited for the same sequence in flight, whose record
// then failed, is answered as that record was: with the error, or, on a
// replicated shard, routed again (attempt is its routing attempt).
func (p *pubSession) admitIdempotent(in inbound, e *shardEntry, shard int, via string, attempt int) *producer {
	b, pub := p.b, in.pub
	t := e.producers
	for {
		a := t.admit(pub.ProducerID, pub.ProducerSeq)
		switch a.kind {
		case admitAppend:
			return a.p
		case admitDuplicate:
			p.answerDuplicate(in, shard, via, a.ack)
		case admitTooOld:
			p.fail(in, &transport.Error{Code: transport.CodeDuplicateSequence, Owner: b.cfg.NodeID,
				Message: fmt.Sprintf("producer %q committed sequence %d on %s before the last %d it remembers acks for (it is at %d); not written again, its offset is no longer known",
					producerName(pub.ProducerID), pub.ProducerSeq, t.shard, t.lim.window, a.committed)})
		case admitOutOfOrder:
			// From names the sequence expected next: nothing from it on
			// was written, which tells a client whether a record it
			// resent and saw refused by a check before this table (its
			// first send's outcome unknown) had been written.
			werr := &transport.Error{Code: transport.CodeOutOfOrderSequence, Owner: b.cfg.NodeID, From: a.accepted + 1,
				Message: fmt.Sprintf("producer %q sent sequence %d to %s, expected %d: send the records before it first, in order; nothing was written",
					producerName(pub.ProducerID), pub.ProducerSeq, t.shard, a.accepted+1)}
			if pub.ProducerSeq <= a.floor {
				werr.From = 0
				werr.Message = fmt.Sprintf("producer %q sent sequence %d to %s, older than the first it knows of (%d): its outcome is not known here; nothing was written",
					producerName(pub.ProducerID), pub.ProducerSeq, t.shard, a.floor+1)
			}
			p.fail(in, werr)
		case admitUnknown:
			p.fail(in, &transport.Error{Code: transport.CodeUnknownProducer, Owner: b.cfg.NodeID,
				Message: fmt.Sprintf("producer %q is not known on %s (forgotten, or its first record was refused) and sent sequence %d: a producer starts at 1; nothing was written",
					producerName(pub.ProducerID), t.shard, pub.ProducerSeq)})
		case admitFull:
			msg := fmt.Sprintf("%s has %d idempotent producers, each with records in flight (MaxProducers): no room for producer %q; nothing was written", t.shard, t.lim.max, producerName(pub.ProducerID))
			b.limits.hit(limitProducers, p.from.principal+p.peerID, msg)
			p.fail(in, &transport.Error{Code: transport.CodeLimitExceeded, Owner: b.cfg.NodeID, Message: msg})
		case admitWait:
			var bound atomic.Pointer[time.Timer] // boundWait's, stopped once answered
			w := seqWaiter(func(ack seqAck, err error) {
				if tm := bound.Load(); tm != nil {
					tm.Stop()
				}
				switch {
				case err == nil:
				case e.group != nil:
					p.replicatedFailed(in, e, shardmap.ShardID{Stream: pub.Stream, Shard: shard}, attempt, err)
					return
				default:
					p.fail(in, appendError(b, t.shard, err))
					return
				}
				p.answerDuplicate(in, shard, via, ack)
			})
			if !t.await(a.p, pub.ProducerSeq, &w) {
				continue
			}
			if e.group != nil && b.cfg.CommitTimeout > 0 {
				bound.Store(p.boundWait(in, e, a.p, &w))
			}
		}
		return nil
	}
}

// boundWait returns a timer that answers in, the retry of an idempotent
// record of a replicated shard waiting for the outcome of the same
// sequence in flight (w in prod's waiters), with a timeout after
// CommitTimeout if that outcome has not come by then, taking w back from
// the table. The record in flight was answered so at its own
// CommitTimeout, but its entry may wait for a majority for as long as
// the followers cannot write (their disks full), and each retry waited
// with it, unanswered, holding its session open: one more for every
// retry the client sent.
func (p *pubSession) boundWait(in inbound, e *shardEntry, prod *producer, w *seqWaiter) *time.Timer {
	b, seq := p.b, in.pub.ProducerSeq
	return time.AfterFunc(b.cfg.CommitTimeout, func() {
		if !e.producers.unwait(prod, seq, w) {
			return // its outcome came first
		}
		p.fail(in, &transport.Error{Code: transport.CodeTimeout,
			Message: fmt.Sprintf("%s has sequence %d of producer %q in flight to %s, and its group did not commit it within %v (CommitTimeout): fewer than a majority of the replicas have written it so far; it may still be committed",
				b.cfg.NodeID, seq, producerName(in.pub.ProducerID), e.id, b.cfg.CommitTimeout)})
	})
}

// refusedForDisk refuses in, an idempotent record admitted for prod to
// append, when the disk is too full to take it (diskFull), and undoes its
// admission: nothing is written, and the sequence may be sent again. An
// idempotent record is judged by its producer table before the disk's
// free space is checked, since a retry of a record already written needs
// no space: refused for the disk, the retry of a record committed before
// the disk filled up was told "not written", and the client's next
// records went out under a new producer id, writing them twice.
func (p *pubSession) refusedForDisk(in inbound, e *shardEntry, prod *producer) bool {
	werr := p.diskFull()
	if werr == nil {
		return false
	}
	e.producers.committed(prod, in.pub.ProducerSeq, 0, 0, werr)
	e.producers.enqueued(prod)
	p.fail(in, werr)
	return true
}

// answerDuplicate answers in, a retry of a record already committed at
// ack, with the original's ack.
func (p *pubSession) answerDuplicate(in inbound, shard int, via string, ack seqAck) {
	b, pub := p.b, in.pub
	p.reply(&in, &transport.Ack{Seq: pub.Seq, Stream: pub.Stream, Shard: int32(shard), Offset: ack.offset,
		Timestamp: ack.ts, Owner: b.cfg.NodeID, Via: via, Forwarded: via != b.cfg.NodeID, Duplicate: true})
}

// appendError is the answer to a record the log of shard failed to write.
func appendError(b *Broker, shard string, err error) *transport.Error {
	code := transport.CodeInternal
	if errors.Is(err, wal.ErrClosed) {
		code = transport.CodeShuttingDown
	}
	return &transport.Error{Code: code, Message: fmt.Sprintf("%s could not write %s: %v", b.cfg.NodeID, shard, err)}
}
