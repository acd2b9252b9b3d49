package broker

// # Applying a map
//
// Every map the control plane pushes goes through shardSet.apply: retain
// closes the logs of shards the map no longer gives this broker, finds
// streams deleted or created again (a new incarnation) while the broker
// ran, and gives open replicas their raft slots; sweepDeleted removes the
// data of streams deleted while it was down, and sweepMoved the replicas
// moved to other brokers meanwhile (moves.go);
// removeStream moves a deleted stream's directory to the trash and
// removes it; admit decides, whole streams at a time, which new streams
// fit under Config.MaxShards; then apply opens the owned shards while the
// open-log budget allows. See shards.go for the data layout and the
// budget.

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"

	"github.com/felix-broker/felix/shardmap"
)

// replicated reports whether id's stream is replicated in m: its shards
// are opened whatever the open-log budget.
func replicated(m *shardmap.Map, id shardmap.ShardID) bool {
	st, ok := m.Stream(id.Stream)
	return ok && st.Replicas > 1
}

// ownedBy counts the shards of st owned by node, or of which it holds a
// replica.
func ownedBy(st *shardmap.Stream, node string) int {
	return len(st.Placement.ReplicatedBy(node))
}

// applyResult is what applying one map did, for one aggregated log line
// per kind of event (never one per shard).
type applyResult struct {
	owned    int // shards m assigns to this broker
	open     int // logs open afterwards
	opened   int // logs this apply opened
	deferred int // owned shards left to open on first use (budget)
	closed   int // logs closed: shards moved away or streams deleted

	failed    int                // owned shards whose log failed to open
	failedIDs []shardmap.ShardID // the first few of them
	failedErr error              // the first failure

	refused       []string // streams refused under MaxShards
	refusedShards int

	deleted   []string // streams whose data was removed
	deleteErr []error  // removals or closes that failed
}

const maxListed = 8 // ids or names listed in one log line

// firstFew returns the first names of list, and how many more there are.
func firstFew(list []string) string {
	if len(list) <= maxListed {
		return strings.Join(list, ",")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(list[:maxListed], ","), len(list)-maxListed)
}

// apply makes the shard set follow m: first it closes the logs of shards m
// no longer assigns here and removes the data of streams m no longer has,
// whatever fails; then it admits streams under MaxShards and opens the logs
// of owned shards, each on its own, while under the open-log budget.
// Shards that fail are remembered and retried on the next map or lazily
// on first use after failRetry.
//
// It returns the map it applied: m, or the newest map seen if that is newer.
func (s *shardSet) apply(m *shardmap.Map) (*shardmap.Map, applyResult) {
	var r applyResult
	m = s.retain(m, &r)
	if !s.swept.Swap(true) {
		s.sweepDeleted(m, &r)
		s.sweepMoved(m, &r)
	}
	s.removeKeptMoved(m, &r)
	toOpen := s.admit(m, &r)
	for _, id := range toOpen {
		s.mu.RLock()
		_, open := s.mu.entries[id]
		full := len(s.mu.entries) >= s.maxOpen
		s.mu.RUnlock()
		if open {
			continue
		}
		if full && !replicated(m, id) {
			r.deferred++
			continue
		}
		e, err := s.acquireSlow(m, id)
		if err != nil {
			if errors.Is(err, errOpenLimit) {
				r.deferred++
				continue
			}
			r.failed++
			if len(r.failedIDs) < maxListed {
				r.failedIDs = append(r.failedIDs, id)
			}
			if r.failedErr == nil {
				r.failedErr = err
			}
			continue
		}
		e.release()
		r.opened++
	}
	s.trackClosed(m, toOpen)
	r.open = s.openLogs()
	return m, r
}

// retain retires the logs of shards m (or the newest map seen, which it
// returns) does not assign to this broker, closes them, and removes the
// data of the streams that were in the last map applied (or admitted or
// open here) and are not in it. Nothing that fails stops the rest.
func (s *shardSet) retain(m *shardmap.Map, r *applyResult) *shardmap.Map {
	s.mu.Lock()
	known := map[string]bool{}
	if s.mu.latest != nil {
		for _, st := range s.mu.latest.Streams {
			known[st.Name] = true
		}
	}
	m = s.latestLocked(m)
	for id := range s.mu.entries {
		known[id.Stream] = true
	}
	for name := range s.mu.admitted {
		known[name] = true
	}
	var deleted []string
	replaced := map[string]bool{} // deleted and created again, in maps not applied here
	for name := range known {
		st, ok := m.Stream(name)
		if inc, claimed := s.mu.incarnation[name]; ok && claimed && st.Created != inc {
			replaced[name], ok = true, false
		}
		if !ok && shardmap.ValidateStreamName(name) == nil {
			deleted = append(deleted, name) // an invalid name never had data here
		}
	}
	slices.Sort(deleted)
	done := make(map[string]chan struct{}, len(deleted))
	for _, name := range deleted {
		if s.mu.removing[name] == nil {
			done[name] = make(chan struct{})
			s.mu.removing[name] = done[name]
		}
		s.mu.total -= s.mu.admitted[name]
		delete(s.mu.admitted, name)
		delete(s.mu.incarnation, name) // the next use claims the directory again
	}
	var retired []*shardEntry
	movedAway := map[string][]int{} // replicas moved to other brokers, by stream
	for id, e := range s.mu.entries {
		st, ok := m.Stream(id.Stream)
		// A replica moved away and back in maps this broker skipped is
		// another replica now (moves.go): the old one goes.
		if ok && !replaced[id.Stream] && st.Placement.IsReplica(id.Shard, s.node) && st.Placement.MoveID(id.Shard, s.node) == e.move {
			continue
		}
		if e.gone == nil {
			e.gone = make(chan struct{})
			retired = append(retired, e)
			if ok && !replaced[id.Stream] && e.pinned {
				movedAway[id.Stream] = append(movedAway[id.Stream], id.Shard)
			}
		}
	}
	for id := range s.mu.closedStats {
		if !ownedIn(m, id, s.node) {
			delete(s.mu.closedStats, id)
		}
	}
	for id := range s.mu.retention {
		if replaced[id.Stream] || !s.sweptBy(m, id) {
			delete(s.mu.retention, id) // gone, or a new stream of the name: its records went with the old
		}
	}
	clear(s.mu.failed) // every map retries what failed
	s.updateSlotsLocked(m)
	s.mu.Unlock()

	for _, e := range retired {
		if err := s.finish(e); err != nil {
			r.deleteErr = append(r.deleteErr, fmt.Errorf("close %s: %w", e.id, err))
		}
		r.closed++
	}
	for name, shards := range movedAway {
		s.removeMoved(name, shards, r)
	}
	for _, name := range deleted {
		ch := done[name]
		if ch == nil {
			if ch = s.gateDeleted(name); ch == nil {
				continue // created again meanwhile: its first use claims the directory
			}
		}
		if err := s.removeStream(name, m.Epoch); err != nil {
			r.deleteErr = append(r.deleteErr, err)
		} else {
			r.deleted = append(r.deleted, name)
		}
		s.mu.Lock()
		delete(s.mu.removing, name)
		close(ch)
		s.mu.Unlock()
	}
	return m
}

// gateDeleted takes the gate of a deleted stream's name that another
// holder had when retain looked: a first use claiming its directory, a
// failed replica being set aside, or another apply removing it. It waits
// for each holder in turn and returns the gate, now retain's, for the
// removal (which finds nothing left if that holder was a removal); or nil
// if a newer map holds the stream again, whose first use will claim the
// directory.
func (s *shardSet) gateDeleted(name string) chan struct{} {
	for {
		s.mu.Lock()
		if l := s.mu.latest; l != nil {
			if _, ok := l.Stream(name); ok {
				s.mu.Unlock()
				return nil
			}
		}
		held := s.mu.removing[name]
		if held == nil {
			ch := make(chan struct{})
			s.mu.removing[name] = ch
			// A claim that ended meanwhile noted the deleted stream's
			// incarnation: forget it again.
			delete(s.mu.incarnation, name)
			s.mu.Unlock()
			return ch
		}
		s.mu.Unlock()
		<-held
	}
}

// sweepDeleted removes, once per run (on the first map applied), the
// data of streams deleted while this broker was down: a stream directory
// whose stream m does not hold, marked with a Created epoch older than
// m's (so m is a map of the control plane that created the stream and
// has since deleted it). A directory without a mark (data written before
// marks existed), or with a mark at or past m's epoch (a map from a
// control plane that lost its state and counts epochs afresh), is kept:
// it is never removed on a guess.
func (s *shardSet) sweepDeleted(m *shardmap.Map, r *applyResult) {
	ents, err := fs.ReadDir(s.root.FS(), ".")
	if err != nil {
		s.logger.Error("listing shard data dir", "dir", s.root.Name(), "err", err)
		return
	}
	for _, ent := range ents {
		name := ent.Name()
		if !ent.IsDir() || shardmap.ValidateStreamName(name) != nil {
			continue // the broker's own files, and trash
		}
		if _, ok := m.Stream(name); ok {
			continue
		}
		created, marked, err := s.createdMark(name)
		if err != nil || !marked || created == 0 || created >= m.Epoch {
			continue
		}
		s.mu.Lock()
		_, admitted := s.mu.admitted[name]
		busy := s.mu.removing[name] != nil || admitted || s.mu.latest != m
		ch := make(chan struct{})
		if !busy {
			s.mu.removing[name] = ch // opens of its shards wait
		}
		s.mu.Unlock()
		if busy {
			continue // a newer map, or a use of the name meanwhile: leave it to them
		}
		if err := s.removeStream(name, m.Epoch); err != nil {
			r.deleteErr = append(r.deleteErr, err)
		} else {
			r.deleted = append(r.deleted, name)
			s.logger.Info("removed the data of a stream deleted while this broker was down",
				"stream", name, "created_at_epoch", created, "map_epoch", m.Epoch)
		}
		s.mu.Lock()
		delete(s.mu.removing, name)
		s.mu.Unlock()
		close(ch)
	}
}

// removeStream removes the data of a deleted stream: it renames the
// stream's directory into the trash, then removes the trash.
func (s *shardSet) removeStream(name string, epoch uint64) error {
	if err := shardmap.ValidateStreamName(name); err != nil {
		return fmt.Errorf("not removing data of stream %q: %w", name, err) // never touch the disk for it
	}
	if err := s.marks.removeStream(name); err != nil {
		return fmt.Errorf("remove data of stream %q: %w", name, err)
	}
	trash := trashPrefix + name + "-" + strconv.FormatUint(epoch, 10)
	switch err := s.root.Rename(name, trash); {
	case errors.Is(err, fs.ErrNotExist):
		return nil // it never had data here
	case err != nil:
		// Rename refused (say, a stale trash of the same name): remove
		// in place.
		if err := s.root.RemoveAll(name); err != nil {
			return fmt.Errorf("remove data of stream %q: %w", name, err)
		}
		return nil
	}
	if err := s.root.RemoveAll(trash); err != nil {
		return fmt.Errorf("remove data of stream %q (renamed %s): %w", name, trash, err)
	}
	return nil
}

// admit admits the streams of m under MaxShards and returns the shards to
// open, in map order. Streams admitted before stay admitted; then streams
// with data here are admitted before new ones, each group by name, so a
// restart admits what it held before.
func (s *shardSet) admit(m *shardmap.Map, r *applyResult) []shardmap.ShardID {
	type cand struct {
		st *shardmap.Stream
		n  int
	}
	var cands []cand
	s.mu.Lock()
	for i := range m.Streams {
		st := &m.Streams[i]
		n := ownedBy(st, s.node)
		r.owned += n
		if _, ok := s.mu.admitted[st.Name]; ok {
			s.mu.admitted[st.Name] = n // ownership may have changed
		} else if n > 0 {
			cands = append(cands, cand{st, n})
		}
	}
	s.mu.total = 0
	for _, n := range s.mu.admitted {
		s.mu.total += n
	}
	s.mu.Unlock()
	// Streams with data here first (a stat each, outside the lock).
	var withData, fresh []cand
	for _, c := range cands {
		if err := shardmap.ValidateStreamName(c.st.Name); err != nil {
			// Never admitted, never looked up on disk: its shards fail.
			r.failed += c.n
			for _, shard := range c.st.Placement.ReplicatedBy(s.node) {
				if len(r.failedIDs) < maxListed {
					r.failedIDs = append(r.failedIDs, shardmap.ShardID{Stream: c.st.Name, Shard: shard})
				}
			}
			if r.failedErr == nil {
				r.failedErr = err
			}
		} else if _, err := s.root.Lstat(c.st.Name); err == nil {
			withData = append(withData, c)
		} else {
			fresh = append(fresh, c)
		}
	}
	s.mu.Lock()
	for _, c := range append(withData, fresh...) {
		if _, ok := s.mu.admitted[c.st.Name]; ok {
			continue // admitted meanwhile by a first use
		}
		if s.mu.total+c.n > s.maxShards {
			r.refusedShards += c.n
			r.refused = append(r.refused, c.st.Name)
			continue
		}
		s.mu.admitted[c.st.Name] = c.n
		s.mu.total += c.n
	}
	var toOpen []shardmap.ShardID
	for _, id := range m.ReplicatedBy(s.node) {
		if _, ok := s.mu.admitted[id.Stream]; ok {
			toOpen = append(toOpen, id)
		}
	}
	s.mu.Unlock()
	return toOpen
}
