package broker

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/wal"
)

// TestSweepKeepsAFailedLog: the retention sweep takes its due list, a
// publish opens one of those logs and its fdatasync fails, then the sweep
// reaches that shard: the failed log stays open, refusing records, as
// makeRoomLocked keeps it (sweepOne closed it as idle, and the next use
// reopened it and appended after the failed batch).
func TestSweepKeepsAFailedLog(t *testing.T) {
	var armed atomic.Bool
	ffs := &wal.FaultFS{Inject: func(op wal.Op, path string) bool {
		return op == wal.OpSync && armed.Load() &&
			strings.Contains(path, string(filepath.Separator)+"doomed"+string(filepath.Separator)) &&
			len(filepath.Base(path)) == 20
	}}
	s := testShardSet(t, t.TempDir(), func(c *Config) { c.MaxOpenShards = 1; c.Knobs.WALFS = ffs })
	defer s.close()
	m := handMap(1, shardmap.StreamConfig{Name: "aaa", Shards: 1},
		shardmap.StreamConfig{Name: "doomed", Shards: 1, RetentionAge: time.Hour})
	m.Streams[0].Created, m.Streams[1].Created = 1, 1
	id := shardmap.ShardID{Stream: "doomed", Shard: 0}
	// Give doomed/0 a directory and a record, then let it be closed.
	s.apply(m)
	appendRecords(t, s, m, id, 1)
	appendRecords(t, s, m, shardmap.ShardID{Stream: "aaa", Shard: 0}, 1) // evicts doomed/0
	due := s.dueLogs(time.Now().Add(2 * time.Hour))
	if len(due) != 1 || due[0] != id {
		t.Fatalf("due %v", due)
	}
	// A publish opens doomed/0 and its commit fails.
	e, err := s.acquire(m, id)
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	_, _ = e.log.Append(context.Background(), &wal.Record{Value: []byte("lost")})
	armed.Store(false)
	e.release()
	if e.log.Err() == nil {
		t.Fatal("log did not fail")
	}
	// The sweep goes on with its list.
	for _, id := range due {
		s.sweepOne(id)
	}
	e2, err := s.acquire(m, id)
	if err != nil {
		t.Fatalf("acquire after sweep: %v", err)
	}
	defer e2.release()
	if e2 == e {
		return
	}
	off, err := e2.log.Append(context.Background(), &wal.Record{Value: []byte("after")})
	t.Errorf("failed log was closed by the sweep and reopened in the same run: Err=%v; append after the failed batch: offset %d err %v (first=%d next=%d)",
		e2.log.Err(), off, err, e2.log.FirstOffset(), e2.log.NextOffset())
}

// TestMakeRoomSkipsOpeningEntries: concurrent first uses over a small
// open-log budget; makeRoomLocked does not read the log of an entry still
// opening, which open sets outside the lock (go test -race reported it).
func TestMakeRoomSkipsOpeningEntries(t *testing.T) {
	s := testShardSet(t, t.TempDir(), func(c *Config) { c.MaxOpenShards = 2 })
	defer s.close()
	var cfgs []shardmap.StreamConfig
	for i := range 8 {
		cfgs = append(cfgs, shardmap.StreamConfig{Name: fmt.Sprintf("s%d", i), Shards: 1})
	}
	m := handMap(1, cfgs...)
	for round := range 50 {
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				if e, err := s.acquire(m, shardmap.ShardID{Stream: fmt.Sprintf("s%d", (i+round)%8), Shard: 0}); err == nil {
					e.release()
				}
			})
		}
		wg.Wait()
	}
}

// TestReplacedStreamLeavesNoStats: applying a map in which a stream was
// deleted and created again closes the old incarnation's log; the old
// log's stats and retention are not kept for the new stream's shard (its
// gauges showed the deleted stream's offsets and size).
func TestReplacedStreamLeavesNoStats(t *testing.T) {
	s := testShardSet(t, t.TempDir(), nil)
	defer s.close()
	id := shardmap.ShardID{Stream: "orders", Shard: 0}
	mk := func(epoch, created uint64) *shardmap.Map {
		m := handMap(epoch, shardmap.StreamConfig{Name: "orders", Shards: 1, RetentionAge: time.Hour})
		m.Streams[0].Created = created
		return m
	}
	m := mk(1, 1)
	s.apply(m)
	appendRecords(t, s, m, id, 3)
	s.apply(mk(3, 3)) // deleted at 2, created again at 3
	s.mu.RLock()
	st, ok := s.mu.closedStats[id]
	_, rok := s.mu.retention[id]
	s.mu.RUnlock()
	if ok || rok {
		t.Fatalf("the deleted incarnation's closed stats (%+v, %v) or retention (%v) kept for the new stream", st, ok, rok)
	}
}

// TestConcurrentOpensRetireOneLogEach: k first uses over a full budget of
// idle logs retire k of them, not k(k+1)/2 (makeRoomLocked counted the
// logs others had retired, still closing, as needing room too). Driven
// step by step under s.mu as k acquireSlow calls interleave: each makes
// room and inserts its entry before any victim's close has finished.
func TestConcurrentOpensRetireOneLogEach(t *testing.T) {
	const budget, k = 8, 3
	s := testShardSet(t, t.TempDir(), func(c *Config) { c.MaxOpenShards = budget })
	defer s.close()
	var cfgs []shardmap.StreamConfig
	for i := range budget {
		cfgs = append(cfgs, shardmap.StreamConfig{Name: fmt.Sprintf("idle%d", i), Shards: 1})
	}
	m := handMap(1, cfgs...)
	s.apply(m) // budget logs open, all idle
	if n := s.openLogs(); n != budget {
		t.Fatalf("open %d", n)
	}
	var victims, fakes []*shardEntry
	s.mu.Lock()
	for i := range k {
		v, closing, err := s.makeRoomLocked(false)
		if err != nil || closing != nil {
			t.Errorf("step %d: closing=%v err=%v", i, closing != nil, err)
			break
		}
		victims = append(victims, v...)
		e := &shardEntry{id: shardmap.ShardID{Stream: "new", Shard: i}, ready: make(chan struct{})}
		e.refs.Store(1)
		s.mu.entries[e.id] = e
		fakes = append(fakes, e)
	}
	s.mu.Unlock()
	for _, v := range victims {
		s.finish(v)
	}
	s.mu.Lock()
	for _, e := range fakes {
		delete(s.mu.entries, e.id)
	}
	s.mu.Unlock()
	if len(victims) != k {
		t.Errorf("%d concurrent opens retired %d idle logs, want %d (after they close: %d of %d budget open)",
			k, len(victims), k, budget-len(victims)+k, budget)
	}
}
