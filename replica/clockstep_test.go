package replica

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/tidseg"
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
