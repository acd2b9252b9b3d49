package broker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// # The producer table in a snapshot
//
// A replica that installs a snapshot (replica.Config.OnRestore) never
// applies the committed records before the leader's compaction point, so
// it cannot learn their producers the way every other replica did. The
// leader therefore carries its table in the snapshot
// (replica.Config.SnapshotState): what it knows of each producer as of
// its last applied entry, which is at or past the snapshot's index. The
// follower then applies the entries after the snapshot's index on top of
// it; those the table already reflects change nothing (applied ignores a
// sequence at or below a producer's committed one), so it ends with the
// table every other replica has. Without it, a producer's retry of a
// record before the compaction point would be written a second time by
// this replica once it leads.
//
// Only what commits decide is carried (floor, committed, the remembered
// acks, last use), never what a leader has in flight. Last use is on the
// leader's monotonic clock, which means nothing to another process: it
// is carried as the leader's wall-clock time of it as the state is
// taken, and the follower dates each producer by how long before the
// state's most recent producer it was last used (or before its own
// wall clock, if that is earlier), so that a skew between the two
// clocks neither expires the producers at once nor keeps them longer
// than ProducerExpiry past the state's time (see "Clocks" in
// producers.go). The state is
// bounded by bytes (an entry's, MaxEntryBytes): producers most recently
// used first, each with its last ack, then each with as many more of its
// most recent acks as the budget leaves.
// A producer that does not fit is forgotten by the follower, as if
// expired; one that comes with fewer acks answers a retry of an older
// sequence with duplicate_sequence. Nothing is written twice either way.
//
// The state is not persisted: a replica that restarts rebuilds its table
// from its own log, as every replica does (producers.go).
//
// Format (version 1): the version byte, then per producer, most recently
// used first: uvarint len(id), id, uvarint floor, uvarint committed,
// varint last use (unix ns, by the sender's wall clock), uvarint n, then
// the acks of sequences
// committed-n+1 .. committed, oldest first: uvarint offset, varint commit
// time (unix ns).

// producerStateVersion is the first byte of a producer table's state.
const producerStateVersion = 1

// Worst-case encoded sizes, so that a state never exceeds its budget.
const (
	producerEntryMax = 4*binary.MaxVarintLen64 + 1 // lengths and numbers of one producer, besides its id and acks
	producerAckMax   = 2 * binary.MaxVarintLen64
)

// snapshotState encodes the table in at most budget bytes; nil if it
// knows no producer.
func (t *producerTable) snapshotState(budget int) []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	left := budget - 1
	var carried []*producer
	for p := t.mu.lru.next; p != &t.mu.lru; p = p.next {
		need := producerEntryMax + binary.MaxVarintLen64 + len(p.id) + min(p.n, 1)*producerAckMax // with its last ack
		if need > left {
			continue // a long id must not crowd out the producers after it
		}
		left -= need
		carried = append(carried, p)
	}
	if len(carried) == 0 {
		return nil
	}
	b := make([]byte, 0, budget-left)
	b = append(b, producerStateVersion)
	wall, now := t.wall().UnixNano(), t.clock()
	for _, p := range carried {
		n := min(p.n, 1+left/producerAckMax)
		left -= (n - min(n, 1)) * producerAckMax
		b = binary.AppendUvarint(b, uint64(len(p.id)))
		b = append(b, p.id...)
		b = binary.AppendUvarint(b, p.floor)
		b = binary.AppendUvarint(b, p.committed)
		b = binary.AppendVarint(b, wall-(now-p.seen))
		b = binary.AppendUvarint(b, uint64(n))
		for i := p.n - n; i < p.n; i++ {
			a := p.acks[(p.head+i)%len(p.acks)]
			b = binary.AppendUvarint(b, a.offset)
			b = binary.AppendVarint(b, a.ts)
		}
	}
	return b
}

// errProducerState is the error of a producer state that does not decode.
var errProducerState = errors.New("producer table state")

// restoreState replaces the table with the producers state carries (see
// snapshotState). state comes from a peer: on any inconsistency the
// table is left empty, as forget leaves it, and the error says why.
// Producers past the table's bound, and acks past its window, are
// dropped, least recent first. Restore runs on a follower, which admits
// nothing, on the group's goroutine: no publish sees the table between
// forget and the refill.
func (t *producerTable) restoreState(state []byte) error {
	t.forget()
	if len(state) == 0 {
		return nil
	}
	if state[0] != producerStateVersion {
		return fmt.Errorf("%w: version %d, want %d", errProducerState, state[0], producerStateVersion)
	}
	d := stateDecoder{b: state[1:]}
	var ps []*producer
	seen := map[string]bool{}
	for len(d.b) > 0 && d.err == nil && len(ps) < t.lim.max {
		idLen := d.uvarint()
		if d.err == nil && idLen > uint64(len(d.b)) {
			d.fail("producer id of %d bytes, %d left", idLen, len(d.b))
		}
		if d.err != nil {
			break
		}
		p := &producer{id: string(d.b[:idLen])}
		d.b = d.b[idLen:]
		if seen[p.id] {
			d.fail("producer %q twice", p.id)
			break
		}
		seen[p.id] = true
		p.floor, p.committed, p.seen = d.uvarint(), d.uvarint(), d.varint()
		n := d.uvarint()
		switch {
		case d.err != nil:
		case p.committed < p.floor || n > p.committed-p.floor:
			d.fail("producer %q: floor %d, committed %d, %d acks", p.id, p.floor, p.committed, n)
		case n > uint64(len(d.b))/2: // an ack takes at least 2 bytes
			d.fail("producer %q: %d acks in %d bytes", p.id, n, len(d.b))
		}
		if d.err != nil {
			break
		}
		keep := min(int(n), t.lim.window)
		p.acks = make([]seqAck, 0, keep)
		for i := range int(n) {
			a := seqAck{offset: d.uvarint(), ts: d.varint()}
			if i >= int(n)-keep {
				p.acks = append(p.acks, a)
			}
		}
		p.n, p.accepted = len(p.acks), p.committed
		ps = append(ps, p)
	}
	if d.err != nil {
		return d.err
	}
	// p.seen holds the sender's wall-clock time of the last use: dated
	// against the most recent one's, or this broker's wall clock.
	newest := int64(math.MinInt64)
	for _, p := range ps {
		newest = max(newest, p.seen)
	}
	ref, now := min(t.wall().UnixNano(), newest), t.clock()
	for _, p := range ps {
		p.seen = lastUse(now, ref, p.seen)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range ps {
		t.mu.byID[p.id] = p
		t.pushBackLocked(p) // most recent first, as carried
	}
	return nil
}

// stateDecoder reads varints from b, keeping the first error.
type stateDecoder struct {
	b   []byte
	err error
}

func (d *stateDecoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", errProducerState, fmt.Sprintf(format, args...))
	}
}

func (d *stateDecoder) uvarint() uint64 { return decodeNext(d, binary.Uvarint) }
func (d *stateDecoder) varint() int64   { return decodeNext(d, binary.Varint) }

// decodeNext decodes one number of d with decode (binary.Uvarint or Varint).
func decodeNext[T uint64 | int64](d *stateDecoder, decode func([]byte) (T, int)) T {
	if d.err != nil {
		return 0
	}
	v, k := decode(d.b)
	if k <= 0 {
		d.fail("bad varint with %d bytes left", len(d.b))
		return 0
	}
	d.b = d.b[k:]
	return v
}
