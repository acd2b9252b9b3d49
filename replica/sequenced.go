package replica

// # Producer sequences (for idempotent publish above this package)
//
// A record may carry a producer id and sequence (wal.Record.ProducerID,
// ProducerSeq > 0), by which the broker writes each (producer, sequence)
// at most once. That decision needs, on whichever replica leads, every
// committed record of the shard's producers; this package offers three
// things for it and decides nothing itself:
//
//   - Config.OnSequenced is called, on the group's goroutine, for every
//     committed record that carries a producer sequence, in log order, as
//     its entry applies, with the offset and timestamp every replica gives
//     it, before the record's proposer hears its outcome. Raft applies the
//     whole committed log again when a replica opens, before Open returns
//     (see "Offsets" in doc.go), so the hook sees every committed record
//     again then: what a replica builds from it needs no state of its own
//     on disk.
//   - LeaderTerm says when a leader has applied everything committed
//     before its term: raft appends an empty entry when a leader is
//     elected, and commits it (with every entry before it, the previous
//     leaders' uncommitted ones this leader holds included) before any
//     other of its term; once an entry of its own term has applied here,
//     every entry any earlier leader committed, or that can still commit,
//     has been applied. (An entry this leader lacks was never committed,
//     as a leader holds every committed entry, and never will be: every
//     later leader holds this one's log up to that first entry.)
//   - AppendInTerm proposes a record in the term the caller decided in,
//     or not at all: it is refused, never proposed in a later term whose
//     leader has not applied everything committed before that term.

import (
	"github.com/felix-broker/felix/wal"
)

// LeaderTerm returns the term in which this replica leads once it has
// applied an entry of that term (so every entry committed before the term
// began), and 0 while it does not lead or has not yet.
func (g *Group) LeaderTerm() uint64 {
	// Read term first: a replica stores its new leader before its new
	// term, so a leader read after a term is never of an earlier term.
	// (A term read just before the replica moved on is refused by
	// AppendInTerm.)
	term := g.term.Load()
	if g.leader.Load() != g.cfg.ID || g.appliedTerm.Load() != term {
		return 0
	}
	return term
}

// AppendInTerm is AppendAsync for a record decided on while this replica
// led in term (see LeaderTerm): it fails with a *NotLeaderError (never
// committed) unless this replica still leads in term when the record is
// handed over, and it is proposed in term or not at all.
func (g *Group) AppendInTerm(term uint64, r *wal.Record, done func(offset uint64, ts int64, err error)) {
	if term == 0 {
		done(0, 0, &NotLeaderError{Group: g.cfg.Name, Leader: g.leader.Load(), Term: g.term.Load()})
		return
	}
	g.appendIn(term, r, done)
}

// sequenced calls Config.OnSequenced for the records of data, the batch
// of the entry at index applied with its first record at offset base,
// that carry a producer sequence.
func (g *Group) sequenced(index uint64, data []byte, base uint64) {
	h, rest, err := decodeBatchHeader(data)
	if err != nil {
		return // apply logged it
	}
	for i := range h.count {
		seq, id, next, err := wal.BodyProducer(rest)
		if err != nil {
			g.logger.Error("replica: committed entry holds a malformed record; producer sequences after it are not seen",
				"index", index, "record", i, "err", err)
			return
		}
		if seq > 0 && len(id) > 0 {
			g.cfg.OnSequenced(id, seq, base+uint64(i), h.ts)
		}
		rest = next
	}
}
