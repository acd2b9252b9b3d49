// Package history records what clients of a Felix cluster were told during
// a fault test — every publish with its outcome and its call and return
// times — and checks it afterwards against what the cluster's logs hold,
// the way Jepsen checks a broker: no acknowledged record lost, none
// written twice, offsets dense, each publisher's records in the order it
// sent them, and the acknowledgements linearizable (checked with
// porcupine: a record acknowledged before another was sent has the
// smaller offset in its shard).
//
// It owns no goroutines and does no I/O; a Recorder is safe for
// concurrent use.
package history

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Outcome is what a publisher was told.
type Outcome int

// Outcomes.
const (
	// Acked: the record was acknowledged at Shard, Offset.
	Acked Outcome = iota
	// Failed: the record was refused with an error that guarantees it was
	// not written (such as unauthorized or invalid).
	Failed
	// Unknown: the outcome is unknown (the connection died, a timeout):
	// the record may or may not have been written.
	Unknown
)

// Publish is one publish of a history.
type Publish struct {
	Publisher int    // who sent it
	Value     string // unique in the history
	Outcome   Outcome
	Shard     int    // with Acked
	Offset    uint64 // with Acked
	Owner     string // with Acked: the broker that committed it (the ack's Owner)
	Call      time.Time
	Return    time.Time
	Retried   bool // an idempotent publisher retried it after an unknown outcome
	// Stream names the publisher stream the record was sent on, if the
	// recorder knows it ("" if not): records of one publisher on one
	// stream are committed in the order sent (DESIGN.md), so one of
	// unknown outcome that was written is as bound by that order as an
	// acked one. Records without it are ordered only by their acks.
	Stream string
}

// Recorder collects a history.
type Recorder struct {
	mu   sync.Mutex
	pubs []Publish
}

// Add records p.
func (r *Recorder) Add(p Publish) {
	r.mu.Lock()
	r.pubs = append(r.pubs, p)
	r.mu.Unlock()
}

// Publishes returns a copy of the history.
func (r *Recorder) Publishes() []Publish {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.pubs)
}

// Entry is one record read back from a shard's log at the end.
type Entry struct {
	Offset uint64
	Value  string
}

// Report is the outcome of Check.
type Report struct {
	Acked, Failed, Unknown int
	// UnknownWritten counts unknown outcomes found in the logs (once or
	// more); the rest were not written.
	UnknownWritten int
	// Retried counts records an idempotent publisher retried.
	Retried int
	// Lost are acknowledged records missing from their acknowledged place.
	Lost []Publish
	// Duplicated are values found more than once in the logs.
	Duplicated []string
	// Misplaced are acknowledged records found at another offset or shard
	// than their ack said.
	Misplaced []Publish
	// Phantom are values in the logs that no publish sent, or that a
	// publish was told definitely failed.
	Phantom []string
	// Gaps describe holes in a shard's offsets.
	Gaps []string
	// Reordered describe a publisher's written records of one shard
	// (acked, or of unknown outcome and found in the logs) whose offsets
	// do not increase in the order they were sent.
	Reordered []string
	// Linearizable is porcupine's verdict on the acknowledgements and the
	// final logs; Unknown if it ran out of time.
	Linearizable porcupine.CheckResult
}

// OK reports whether the history satisfies every property.
func (r Report) OK() bool {
	return len(r.Lost) == 0 && len(r.Duplicated) == 0 && len(r.Misplaced) == 0 && len(r.Phantom) == 0 &&
		len(r.Gaps) == 0 && len(r.Reordered) == 0 && r.Linearizable == porcupine.Ok
}

func (r Report) String() string {
	return fmt.Sprintf("acked %d, failed %d, unknown outcome %d (%d of them written), retried %d; lost %d, duplicated %d, misplaced %d, phantom %d, gaps %d, reordered %d; linearizable: %s",
		r.Acked, r.Failed, r.Unknown, r.UnknownWritten, r.Retried, len(r.Lost), len(r.Duplicated), len(r.Misplaced), len(r.Phantom), len(r.Gaps), len(r.Reordered), r.Linearizable)
}

// Check checks pubs against logs, the final contents of every shard
// (logs[shard], in offset order, from offset 0), with a time bound on the
// linearizability check.
func Check(pubs []Publish, logs [][]Entry, timeout time.Duration) Report {
	var r Report
	found := map[string][]place{}
	for shard, entries := range logs {
		for i, e := range entries {
			if e.Offset != uint64(i) {
				r.Gaps = append(r.Gaps, fmt.Sprintf("shard %d: entry %d has offset %d", shard, i, e.Offset))
				break
			}
			found[e.Value] = append(found[e.Value], place{shard, e.Offset})
		}
	}
	sent := map[string]Publish{}
	for _, p := range pubs {
		sent[p.Value] = p
		if p.Retried {
			r.Retried++
		}
		where := found[p.Value]
		switch p.Outcome {
		case Acked:
			r.Acked++
			if len(where) == 0 {
				r.Lost = append(r.Lost, p)
			} else if !slices.Contains(where, place{p.Shard, p.Offset}) {
				r.Misplaced = append(r.Misplaced, p)
			}
		case Failed:
			r.Failed++
			if len(where) > 0 {
				r.Phantom = append(r.Phantom, p.Value)
			}
		case Unknown:
			r.Unknown++
			if len(where) > 0 {
				r.UnknownWritten++
			}
		}
	}
	for v, where := range found {
		if len(where) > 1 {
			r.Duplicated = append(r.Duplicated, v)
		}
		if _, ok := sent[v]; !ok {
			r.Phantom = append(r.Phantom, v)
		}
	}
	slices.Sort(r.Duplicated)
	slices.Sort(r.Phantom)
	r.Reordered = reordered(pubs, found)
	r.Linearizable = linearizable(pubs, logs, found, timeout)
	return r
}

// place is where a value was found in the logs.
type place struct {
	shard  int
	offset uint64
}

// reordered finds, per publisher and shard, records written whose
// offsets do not grow in the order they were called: acked records at the
// place their ack gave (a publisher's acks alone order them: an ack came
// back before the next record was sent, or the records shared a stream);
// and, among the records of one publisher stream (Publish.Stream), those
// of unknown outcome found once in the logs too, at the place found (left
// out, a record committed late, after records sent after it on its
// stream, passed unseen).
func reordered(pubs []Publish, found map[string][]place) []string {
	type key struct {
		publisher, shard int
		stream           string // "" for the acked records of all streams
	}
	last := map[key]Publish{}
	var out []string
	next := func(k key, p Publish) {
		if prev, ok := last[k]; ok && p.Offset <= prev.Offset {
			out = append(out, fmt.Sprintf("publisher %d, shard %d: %s at %d sent after %s at %d", p.Publisher, p.Shard, p.Value, p.Offset, prev.Value, prev.Offset))
		}
		last[k] = p
	}
	sorted := slices.Clone(pubs)
	slices.SortStableFunc(sorted, func(a, b Publish) int { return a.Call.Compare(b.Call) })
	for _, p := range sorted {
		switch p.Outcome {
		case Acked:
			next(key{p.Publisher, p.Shard, ""}, p)
		case Unknown:
			where := found[p.Value]
			if len(where) != 1 {
				continue // not written, or written twice, which Check reports
			}
			p.Shard, p.Offset = where[0].shard, where[0].offset
		default:
			continue
		}
		if p.Stream != "" {
			next(key{p.Publisher, p.Shard, p.Stream}, p)
		}
	}
	return out
}

// The porcupine model of one shard: a log whose state is its length. A
// publish takes the offset equal to the length and grows it by one; the
// final read sees the whole length. Unknown outcomes are resolved with the
// final logs first (written at the offset found, or not at all, then left
// out), and they stay pending to the end of the history, so they may take
// effect at any time after they were called.
type opInput struct {
	read   bool
	offset uint64 // publish: where it landed
}

type opOutput struct {
	length uint64 // read: the log's length
}

var model = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byShard := map[int][]porcupine.Operation{}
		for _, op := range h {
			s := op.Metadata.(int)
			byShard[s] = append(byShard[s], op)
		}
		var out [][]porcupine.Operation
		for _, ops := range byShard {
			out = append(out, ops)
		}
		return out
	},
	Init: func() any { return uint64(0) },
	Step: func(state, input, output any) (bool, any) {
		n, in := state.(uint64), input.(opInput)
		if in.read {
			return output.(opOutput).length == n, n
		}
		return in.offset == n, n + 1
	},
	DescribeOperation: func(input, output any) string {
		in := input.(opInput)
		if in.read {
			return fmt.Sprintf("read() -> %d records", output.(opOutput).length)
		}
		return fmt.Sprintf("publish() -> offset %d", in.offset)
	},
}

func linearizable(pubs []Publish, logs [][]Entry, found map[string][]place, timeout time.Duration) porcupine.CheckResult {
	// Times from the earliest call, by the monotonic clock where the
	// times carry it (taken in this process): a step of the wall clock
	// during the run would make an operation called after another's
	// return look concurrent with it.
	var base time.Time
	for _, p := range pubs {
		if base.IsZero() || p.Call.Before(base) {
			base = p.Call
		}
	}
	nanos := func(t time.Time) int64 { return int64(t.Sub(base)) }
	var end int64
	for _, p := range pubs {
		end = max(end, nanos(p.Return), nanos(p.Call))
	}
	end++
	var ops []porcupine.Operation
	for _, p := range pubs {
		var at place
		ret := nanos(p.Return)
		switch p.Outcome {
		case Acked:
			at = place{p.Shard, p.Offset}
		case Unknown:
			where := found[p.Value]
			if len(where) != 1 {
				continue // not written; or written twice, which Check reports
			}
			at, ret = where[0], math.MaxInt64 // it may have taken effect at any time after its call
		default:
			continue
		}
		ops = append(ops, porcupine.Operation{ClientId: p.Publisher, Input: opInput{offset: at.offset},
			Call: nanos(p.Call), Output: opOutput{}, Return: ret, Metadata: at.shard})
	}
	for shard, entries := range logs {
		ops = append(ops, porcupine.Operation{Input: opInput{read: true}, Call: end,
			Output: opOutput{length: uint64(len(entries))}, Return: end + 1, Metadata: shard})
	}
	return porcupine.CheckOperationsTimeout(model, ops, timeout)
}
