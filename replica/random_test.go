package replica

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/felix-broker/felix/wal"
)

// history records every append's outcome, as its callback reports it.
type history struct {
	mu       sync.Mutex
	acked    map[string]uint64 // payload → acked offset
	failed   int
	replaced int // failed because another leader's entries replaced them
	pending  int
}

// TestRandomizedFaults runs appenders against whichever replica leads
// while a nemesis partitions replicas, drops messages and restarts
// replicas, then checks that every acknowledged record is on every replica,
// once, at its acknowledged offset, and that offsets are dense.
// FELIX_REPLICA_SEEDS=n runs n seeds; FELIX_REPLICA_STEPS sets the
// nemesis steps per seed.
func TestRandomizedFaults(t *testing.T) {
	seeds, steps := 2, 12
	if v, err := strconv.Atoi(os.Getenv("FELIX_REPLICA_SEEDS")); err == nil {
		seeds = v
	}
	if v, err := strconv.Atoi(os.Getenv("FELIX_REPLICA_STEPS")); err == nil {
		steps = v
	}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { randomizedRun(t, seed+1, steps, false) })
		t.Run(fmt.Sprint("retention/seed", seed), func(t *testing.T) { randomizedRun(t, seed+1, steps, true) })
	}
}

// randomizedRun is one seed of TestRandomizedFaults. With retention, the
// replicas keep about 16 KiB each, the nemesis also runs retention passes
// (so that replicas cut off or restarted come back behind a leader's
// compaction point and get snapshots), and the check covers what every
// replica still holds.
func randomizedRun(t *testing.T, seed uint64, steps int, retention bool) {
	var opts func(*Config)
	var snapshots atomic.Int64
	if retention {
		opts = func(cfg *Config) {
			cfg.SegmentSize, cfg.RetentionBytes = 2<<10, 16<<10
			cfg.OnRestore = func([]byte) { snapshots.Add(1) }
		}
	}
	c := newCluster(t, 3, seed, opts)
	c.waitLeader()
	h := &history{acked: map[string]uint64{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				g := c.leader()
				if g == nil {
					time.Sleep(tickEvery)
					continue
				}
				payload := fmt.Sprintf("w%d-%d-%0100d", w, i, 0)
				done := make(chan struct{})
				h.mu.Lock()
				h.pending++
				h.mu.Unlock()
				g.AppendAsync(&wal.Record{Value: []byte(payload)}, func(off uint64, _ int64, err error) {
					h.mu.Lock()
					h.pending--
					if err == nil {
						if prev, dup := h.acked[payload]; dup {
							t.Errorf("%q acked twice: offsets %d and %d", payload, prev, off)
						}
						h.acked[payload] = off
					} else {
						h.failed++
						var nl *NotLeaderError
						if errors.As(err, &nl) && nl.Replaced {
							h.replaced++
						}
					}
					h.mu.Unlock()
					close(done)
				})
				select {
				case <-done:
				case <-time.After(time.Second): // outcome open; the callback may still come
				case <-stop:
					return
				}
			}
		}()
	}

	retainAll := func() {
		for _, g := range c.running() {
			if _, err := g.EnforceRetention(context.Background(), time.Now()); err != nil && !errors.Is(err, ErrClosed) {
				t.Errorf("replica %d: retention: %v", g.ID(), err)
			}
		}
	}
	rng := rand.New(rand.NewPCG(seed, 99))
	for range steps {
		id := c.ids[rng.IntN(len(c.ids))]
		action := rng.IntN(5)
		if retention && rng.IntN(3) == 0 {
			action = 5
		}
		switch action {
		case 0:
			c.net.Isolate(id, c.ids...)
		case 1:
			if l := c.leader(); l != nil {
				c.net.Isolate(l.ID(), c.ids...) // the interesting case: a leader with proposals in flight
			}
		case 2:
			c.net.SetDrop(0.05 + rng.Float64()*0.25)
		case 3:
			c.kill(id)
			time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond)
			if retention {
				// Down for more than an election timeout while the others
				// drop the log's start: it comes back behind it.
				time.Sleep(20 * tickEvery)
				retainAll()
			}
			c.start(id)
		case 4:
			c.net.Heal()
		case 5:
			retainAll()
		}
		time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	c.net.Heal()
	c.commit([]byte("final")) // a leader of the last term committed everything before it
	next := c.waitConverged(1)
	var recs map[uint64]wal.Record
	if retention {
		for _, g := range c.running() {
			retain(t, g, time.Now())
		}
		recs = c.checkSameFrom(next)
	} else {
		recs = map[uint64]wal.Record{}
		for _, r := range c.checkSame(next) { // dense offsets, the same records everywhere
			recs[r.Offset] = r
		}
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[string]int{}
	for _, r := range recs {
		seen[string(r.Value)]++
	}
	for payload, off := range h.acked {
		if off >= next {
			t.Errorf("%q acked at offset %d, but only %d records are committed", payload, off, next)
			continue
		}
		r, held := recs[off]
		if !held {
			continue // dropped by retention
		}
		if got := string(r.Value); got != payload {
			t.Errorf("%q acked at offset %d, which holds %q", payload, off, got)
		}
		if seen[payload] != 1 && held {
			t.Errorf("%q acked, held %d times", payload, seen[payload])
		}
	}
	for payload, n := range seen {
		if n > 1 {
			t.Errorf("%q held %d times", payload, n)
		}
	}
	t.Logf("seed %d: %d records committed, %d held, %d acked, %d failed (%d replaced by another leader's), %d open, %d snapshots installed",
		seed, next, len(recs), len(h.acked), h.failed, h.replaced, h.pending, snapshots.Load())
	if len(h.acked) == 0 {
		t.Error("no record acked: the run tested nothing")
	}
}
