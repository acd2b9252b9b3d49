package replica

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
)

// runningLog opens a log in dir with entries 1..n of term 1, committed to
// commit, compacted up to commit if compact, then appends entries up to
// more, not committed: left open, so that its tail segment ends in the
// zeros preallocated ahead of the entries, as a kill -9 finds it.
func runningLog(t *testing.T, dir string, n, commit uint64, compact bool, more uint64) *storage {
	t.Helper()
	s, err := openTestStorage(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	appendUpTo := func(to uint64) {
		for i := s.last + 1; i <= to; i++ {
			if err := s.append([]*pb.Entry{testEntry(i, 1, fmt.Sprintf("value-%03d-%s", i, strings.Repeat("x", 40)))}); err != nil {
				t.Fatal(err)
			}
		}
	}
	appendUpTo(n)
	if err := s.setState(&pb.HardState{Term: new(uint64(1)), Vote: new(uint64(1)), Commit: new(commit)}, nil, true); err != nil {
		t.Fatal(err)
	}
	if compact {
		if err := s.compact(commit+1, commit+1, s.p.conf); err != nil {
			t.Fatal(err)
		}
	}
	appendUpTo(more)
	return s
}

// killDuringInstall installs a snapshot at index (term 2) on s and
// returns a copy of s's directory taken in the install right after its
// state write, before the log is replaced: what a kill -9 there leaves.
// s is closed.
func killDuringInstall(t *testing.T, s *storage, index uint64) string {
	t.Helper()
	crashed := filepath.Join(t.TempDir(), "crashed")
	s.afterSnapshotState = func() error { return os.CopyFS(crashed, os.DirFS(s.dir)) }
	snap := &pb.Snapshot{Data: snapshotData(index, nil), Metadata: &pb.SnapshotMetadata{
		Index: new(index), Term: new(uint64(2)), ConfState: &pb.ConfState{Voters: []uint64{1, 2, 3}}}}
	if err := s.installSnapshot(snap, index); err != nil {
		t.Fatal(err)
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	return crashed
}

// tearLastEntry zeroes the end of the last entry of dir's log, as a
// write that reached the disk in part leaves it over preallocated zeros.
func tearLastEntry(t *testing.T, dir string) {
	t.Helper()
	path, data, _ := lastSegment(t, dir)
	end := entriesEnd(t, data)
	clear(data[end-5 : end])
	if err := os.WriteFile(path, data, 0o640); err != nil {
		t.Fatal(err)
	}
}

// TestOpenAfterKillDuringSnapshotInstall: a replica stopped by kill -9 in
// a snapshot install, after the state write (compaction point and commit
// at the snapshot's index) and before its log was replaced, opens: the
// old log's tail (the zeros preallocated after it, or a torn entry) holds
// nothing the state says the log has, and the install is finished.
func TestOpenAfterKillDuringSnapshotInstall(t *testing.T) {
	cases := []struct {
		name        string
		commit      uint64 // of the log of entries 1-35 before the install
		compact     bool   // up to commit, then entries 36-40 appended: the log after commit is an uncommitted suffix the install keeps
		index       uint64 // the snapshot's
		tear        bool   // the old log's last entry was torn
		first, last uint64 // the reopened log's
	}{
		{"log committed to its end, zeros after it", 35, false, 150, false, 151, 150},
		{"uncommitted suffix cut first", 30, false, 150, false, 151, 150},
		{"uncommitted suffix kept, zeros after it", 30, true, 150, false, 151, 150},
		{"uncommitted suffix kept, its last entry torn", 30, true, 150, true, 151, 150},
		{"snapshot inside the uncommitted suffix, its last entry torn", 30, true, 37, true, 38, 39},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			more := uint64(35)
			if tc.compact {
				more = 40
			}
			s := runningLog(t, t.TempDir(), 35, tc.commit, tc.compact, more)
			if tc.tear {
				// The tear of an append a crash interrupted: the state
				// has the entry before it as the last one synced. (One
				// the state says was synced is damage: refused,
				// TestStorageRepairsTornTail.)
				s.p.synced = s.last - 1
			}
			crashed := killDuringInstall(t, s, tc.index)
			if tc.tear {
				tearLastEntry(t, crashed)
			}
			c, err := openTestStorage(t, crashed)
			if err != nil {
				t.Fatalf("a replica stopped between installSnapshot's state write and its new log does not open: %v", err)
			}
			defer c.close()
			if first, _ := c.FirstIndex(); first != tc.first || c.last != tc.last {
				t.Fatalf("reopened log holds [%d, %d], want [%d, %d]", first, c.last, tc.first, tc.last)
			}
			if term, err := c.Term(tc.index); err != nil || term != 2 || c.p.commit != tc.index {
				t.Fatalf("snapshot's index %d: term %d (%v), committed index %d", tc.index, term, err, c.p.commit)
			}
			if err := c.append([]*pb.Entry{testEntry(tc.index+1, 2, "after")}); err != nil {
				t.Fatalf("append after the snapshot's index: %v", err)
			}
		})
	}
}

// TestOpenRefusesDamageTheStateDoesNotExplain: where the state says the
// log holds entries up to the committed index beyond its compaction point
// (an interrupted compaction, or a finished one), damage that reaches
// them is refused as it is without a compaction point, whether it is a
// torn entry or zeros, and the segment is left as it was.
func TestOpenRefusesDamageTheStateDoesNotExplain(t *testing.T) {
	cases := []struct {
		name   string
		damage func(data []byte, lastAt int) []byte
	}{
		{"last entry torn", func(d []byte, _ int) []byte { clear(d[len(d)-5:]); return d }},
		{"last entry lost to zeros", func(d []byte, at int) []byte { clear(d[at:]); return append(d, make([]byte, 100)...) }},
		{"bit flipped in an entry before others", func(d []byte, at int) []byte { d[at-3] ^= 0x10; return d }},
	}
	for _, stop := range []struct {
		name        string
		interrupted bool // the compaction stopped after its state write
	}{{"compaction", false}, {"interrupted compaction", true}} {
		for _, tc := range cases {
			t.Run(stop.name+"/"+tc.name, func(t *testing.T) {
				dir := t.TempDir()
				s := runningLog(t, dir, 35, 35, false, 35)
				if stop.interrupted {
					p := s.p // compact's state write
					p.snapIndex, p.snapTerm, p.snapNext = 20, 1, 20
					if err := s.st.write(&p, true); err != nil {
						t.Fatal(err)
					}
				} else if err := s.compact(21, 21, s.p.conf); err != nil {
					t.Fatal(err)
				}
				if err := s.close(); err != nil {
					t.Fatal(err)
				}
				path, data, at := lastSegment(t, dir)
				damaged := tc.damage(data, at)
				if err := os.WriteFile(path, damaged, 0o640); err != nil {
					t.Fatal(err)
				}
				s, err := openTestStorage(t, dir)
				if err == nil {
					s.close()
					t.Fatal("a log damaged below its committed index, above its compaction point, opened")
				}
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("open: %v, want ErrCorrupt", err)
				}
				if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, damaged) {
					t.Fatalf("the damaged segment was changed by the failed open (%d bytes, want %d; %v)", len(after), len(damaged), err)
				}
			})
		}
	}
}

// TestFollowerKilledDuringSnapshotInstallRejoins: a follower cut off while
// the others dropped the entries it lacks gets a snapshot, and is killed
// in the install right after its state write, before the install
// replaced its log (the install fails there, so nothing more leaves it,
// and a copy of its directory is what a kill -9 leaves): it reopens from
// that copy, the install finished, and catches up with the same records
// at the same offsets.
func TestFollowerKilledDuringSnapshotInstallRejoins(t *testing.T) {
	var down atomic.Uint64 // the follower killed in its install
	var once atomic.Bool
	crashed := filepath.Join(t.TempDir(), "crashed")
	killed := make(chan struct{})
	c := newCluster(t, 3, 45, func(cfg *Config) {
		id, dir := cfg.ID, cfg.Dir
		cfg.SegmentSize, cfg.RetentionBytes = 4<<10, 8<<10
		cfg.Knobs.AfterSnapshotState = func() error {
			if down.Load() != id || !once.CompareAndSwap(false, true) {
				return nil
			}
			defer close(killed)
			if err := os.CopyFS(crashed, os.DirFS(dir)); err != nil {
				return err
			}
			return errors.New("killed after the install's state write")
		}
	})
	lead := c.waitLeader()
	c.commitRange(0, 20)
	c.waitConverged(20)
	down.Store(lead.ID()%3 + 1)
	// Cut off, not closed: its log's tail keeps the zeros written ahead
	// of its entries, as a kill -9 finds them.
	c.net.Isolate(down.Load(), c.ids...)
	c.commitRange(20, 200)
	for _, g := range c.running() {
		if g.ID() == down.Load() {
			continue
		}
		for deadline := time.Now().Add(30 * time.Second); g.NextOffset() < 200; time.Sleep(tickEvery) {
			if time.Now().After(deadline) {
				t.Fatalf("replica %d: %d records, want 200", g.ID(), g.NextOffset())
			}
		}
		if retain(t, g, time.Now()) == 0 {
			t.Fatalf("replica %d dropped nothing", g.ID())
		}
	}
	c.net.Heal()
	select {
	case <-killed:
	case <-time.After(30 * time.Second):
		t.Fatalf("replica %d installed no snapshot", down.Load())
	}

	c.kill(down.Load())
	c.dirs[down.Load()] = crashed
	g := c.start(down.Load())
	c.commitRange(200, 205)
	next := c.waitConverged(205)
	if g.FirstOffset() <= 20 {
		t.Fatalf("replica %d reopened with its log from offset %d; the snapshot's was dropped", g.ID(), g.FirstOffset())
	}
	checkFrom(t, g, g.FirstOffset(), next)
}
