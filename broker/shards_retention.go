package broker

// # Retention of closed logs
//
// An open log of a stream of replication factor 1 applies the stream's
// retention itself (package wal: a pass at Open and one each
// Config.RetentionCheck), and its passes stop when it closes. Most of a
// broker's logs may be closed at a time (the open-log budget, shards.go),
// and after a restart a log stays closed until a use opens it: without
// more, an idle shard, the one whose records should expire by age, would
// keep them forever. So the shard set tracks the closed logs of the
// streams with a retention limit (mu.retention) and sweeps them:
//
//   - A log that closes while its shard stays this broker's (for the
//     budget; not at shutdown, not when its shard moves or its stream is
//     deleted) takes a last pass (closingRetention), which settles
//     RetentionBytes (a closed log cannot grow), and the shard set notes
//     when its oldest segment expires whole (wal.Log.Expiry), or that
//     nothing in it will while it stays closed.
//   - A shard the broker has not had open since it started (its log
//     closed since the restart) is due at once: apply notes every owned
//     shard it did not open (trackClosed).
//   - Each Config.RetentionCheck, one goroutine (runSweep, owned by the
//     shard set and stopped by close) opens the logs that are due, oldest
//     due first, one at a time, through acquire: within the budget (it
//     closes the least recently used idle log if it must, as a use
//     would), never a log in use, never twice at once, never a stream
//     being removed. The open runs wal's pass; the sweep then closes the
//     log again unless a use took it meanwhile, which takes the last pass
//     and notes the next due time. A sweep that finds every log of the
//     budget in use waits for the next tick.
//
// Whole segments by age, not each record's expiry: a log holding a long
// history is opened about once a segment, not once a RetentionCheck,
// and holds at most one segment of expired records while it is closed,
// none of them ever served (a log opened for use takes a pass first). A
// shard with no directory (no records ever) is settled without an open;
// one whose open or pass fails is retried after sweepRetry, not at each
// tick. Replicated shards are not tracked: their replicas stay open and
// raftNet.runRetention passes over every one.

import (
	"errors"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/felix-broker/felix/shardmap"
)

// sweepRetry is how long the sweep leaves a closed log whose open or
// retention pass failed before it tries again.
const sweepRetry = time.Minute

// closedLog is what the sweep knows of a closed log's retention.
type closedLog struct {
	// due is when the sweep opens the log: when its oldest segment
	// expires, or a retry after a failure. Zero: at the next sweep
	// (nothing is known of it yet).
	due time.Time
	// settled: nothing in the log expires while it stays closed (no
	// age limit, or no record it can date); the sweep leaves it alone.
	settled bool
}

// hasRetention reports whether st's shards drop records by size or age.
func hasRetention(st *shardmap.Stream) bool {
	return st.RetentionBytes > 0 || st.RetentionAge > 0
}

// sweptBy reports whether the sweep keeps id's log within its
// retention while closed: m assigns id to this broker and its stream is
// of replication factor 1 with a retention limit.
func (s *shardSet) sweptBy(m *shardmap.Map, id shardmap.ShardID) bool {
	if m == nil {
		return false
	}
	st, ok := m.Stream(id.Stream)
	return ok && st.Factor() == 1 && hasRetention(st) && st.Placement.IsReplica(id.Shard, s.node)
}

// closingRetention runs the last retention pass of a log that is closing
// while its shard stays this broker's, and returns what the sweep must
// know of the closed log; keep is false if the sweep has no business
// with it (no retention limit, a replica, the shard leaving, shutdown).
// e is retired: nothing appends to its log any more.
func (s *shardSet) closingRetention(e *shardEntry) (c closedLog, keep bool) {
	s.mu.RLock()
	m, closed := s.mu.latest, s.mu.closed
	s.mu.RUnlock()
	if closed || e.log == nil || !s.sweptBy(m, e.id) {
		return closedLog{}, false
	}
	now := time.Now()
	if _, err := e.log.EnforceRetention(now); err != nil {
		s.logger.Warn("retention pass of a closing shard log failed; the sweep tries again", "shard", e.id.String(), "retry_in", sweepRetry, "err", err)
		return closedLog{due: now.Add(sweepRetry)}, true
	}
	at, ok, err := e.log.Expiry()
	switch {
	case err != nil:
		s.logger.Warn("dating the oldest records of a closing shard log failed; the sweep tries again", "shard", e.id.String(), "retry_in", sweepRetry, "err", err)
		return closedLog{due: now.Add(sweepRetry)}, true
	case !ok:
		return closedLog{settled: true}, true
	}
	return closedLog{due: at}, true
}

// trackClosed notes for the sweep the shards of ids, owned by m, whose
// logs are closed and of which nothing is known (not open since the
// broker started): they are due at once.
func (s *shardSet) trackClosed(m *shardmap.Map, ids []shardmap.ShardID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if _, open := s.mu.entries[id]; open || !s.sweptBy(m, id) {
			continue
		}
		if _, known := s.mu.retention[id]; !known {
			s.mu.retention[id] = closedLog{}
		}
	}
}

// startSweep starts the sweep of closed logs every interval (runSweep);
// close stops it.
func (s *shardSet) startSweep(every time.Duration) {
	s.sweep.wg.Add(1)
	go s.runSweep(every)
}

func (s *shardSet) runSweep(every time.Duration) {
	defer s.sweep.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.sweep.quit:
			return
		case <-t.C:
		}
		swept := 0
		for _, id := range s.dueLogs(time.Now()) {
			select {
			case <-s.sweep.quit:
				return
			default:
			}
			opened, more := s.sweepOne(id)
			if opened {
				swept++
			}
			if !more {
				break
			}
		}
		if swept > 0 {
			s.logger.Debug("retention sweep opened closed shard logs", "logs", swept)
		}
	}
}

// dueLogs returns the closed logs due at now, the longest due first.
func (s *shardSet) dueLogs(now time.Time) []shardmap.ShardID {
	type due struct {
		id shardmap.ShardID
		at time.Time
	}
	var ds []due
	s.mu.RLock()
	for id, c := range s.mu.retention {
		if _, open := s.mu.entries[id]; !open && !c.settled && !c.due.After(now) {
			ds = append(ds, due{id, c.due})
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(ds, func(a, b due) int { return a.at.Compare(b.at) })
	ids := make([]shardmap.ShardID, len(ds))
	for i, d := range ds {
		ids[i] = d.id
	}
	return ids
}

// sweepOne opens the closed log of id for its retention and closes it
// again, unless a use holds it by then. opened is whether it opened it;
// more is false when the sweep should wait for the next tick (every
// log of the budget in use, or the shard set closing).
func (s *shardSet) sweepOne(id shardmap.ShardID) (opened, more bool) {
	s.mu.Lock()
	m := s.mu.latest
	_, admitted := s.mu.admitted[id.Stream]
	if !admitted || !s.sweptBy(m, id) {
		delete(s.mu.retention, id) // moved away, deleted, or refused under MaxShards
		s.mu.Unlock()
		return false, true
	}
	s.mu.Unlock()
	// A shard with no directory has no records: nothing to open.
	if _, err := s.root.Lstat(filepath.Join(id.Stream, strconv.Itoa(id.Shard))); errors.Is(err, fs.ErrNotExist) {
		s.note(id, closedLog{settled: true})
		return false, true
	}
	e, err := s.acquireSlow(m, id)
	switch {
	case errors.Is(err, errOpenLimit), errors.Is(err, errShardsClosed):
		return false, false
	case errors.Is(err, errShardGone), errors.Is(err, errShardLimit):
		s.mu.Lock()
		delete(s.mu.retention, id)
		s.mu.Unlock()
		return false, true
	case err != nil:
		s.logger.Warn("opening a closed shard log for its retention failed; the sweep tries again", "shard", id.String(), "retry_in", sweepRetry, "err", err)
		s.note(id, closedLog{due: time.Now().Add(sweepRetry)})
		return false, true
	}
	e.release()
	s.mu.Lock()
	// A failed log (its fdatasync failed meanwhile, opened by a use)
	// stays open, refusing records, until the broker restarts, as
	// makeRoomLocked keeps it.
	idle := s.mu.entries[id] == e && e.gone == nil && e.refs.Load() == 0 && (e.log == nil || e.log.Err() == nil)
	if idle {
		e.gone = make(chan struct{})
	}
	s.mu.Unlock()
	if idle {
		// finish notes when it is due again (closingRetention).
		if err := s.finish(e); err != nil {
			s.logger.Error("closing a shard log opened for its retention", "shard", id.String(), "err", err)
		}
	}
	return true, true
}

// note records c for the closed log of id, if the sweep still tracks it
// and it has not been opened since.
func (s *shardSet) note(id shardmap.ShardID, c closedLog) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, known := s.mu.retention[id]; !known {
		return
	}
	if _, open := s.mu.entries[id]; open {
		return
	}
	s.mu.retention[id] = c
}

// stopSweep stops the sweep and waits for it.
func (s *shardSet) stopSweep() {
	s.sweep.stop.Do(func() { close(s.sweep.quit) })
	s.sweep.wg.Wait()
}
