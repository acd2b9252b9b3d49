package replica

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/felix-broker/felix/internal/tidseg"
	"github.com/felix-broker/felix/wal"
)

// retentionValue is the value of the record the tests commit at offset i:
// 400 bytes that end with i, so that a read shows which record it got.
func retentionValue(i uint64) []byte {
	return fmt.Appendf(bytes.Repeat([]byte{'x'}, 390), "%010d", i)
}

// commitRange commits the records of offsets [from, to) and checks their
// offsets.
func (c *cluster) commitRange(from, to uint64) {
	c.t.Helper()
	for i := from; i < to; i++ {
		if off := c.commit(retentionValue(i)); off != i {
			c.t.Fatalf("record %d committed at offset %d", i, off)
		}
	}
}

// checkFrom checks that g holds exactly the records [first, next) that
// commitRange committed, and nothing before first.
func checkFrom(t *testing.T, g *Group, first, next uint64) {
	t.Helper()
	if first > 0 {
		if _, err := g.Read(first-1, 1, 1<<20); !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("replica %d: read below its first offset %d: %v, want ErrOutOfRange", g.ID(), first, err)
		}
	}
	for off := first; off < next; {
		recs, err := g.Read(off, 1000, 1<<20)
		if err != nil || len(recs) == 0 {
			t.Fatalf("replica %d: read from %d: %d records, %v", g.ID(), off, len(recs), err)
		}
		for _, r := range recs {
			if r.Offset != off || !bytes.Equal(r.Value, retentionValue(off)) {
				t.Fatalf("replica %d: record at %d has offset %d and value ...%q", g.ID(), off, r.Offset, r.Value[len(r.Value)-10:])
			}
			off++
		}
	}
}

// logBytes is the size of the segment files in dir, but for the zeros
// preallocated after the tail's entries.
func logBytes(t *testing.T, dir string) int64 {
	t.Helper()
	segs, _, err := tidseg.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	n, err := tidseg.DataSize(segs)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func retain(t *testing.T, g *Group, now time.Time) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dropped, err := g.EnforceRetention(ctx, now)
	if err != nil {
		t.Fatalf("replica %d: retention: %v", g.ID(), err)
	}
	return dropped
}

// Retention by size drops whole segments from the front on every replica
// alike, keeps the records after them at their offsets across restarts,
// and the log goes on at the same offsets.
func TestRetentionBySizeDropsWholeSegments(t *testing.T) {
	const segment, limit = 4 << 10, 16 << 10
	c := newCluster(t, 3, 41, func(cfg *Config) { cfg.SegmentSize, cfg.RetentionBytes = segment, limit })
	c.waitLeader()
	c.commitRange(0, 200)
	next := c.waitConverged(200)

	var first uint64
	for i, g := range c.running() {
		dropped := retain(t, g, time.Now())
		f := g.FirstOffset()
		if dropped == 0 || dropped != f {
			t.Fatalf("replica %d: retention dropped %d records, first offset %d", g.ID(), dropped, f)
		}
		// At least the limit is kept, counting entries, not the zeros
		// preallocated after the tail's (they once made a pass drop a
		// segment too many), and less than the limit and one segment.
		if size := logBytes(t, c.dirs[g.ID()]); size < limit || size > limit+segment || size != g.Size() {
			t.Fatalf("replica %d: log of %d bytes after retention (Size says %d), want at least the limit %d and less than one more %d-byte segment", g.ID(), size, g.Size(), limit, segment)
		}
		if i == 0 {
			first = f
		} else if f != first {
			t.Fatalf("replica %d: first offset %d, replica %d's %d", g.ID(), f, c.running()[0].ID(), first)
		}
		checkFrom(t, g, f, next)
		if again := retain(t, g, time.Now()); again != 0 {
			t.Fatalf("replica %d: a second pass dropped %d more", g.ID(), again)
		}
	}

	c.commitRange(next, next+20)
	next = c.waitConverged(next + 20)
	for _, id := range slices.Clone(c.ids) {
		c.kill(id)
		g := c.start(id)
		if g.FirstOffset() != first || g.NextOffset() != next {
			t.Fatalf("replica %d reopened with offsets [%d, %d), want [%d, %d)", id, g.FirstOffset(), g.NextOffset(), first, next)
		}
		checkFrom(t, g, first, next)
	}
	c.commitRange(next, next+5)
	c.waitConverged(next + 5)
}

// agedCluster starts three replicas of 4 KiB segments and an hour's
// retention by age (the leader's clock now, if set), commits records 0 to
// 99 and returns the cluster and its next offset.
func agedCluster(t *testing.T, seed uint64, now func() time.Time) (*cluster, uint64) {
	t.Helper()
	c := newCluster(t, 3, seed, func(cfg *Config) {
		cfg.SegmentSize, cfg.RetentionAge = 4<<10, time.Hour
		cfg.Knobs.Now = now
	})
	c.waitLeader()
	c.commitRange(0, 100)
	return c, c.waitConverged(100)
}

// Retention by age drops a segment once its newest record is older than
// the limit, by the timestamp every replica stores, and never the
// segment being written.
func TestRetentionByAge(t *testing.T) {
	c, next := agedCluster(t, 42, nil)
	for _, g := range c.running() {
		if dropped := retain(t, g, time.Now()); dropped != 0 {
			t.Fatalf("replica %d: dropped %d records younger than the limit", g.ID(), dropped)
		}
		dropped := retain(t, g, time.Now().Add(2*time.Hour))
		segs, _, err := tidseg.List(c.dirs[g.ID()])
		if err != nil {
			t.Fatal(err)
		}
		if dropped == 0 || len(segs) != 1 || g.FirstOffset() != dropped || g.NextOffset() != next {
			t.Fatalf("replica %d: dropped %d, %d segments left, offsets [%d, %d): want every complete segment gone",
				g.ID(), dropped, len(segs), g.FirstOffset(), g.NextOffset())
		}
		checkFrom(t, g, g.FirstOffset(), next)
	}
}

// TestRetentionByAgeLeaderClockBehind: a leader whose clock is two hours
// behind stamps its batches in the past; with an hour's retention no
// replica drops them until its own clock has seen them for an hour too.
// By the stamps alone every replica dropped every complete segment at
// once: acknowledged records gone as soon as they were written.
func TestRetentionByAgeLeaderClockBehind(t *testing.T) {
	c, next := agedCluster(t, 43, func() time.Time { return time.Now().Add(-2 * time.Hour) })
	for _, g := range c.running() {
		if dropped := retain(t, g, time.Now()); dropped != 0 {
			t.Fatalf("replica %d: dropped %d records stamped by a leader two hours behind, written here just now", g.ID(), dropped)
		}
		checkFrom(t, g, 0, next)
		if dropped := retain(t, g, time.Now().Add(2*time.Hour)); dropped == 0 {
			t.Fatalf("replica %d: dropped nothing two hours on", g.ID())
		}
	}
}

// TestRetentionByAgeAfterADrop: a pass that drops segments rewrites the
// first one it keeps (tidwall's TruncateFront), and that file keeps the
// last-write time of the one it replaces: the next pass drops what has
// expired behind it. With the rewrite's own time, age retention stopped
// for a full RetentionAge after every drop.
func TestRetentionByAgeAfterADrop(t *testing.T) {
	start := time.Now()
	var ago atomic.Int64 // how far behind now the leader stamps
	ago.Store(int64(3 * time.Hour))
	c := newCluster(t, 3, 44, func(cfg *Config) {
		cfg.SegmentSize, cfg.RetentionAge = 4<<10, time.Hour
		cfg.Knobs.Now = func() time.Time { return time.Now().Add(-time.Duration(ago.Load())) }
	})
	// age sets the last-write time of every segment file written since
	// since to at. The kernel stamps files from a coarse clock, up to a
	// tick behind time.Now: hence the margin.
	age := func(since, at time.Time) {
		t.Helper()
		since = since.Add(-time.Second)
		for _, dir := range c.dirs {
			segs, _, err := tidseg.List(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, seg := range segs {
				if fi, err := os.Stat(seg.Path); err == nil && !fi.ModTime().Before(since) {
					if err := os.Chtimes(seg.Path, time.Time{}, at); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
	}
	c.waitLeader()
	c.commitRange(0, 100)
	c.waitConverged(100)
	age(start, start.Add(-3*time.Hour))
	phase2 := time.Now()
	ago.Store(int64(90 * time.Minute))
	c.commitRange(100, 200)
	next := c.waitConverged(200)
	age(phase2, start.Add(-90*time.Minute))
	for _, g := range c.running() {
		first := retain(t, g, start.Add(-time.Hour)) // drops the records of three hours ago
		if first == 0 || first >= 100 {
			t.Fatalf("replica %d: the first pass dropped %d records, want some of the first 100", g.ID(), first)
		}
		if second := retain(t, g, start); second == 0 {
			t.Fatalf("replica %d: the second pass dropped nothing, though records of 90 minutes ago are past the hour's limit", g.ID())
		}
		checkFrom(t, g, g.FirstOffset(), next)
	}
}

// A follower that was down while the others dropped the entries it
// lacks gets a snapshot: its log goes on after the leader's compaction
// point, with the same records at the same offsets from there, and it
// serves, votes and leads afterwards.
func TestFollowerBehindCompactionGetsASnapshot(t *testing.T) {
	var mu sync.Mutex
	restored := map[uint64]int{}
	states := map[uint64][]string{} // the owner state each replica installed
	c := newCluster(t, 3, 43, func(cfg *Config) {
		id := cfg.ID
		cfg.SegmentSize, cfg.RetentionBytes = 4<<10, 8<<10
		cfg.SnapshotState = func() []byte { return fmt.Appendf(nil, "state of replica %d", id) }
		cfg.OnRestore = func(state []byte) {
			mu.Lock()
			restored[id]++
			states[id] = append(states[id], string(state))
			mu.Unlock()
		}
	})
	lead := c.waitLeader()
	c.commitRange(0, 20)
	c.waitConverged(20)
	down := lead.ID()%3 + 1
	c.kill(down)
	time.Sleep(20 * tickEvery) // longer than an election timeout: the leader no longer waits for it
	c.commitRange(20, 200)
	next := c.waitConverged(200)
	var first uint64
	for _, g := range c.running() {
		if retain(t, g, time.Now()) == 0 {
			t.Fatalf("replica %d dropped nothing", g.ID())
		}
		first = max(first, g.FirstOffset())
	}

	g := c.start(down)
	c.waitConverged(next)
	mu.Lock()
	n, got := restored[down], states[down]
	mu.Unlock()
	if n != 1 || g.FirstOffset() <= 20 || g.FirstOffset() > first {
		t.Fatalf("replica %d: %d snapshots installed, first offset %d (the others' %d)", down, n, g.FirstOffset(), first)
	}
	var sender uint64 // the leader that sent the snapshot
	if _, err := fmt.Sscanf(got[0], "state of replica %d", &sender); err != nil || sender == down {
		t.Fatalf("replica %d installed owner state %q with the snapshot, want its leader's", down, got[0])
	}
	checkFrom(t, g, g.FirstOffset(), next)

	// It is a full member: with the old leader gone, it and the third
	// elect a leader and commit, and it keeps its log across a restart.
	lead = c.waitLeader()
	c.kill(lead.ID())
	c.commitRange(next, next+10)
	next = c.waitConverged(next + 10)
	snapFirst := g.FirstOffset()
	c.kill(down)
	g = c.start(down)
	if g.FirstOffset() != snapFirst || g.NextOffset() != next {
		t.Fatalf("replica %d reopened with offsets [%d, %d), want [%d, %d)", down, g.FirstOffset(), g.NextOffset(), snapFirst, next)
	}
	checkFrom(t, g, snapFirst, next)
	c.start(lead.ID())
	c.commitRange(next, next+5)
	c.waitConverged(next + 5)
}

// A replica that replaces a lost one joins a group whose leader has
// dropped the log's start: the snapshot it gets is taken at the change
// that added it (raft refuses one whose configuration leaves it out), and
// it becomes a voter.
func TestJoinAfterCompaction(t *testing.T) {
	c := newCluster(t, 3, 44, func(cfg *Config) { cfg.SegmentSize, cfg.RetentionBytes = 4<<10, 8<<10 })
	lead := c.waitLeader()
	lost := lead.ID()%3 + 1
	c.kill(lost)
	if err := os.RemoveAll(c.dirs[lost]); err != nil {
		t.Fatal(err)
	}
	c.ids = slices.DeleteFunc(c.ids, func(id uint64) bool { return id == lost })
	time.Sleep(20 * tickEvery)
	c.commitRange(0, 200)
	next := c.waitConverged(200)
	for _, g := range c.running() {
		if retain(t, g, time.Now()) == 0 {
			t.Fatalf("replica %d dropped nothing", g.ID())
		}
	}
	const joiner = 11
	j := c.join(joiner)
	c.admit(joiner, lost)
	c.commitRange(next, next+5)
	next = c.waitConverged(next + 5)
	if j.FirstOffset() == 0 {
		t.Fatalf("joiner holds the log from offset 0; the leader had dropped it")
	}
	checkFrom(t, j, j.FirstOffset(), next)
	if v, _ := j.Members(); !slices.Contains(v, joiner) || slices.Contains(v, lost) {
		t.Fatalf("joiner's configuration has voters %v", v)
	}
}

// stopAfterStateWrite writes p as s's state, durably, and closes s as a
// stop would, before the log is changed; then it opens dir again.
func stopAfterStateWrite(t *testing.T, s *storage, dir string, p persistent) *storage {
	t.Helper()
	if err := s.st.write(&p, true); err != nil {
		t.Fatal(err)
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	s, err := openTestStorage(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A compaction or a snapshot install that stopped between its state write
// and the log's truncation is finished at open.
func TestInterruptedCompactionFinishedAtOpen(t *testing.T) {
	dir := t.TempDir()
	writeEntries(t, dir, 100, 100)
	s, err := openTestStorage(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	p := s.p // compact's state write
	p.snapIndex, p.snapTerm, p.snapNext = 40, 1, 40
	s = stopAfterStateWrite(t, s, dir, p)
	if first, _ := s.FirstIndex(); first != 41 || s.last != 100 {
		t.Fatalf("reopened log holds [%d, %d], want [41, 100]", first, s.last)
	}
	if tw, _ := s.tw.FirstIndex(); tw != 41 {
		t.Fatalf("tidwall's log starts at %d, want 41", tw)
	}
	if term, err := s.Term(40); err != nil || term != 1 {
		t.Fatalf("term of the compaction point: %d, %v", term, err)
	}
	if _, err := s.Entries(40, 42, 1<<20); err == nil {
		t.Fatal("entries below the compaction point are still served")
	}
	if ents, err := s.Entries(41, 101, 1<<30); err != nil || len(ents) != 60 {
		t.Fatalf("entries after the compaction point: %d, %v", len(ents), err)
	}

	p = s.p // installSnapshot's state write, beyond the whole log
	p.snapIndex, p.snapTerm, p.snapNext, p.commit = 150, 2, 150, 150
	s = stopAfterStateWrite(t, s, dir, p)
	defer s.close()
	if first, _ := s.FirstIndex(); first != 151 || s.last != 150 {
		t.Fatalf("reopened log holds [%d, %d], want it empty from 151", first, s.last)
	}
	if err := s.append([]*pb.Entry{testEntry(151, 2, "after")}); err != nil {
		t.Fatalf("append after the snapshot's index: %v", err)
	}
}

// checkSameFrom checks that the running replicas hold, from the highest
// of their first offsets to next, the same records at the same offsets,
// and that each one's records from its own first offset are dense; it
// returns the records from that highest first offset.
func (c *cluster) checkSameFrom(next uint64) map[uint64]wal.Record {
	c.t.Helper()
	var from uint64
	for _, g := range c.running() {
		from = max(from, g.FirstOffset())
	}
	out := map[uint64]wal.Record{}
	for _, g := range c.running() {
		for off := g.FirstOffset(); off < next; {
			recs, err := g.Read(off, 1000, 1<<20)
			if err != nil || len(recs) == 0 {
				c.t.Fatalf("replica %d: read from %d (next %d): %d records, %v", g.ID(), off, next, len(recs), err)
			}
			for _, r := range recs {
				if r.Offset != off {
					c.t.Fatalf("replica %d: record at %d has offset %d", g.ID(), off, r.Offset)
				}
				if off >= from {
					if prev, ok := out[off]; ok && (!bytes.Equal(prev.Value, r.Value) || prev.Timestamp != r.Timestamp) {
						c.t.Fatalf("replica %d differs at offset %d: %q, another has %q", g.ID(), off, r.Value, prev.Value)
					}
					out[off] = r
				}
				off++
			}
		}
	}
	return out
}

// TestSnapshotOverOwnProposalIsUnknownOutcome: a leader cut off after its
// followers appended its proposal X (their answers lost) learns of X's
// fate only from a snapshot: its successor committed X with its first
// entry and then compacted past it while the old leader was not heard.
// Installing the snapshot fails X as of unknown outcome. It was told
// "replaced, never committed" (NotLeaderError), which the broker routes
// again: a record committed once, written twice.
func TestSnapshotOverOwnProposalIsUnknownOutcome(t *testing.T) {
	c := newCluster(t, 3, 77, func(cfg *Config) { cfg.SegmentSize, cfg.RetentionBytes = 4<<10, 8<<10 })
	old := c.waitLeader()
	c.commitRange(0, 5)
	c.waitConverged(5)
	var others []uint64
	for _, id := range c.ids {
		if id != old.ID() {
			others = append(others, id)
		}
	}
	for _, o := range others {
		c.net.Cut(o, old.ID()) // the followers' answers are lost
	}
	x := appendTo(old, []byte("X"))
	for deadline := time.Now().Add(5 * time.Second); c.net.Appended(others[0]) == 0; time.Sleep(tickEvery) {
		if time.Now().After(deadline) {
			t.Fatal("X never reached a follower")
		}
	}
	time.Sleep(5 * tickEvery)
	c.net.Isolate(old.ID(), c.ids...)
	nl := c.waitLeader(old.ID())
	if r := <-appendTo(nl, []byte("after")); r.err != nil || r.offset != 6 {
		t.Fatalf("the new leader's first record: offset %d, %v; want 6, after X committed at 5", r.offset, r.err)
	}
	time.Sleep(20 * tickEvery) // the old leader is not heard: retention does not wait for it
	for i := uint64(0); i < 200; i++ {
		if r := <-appendTo(nl, retentionValue(i)); r.err != nil {
			t.Fatalf("append: %v", r.err)
		}
	}
	for d := time.Now().Add(10 * time.Second); c.group(others[0]).NextOffset() != c.group(others[1]).NextOffset(); time.Sleep(tickEvery) {
		if time.Now().After(d) {
			t.Fatal("the followers did not converge")
		}
	}
	for _, id := range others {
		if retain(t, c.group(id), time.Now()) == 0 {
			t.Fatalf("replica %d dropped nothing", id)
		}
	}
	c.net.Heal()
	select {
	case r := <-x:
		if !errors.Is(r.err, ErrUnknownOutcome) || errors.Is(r.err, ErrNotLeader) {
			t.Fatalf("X, committed at offset 5 by the new leader, was told: offset %d, %v; want ErrUnknownOutcome", r.offset, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("X was never told its fate")
	}
}
