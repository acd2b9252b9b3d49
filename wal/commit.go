package wal

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"

	tidwall "github.com/tidwall/wal"

	"github.com/felix-broker/felix/internal/tidseg"
)

// request is one queued append. Requests are pooled: a sync appender
// returns its request after reading the result; the committer returns an
// async one after calling done.
type request struct {
	rec  *Record
	done func(offset uint64, ts int64, err error) // nil for Append

	// Append's result, valid after a receive on ready.
	ready  chan struct{} // capacity 1
	offset uint64
	ts     int64
	err    error

	one [1]*request // backs the one-request batch of an inline commit
}

var requestPool = sync.Pool{New: func() any { return &request{ready: make(chan struct{}, 1)} }}

// committer is the state of the commit role: used by the committer
// goroutine, or by an inline Append, never by both at once.
type committer struct {
	work   []*request // the batch being committed; swapped with mu.pending
	batch  tidwall.Batch
	sizes  []int    // stored size of each entry of the batch
	recs   []Record // the batch's records for the ring
	next   uint64   // offset of the next record to commit
	lastTS int64    // the last commit timestamp (see clockStep)
	failed error
	parker tidseg.Parker // parks fdatasyncs (syncPark); closed by the committer goroutine
}

// clockStep is how far the wall clock may go back between commits before
// the commit timestamps follow it. Commit timestamps come from the wall
// clock and do not go down by less: an NTP correction of a clock that ran
// a little fast holds them at the last stamp until the clock is past it.
// A step back by more (a clock that was far ahead, put right) is
// followed, logged once: holding the stamps at one taken while the clock
// was ahead would stop retention by age until the clock got there. So
// timestamps may go down across such a step, and at open a stored stamp
// further ahead of the clock than this does not seed the clock
// (log.go); nothing in the log relies on them never going down
// (retention.go).
const clockStep = time.Minute

// Append commits r, waits until it is fsynced and returns its offset. If
// ctx is done before r is queued it returns ctx.Err(); once queued, Append
// waits for the commit, because a record is never half committed. r is not
// retained after Append returns, except its Headers map (see Record).
//
// If the log is idle (nothing queued, nothing being committed), Append
// commits r itself on the caller's goroutine instead of handing it to the
// committer goroutine and waiting to be woken: on a small VM each of those
// two cross-CPU wake-ups costs tens of microseconds, a tenth of an fsync.
// There is still only one commit at a time, and records queued meanwhile
// go to the committer goroutine in the next batch.
func (l *Log) Append(ctx context.Context, r *Record) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	q := requestPool.Get().(*request)
	q.rec = r
	inline, err := l.enqueue(q, true)
	if err != nil {
		q.rec = nil
		requestPool.Put(q)
		return 0, err
	}
	if inline {
		q.one[0] = q
		l.commit(q.one[:], l.inlineSync())
		q.one[0] = nil
		l.releaseCommit()
	}
	<-q.ready
	off, err := q.offset, q.err
	q.rec, q.err = nil, nil
	requestPool.Put(q)
	return off, err
}

// AppendAsync queues r. done is called exactly once, on the committer
// goroutine, after r is fsynced (or failed), in offset order; it must not
// block. If the log is closed or failed, done is called inline with the
// error. r must not be modified until done is called, nor its Headers map
// ever (see Record).
func (l *Log) AppendAsync(r *Record, done func(offset uint64, ts int64, err error)) {
	q := requestPool.Get().(*request)
	q.rec, q.done = r, done
	if _, err := l.enqueue(q, false); err != nil {
		q.rec, q.done = nil, nil
		requestPool.Put(q)
		done(0, 0, err)
	}
}

// AppendNow is AppendAsync for a caller that can afford to wait: when the
// log is idle (nothing queued, no commit running) it commits r on the
// caller's goroutine and calls done before returning, which saves the
// hand-off to the committer goroutine and back (tens of microseconds on a
// small VM). Otherwise it queues r exactly like AppendAsync, and done runs
// on the committer. Either way done is called exactly once, in offset
// order with every other append.
//
// A publisher stream with nothing more buffered uses it: its reader would
// wait for the next frame anyway.
func (l *Log) AppendNow(r *Record, done func(offset uint64, ts int64, err error)) {
	q := requestPool.Get().(*request)
	q.rec, q.done = r, done
	inline, err := l.enqueue(q, true)
	if err != nil {
		q.rec, q.done = nil, nil
		requestPool.Put(q)
		done(0, 0, err)
		return
	}
	if inline {
		// complete returns q to the pool before calling done: q must not
		// be touched after commit.
		one := [1]*request{q}
		l.commit(one[:], l.inlineSync())
		l.releaseCommit()
	}
}

// enqueue queues q, or, if mayInline and the log is idle, gives the caller
// the commit role for q alone (inline is true; the caller must commit q and
// call releaseCommit).
func (l *Log) enqueue(q *request, mayInline bool) (inline bool, err error) {
	l.mu.Lock()
	if l.mu.closed {
		l.mu.Unlock()
		return false, ErrClosed
	}
	if err := l.mu.failed; err != nil {
		l.mu.Unlock()
		return false, err
	}
	// Inline only at low load: when the last batch was a lone record. Under
	// concurrent load an inline commit would take the disk for one record
	// right after each batch, halving the records each fsync covers.
	if mayInline && !l.mu.committing && len(l.mu.pending) == 0 && l.stats.lastBatch.Load() <= 1 {
		l.mu.committing = true
		l.mu.Unlock()
		return true, nil
	}
	l.mu.pending = append(l.mu.pending, q)
	l.mu.Unlock()
	l.signal()
	return false, nil
}

// inlineSync is how an inline commit's fdatasync waits: holding its P
// when the log's sync group has no busy log (a lone record on an idle
// process: nothing else waits for the P, and handing it on would cost a
// thread wake-up), handing it on otherwise (see tailSync).
func (l *Log) inlineSync() tailSync {
	if l.opts.SyncGroup.Busy() > 0 {
		return syncHandOff
	}
	return syncHold
}

// releaseCommit gives up the commit role taken by an inline Append and
// wakes the committer goroutine if records queued meanwhile (or Close is
// waiting for the commit to end).
func (l *Log) releaseCommit() {
	l.mu.Lock()
	l.mu.committing = false
	wake := len(l.mu.pending) > 0 || l.mu.closed
	l.mu.Unlock()
	if wake {
		l.signal()
	}
}

// signal wakes the committer without blocking.
func (l *Log) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// runCommitter is the committer goroutine: it commits whatever is pending,
// one batch per fsync, and sleeps only when nothing is. There is no timer:
// a lone record is written as soon as it arrives, and records that arrive
// during an fsync share the next one.
//
// Its fdatasyncs hand the goroutine's P on, or keep it for a batch of
// holdFrom records or more (see tailSync); with Options.ParkedSync they
// are parked instead, and with Options.SyncGroup, while enough of the
// group's logs are busy.
func (l *Log) runCommitter() {
	defer close(l.committerDone)
	defer func() { _ = l.c.parker.Close() }()
	member := l.opts.SyncGroup.Member()
	defer member.SetBusy(false)
	for {
		reqs, exit := l.take()
		member.SetBusy(len(reqs) > 0)
		if len(reqs) > 0 {
			how := committerSync(len(reqs), l.opts.ParkedSync || member.Park())
			if how == syncPark {
				member.Parking()
			}
			l.commit(reqs, how)
			l.mu.Lock()
			l.mu.committing = false
			l.mu.Unlock()
			if len(reqs) > 1 {
				l.gather()
			}
			continue
		}
		if exit {
			return
		}
		<-l.wake
	}
}

// committerSync is how the committer's fdatasync of a batch of n records
// waits: parked when park says so (Options.ParkedSync, or the sync
// group's rule), keeping the P for a batch of holdFrom records or more,
// handing it on for a smaller one (see tailSync).
func committerSync(n int, park bool) tailSync {
	switch {
	case park:
		return syncPark
	case n >= holdFrom:
		return syncHold
	}
	return syncHandOff
}

// gather runs after a batch of more than one record: under load, it lets
// the appenders that batch just woke run and queue their next records
// before the next batch is taken, yielding while the queue still grows (at
// most a few times). No timer: it never waits for records that are not
// already on their way, and at low load it does nothing.
func (l *Log) gather() {
	l.mu.Lock()
	n := len(l.mu.pending)
	l.mu.Unlock()
	for range 4 {
		runtime.Gosched()
		l.mu.Lock()
		m := len(l.mu.pending)
		l.mu.Unlock()
		if m == n {
			return
		}
		n = m
	}
}

// take takes the commit role and up to MaxBatch pending requests. It
// returns none if there are none or an inline Append holds the role (it
// signals when done); exit is true once the log is closed and idle.
func (l *Log) take() (reqs []*request, exit bool) {
	clear(l.c.work)
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.mu.pending
	if l.mu.committing || len(p) == 0 {
		return nil, l.mu.closed && !l.mu.committing && len(p) == 0
	}
	l.mu.committing = true
	if len(p) <= l.opts.MaxBatch {
		l.mu.pending, l.c.work = l.c.work[:0], p
	} else {
		l.c.work = append(l.c.work[:0], p[:l.opts.MaxBatch]...)
		n := copy(p, p[l.opts.MaxBatch:])
		clear(p[n:])
		l.mu.pending = p[:n]
	}
	return l.c.work, false
}

// commit writes reqs as one batch, fsyncs once (as how says), publishes
// the records and completes the requests. The caller holds the commit
// role.
func (l *Log) commit(reqs []*request, how tailSync) {
	if l.c.failed != nil {
		complete(reqs, 0, 0, l.c.failed)
		return
	}
	ts := l.opts.Now().UnixNano()
	if ts < l.c.lastTS {
		if back := time.Duration(l.c.lastTS - ts); back <= clockStep {
			ts = l.c.lastTS
		} else {
			l.logger.Warn("wal: the clock stepped back; commit timestamps follow it",
				"shard", l.name, "back", back, "clock", time.Unix(0, ts).UTC())
		}
	}
	size := 0
	for _, q := range reqs {
		size += encodedSize(q.rec)
	}
	// A fresh arena per batch: the ring's records alias it, so it is never
	// reused.
	arena := make([]byte, 0, size)
	base := l.c.next
	l.c.batch.Clear()
	sizes, recs := l.c.sizes[:0], l.c.recs[:0]
	for i, q := range reqs {
		off := base + uint64(i)
		start := len(arena)
		var keyAt, valueAt int
		arena, keyAt, valueAt = appendRecord(arena, q.rec, off, ts)
		entry := arena[start:]
		l.c.batch.Write(off+1, entry)
		sizes = append(sizes, entrySize(len(entry)))
		rec := Record{
			Offset:      off,
			Timestamp:   ts,
			ProducerSeq: q.rec.ProducerSeq,
		}
		if n := len(q.rec.ProducerID); n > 0 {
			// From the arena, like key and value: the appender's string
			// may keep a larger buffer alive (a whole decoded frame).
			at := start + recordFixed + uvarintLen(n)
			rec.ProducerID = unsafe.String(&arena[at], n)
		}
		if len(q.rec.Headers) > 0 {
			rec.Headers = q.rec.Headers // kept, not copied: see Record
		}
		if n := len(q.rec.Key); n > 0 {
			rec.Key = arena[keyAt : keyAt+n : keyAt+n]
		}
		if n := len(q.rec.Value); n > 0 {
			rec.Value = arena[valueAt : valueAt+n : valueAt+n]
		}
		recs = append(recs, rec)
	}
	l.c.sizes, l.c.recs = sizes, recs

	began := time.Now()
	if how == syncPark {
		l.stats.parked.Add(1)
	}
	err := l.writeAndSync(base+1, sizes, how)
	if err == nil {
		// Into the page cache, before the acks: see hwm.go.
		err = l.hwm.write(base + uint64(len(reqs)))
	}
	took := time.Since(began)
	if err != nil {
		err = fmt.Errorf("wal: shard %q: commit offsets %d-%d: %w: %w", l.name, base, base+uint64(len(reqs))-1, ErrFailed, err)
		l.c.failed = err
		l.mu.Lock()
		l.mu.failed = err
		l.mu.Unlock()
		if cerr := l.cutFailed(base); cerr != nil {
			l.logger.Error("wal: commit failed; log accepts no more appends until reopened, and could not cut the failed batch from its files: reopened, it may show records its disk does not hold",
				"shard", l.name, "err", err, "cut_err", cerr)
		} else {
			l.logger.Error("wal: commit failed; log accepts no more appends until reopened", "shard", l.name, "err", err)
		}
		clear(recs)
		complete(reqs, 0, 0, err)
		return
	}
	next := base + uint64(len(reqs))
	l.c.next, l.c.lastTS = next, ts
	l.ring.push(recs, len(arena))
	clear(recs)
	l.publish(next)

	l.stats.fsyncs.Add(1)
	l.stats.records.Add(uint64(len(reqs)))
	l.stats.bytes.Add(uint64(len(arena)))
	l.stats.lastBatch.Store(int64(len(reqs)))
	if n := int64(len(reqs)); n > l.stats.maxBatch.Load() {
		l.stats.maxBatch.Store(n) // only the committer stores it
	}
	if l.opts.OnCommit != nil {
		l.opts.OnCommit(Commit{Records: len(reqs), Bytes: len(arena), Start: began, Sync: took})
	}
	complete(reqs, base, ts, nil)
	if l.opts.Answered != nil {
		l.opts.Answered()
	}
}

// complete reports the result of each request; offsets count up from base.
func complete(reqs []*request, base uint64, ts int64, err error) {
	for i, q := range reqs {
		off := base + uint64(i)
		if err != nil {
			off, ts = 0, 0
		}
		if done := q.done; done != nil {
			q.rec, q.done = nil, nil
			requestPool.Put(q)
			done(off, ts, err)
			continue
		}
		q.offset, q.ts, q.err = off, ts, err
		q.ready <- struct{}{} // capacity 1 and one send per request: never blocks
	}
}

// writeAndSync writes the prepared batch (first entry at index first, entry
// sizes in sizes) and makes it durable with one fdatasync of the tail
// segment, waiting for it as how says.
func (l *Log) writeAndSync(first uint64, sizes []int, how tailSync) error {
	l.tail.Lock()
	defer l.tail.Unlock()
	if err := l.tail.lost; err != nil {
		return err
	}
	if err := l.preallocate(sizes); err != nil {
		return err
	}
	if err := l.tw.WriteBatch(&l.c.batch); err != nil {
		return fmt.Errorf("write batch: %w", err)
	}

	// Follow tidwall's segment roll: only the final tail needs our sync.
	rolled, size, written := tidseg.FollowRoll(l.tail.size, int64(l.opts.SegmentSize), first, sizes)
	if rolled != 0 {
		// The segment tidwall left ends with its last entry, not zeros.
		oldEnd, _ := tidseg.TailEnd(l.tail.size, int64(l.opts.SegmentSize), sizes)
		if err := l.unpad(oldEnd); err != nil {
			return err
		}
		if err := l.openTail(rolled); err != nil {
			return l.syncFallback(err)
		}
		if err := l.syncDir(); err != nil { // the new segment's name must survive a crash
			return err
		}
		l.tail.presize.Roll(time.Now(), l.tw, l.opts.SegmentSize, &l.readMu)
	}
	l.tail.size = size
	l.size.Add(written)
	if got, err := l.tail.f.Size(); err != nil || got != l.tail.pad.Size(size) {
		if err == nil {
			err = fmt.Errorf("tail segment %s is %d bytes, expected %d", segmentName(l.tail.index), got, l.tail.pad.Size(size))
		}
		return l.syncFallback(err)
	}
	if err := l.syncTail(how); err != nil {
		return fmt.Errorf("fdatasync %s: %w", segmentName(l.tail.index), err)
	}
	return nil
}

// cutFailed takes a failed batch's entries (offsets base on) back out of
// the segment files, so that the log reopens where its acks end.
//
// A failed fdatasync leaves the batch's bytes in the page cache, marked
// clean (Linux since 4.13): read back, by this process or the next one,
// they look written although the disk may not hold them, and a record
// committed after them once the log is reopened would sit behind a hole
// as soon as the kernel dropped those pages. None of the batch was acked
// (its outcome was reported unknown); cut, it is not written. tidwall
// rewrites the segment holding base, fsyncing the new file before it
// replaces the old, and removes any later one (TruncateBack). The disk
// may refuse this too: the log is failed either way. The caller holds
// the commit role.
func (l *Log) cutFailed(base uint64) error {
	l.tail.Lock()
	defer l.tail.Unlock()
	last, err := l.tw.LastIndex()
	if err != nil {
		return err
	}
	if last <= base { // tidwall index = offset + 1: none of the batch is indexed
		return nil
	}
	l.scans.drop()
	l.files.Drop(false)
	if err := l.tw.TruncateBack(base); err != nil {
		return err
	}
	if err := l.syncDir(); err != nil {
		return err
	}
	segs, _, err := listSegments(l.dir)
	if err != nil {
		return err
	}
	if len(segs) == 0 {
		return errors.New("no segment files")
	}
	if err := l.openTail(segs[len(segs)-1].Index); err != nil {
		return err
	}
	return l.measure()
}

// syncFallback runs when our view of the tail segment disagrees with the
// directory (which would be a bug in following tidwall's segment roll). It
// lets tidwall fsync its own tail file, so the batch is still durable, and
// re-reads which file is the tail. Callers hold l.tail's lock.
func (l *Log) syncFallback(cause error) error {
	l.logger.Error("wal: lost track of the tail segment; falling back to tidwall's fsync", "shard", l.name, "err", cause)
	if err := l.tw.Sync(); err != nil {
		return fmt.Errorf("fsync: %w", err)
	}
	segs, _, err := listSegments(l.dir)
	if err != nil {
		return err
	}
	if len(segs) == 0 {
		return errors.Join(cause, errors.New("no segment files"))
	}
	if err := l.openTail(segs[len(segs)-1].Index); err != nil {
		return err
	}
	if err := l.findPadding(); err != nil {
		return err
	}
	return l.syncDir()
}
