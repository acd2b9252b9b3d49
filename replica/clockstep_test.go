package replica

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/tidseg"
	"github.com/felix-broker/felix/wal"
)

// TestRetentionByAgeLeaderClockAheadOnce: the mirror of
// TestRetentionByAgeLeaderClockBehind. The leader's clock is a year ahead
// for its first ten records (then NTP fixes it). Two hours on, by every
// replica's own clock and by the stamps of the 190 later records, all but
// the tail segment are past the hour's limit. A segment whose stamps lie
// a year past its file's last write is dated by the file: were it kept,
// the pass would stop at it, and age retention of the shard with it, for
// a year.
func TestRetentionByAgeLeaderClockAheadOnce(t *testing.T) {
	var ahead atomic.Int64
	ahead.Store(int64(365 * 24 * time.Hour))
	c := newCluster(t, 3, 45, func(cfg *Config) {
		cfg.SegmentSize, cfg.RetentionAge = 4<<10, time.Hour
		cfg.Knobs.Now = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	})
	c.waitLeader()
	c.commitRange(0, 10)
	ahead.Store(0) // the leader's clock is fixed
	c.commitRange(10, 200)
	next := c.waitConverged(200)
	for _, g := range c.running() {
		segs, _, err := tidseg.List(c.dirs[g.ID()])
		if err != nil {
			t.Fatal(err)
		}
		dropped := retain(t, g, time.Now().Add(2*time.Hour))
		if dropped < 150 {
			t.Errorf("replica %d: %d segments, a pass two hours on dropped %d of %d records (first offset %d): want every complete segment gone", g.ID(), len(segs), dropped, next, g.FirstOffset())
		}
	}
}

// TestCommitTimeoutAcrossClockStep: TestCommitTimeoutThenFate with the
// leader's wall clock stepped by an hour between the proposal and the
// checks (Knobs.Now is the clock the proposal is stamped with, and expire
// reads time.Now: as if time.Now read an hour more, or less, at the
// proposal than it does now). A record its cut-off leader cannot commit
// is told ErrCommitTimeout about CommitTimeout (200ms) after its
// proposal, by the elapsed time. With the stamp as the waiter's proposed
// time (time.Unix, no monotonic reading) it waited an hour more after a
// step back, and was told at once after a step forward.
func TestCommitTimeoutAcrossClockStep(t *testing.T) {
	const timeout = 200 * time.Millisecond
	for _, tc := range []struct {
		name string
		off  time.Duration // the proposal's clock, from now's
	}{{"back", time.Hour}, {"forward", -time.Hour}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 3, 9, func(cfg *Config) {
				cfg.CommitTimeout = timeout
				cfg.Knobs.Now = func() time.Time { return time.Now().Add(tc.off) }
			})
			old := c.waitLeader()
			c.net.Isolate(old.ID(), c.ids...)
			ch := make(chan result, 2)
			start := time.Now()
			old.AppendAsync(&wal.Record{Value: []byte("stuck")}, func(o uint64, ts int64, err error) { ch <- result{o, ts, err} })
			select {
			case r := <-ch:
				took := time.Since(start)
				if !errors.Is(r.err, ErrCommitTimeout) {
					t.Fatalf("first answer: offset %d err %v, want ErrCommitTimeout", r.offset, r.err)
				}
				if took < timeout || took > 5*time.Second {
					t.Fatalf("ErrCommitTimeout %v after the append, CommitTimeout %v: measured on the wall clock, which stepped %v", took, timeout, -tc.off)
				}
				t.Logf("ErrCommitTimeout after %v", took)
			case <-time.After(20 * time.Second):
				t.Fatal("no answer 20s after appending a record its cut-off leader cannot commit (CommitTimeout 200ms): the timeout waits for the wall clock, which stepped")
			}
		})
	}
}
