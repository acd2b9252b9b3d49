package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/wal"
)

// shardSet holds the open logs of the shards this broker owns. Logs open on
// first use or when a map assigns the shard, and close when a map no longer
// assigns it; their files stay on disk unless the stream is deleted.
type shardSet struct {
	dir         string
	segmentSize int
	logger      *slog.Logger
	tel         *telemetry

	// mu guards the map of entries, not the logs: an entry is published
	// before its log has opened so that concurrent users wait on ready
	// instead of opening twice.
	mu struct {
		sync.RWMutex
		closed  bool
		entries map[shardmap.ShardID]*shardEntry
	}
}

type shardEntry struct {
	ready chan struct{} // closed once log or err is set
	log   *wal.Log
	err   error

	// last is the log's latest commit, for the spans of its records. It
	// belongs to the goroutine committing a batch: its OnCommit hook sets
	// it, the completions of the batch's records read it right after.
	last wal.Commit
}

var errShardsClosed = errors.New("broker: shard logs closed")

func newShardSet(dir string, segmentSize int, log *slog.Logger, tel *telemetry) *shardSet {
	s := &shardSet{dir: dir, segmentSize: segmentSize, logger: log, tel: tel}
	s.mu.entries = map[shardmap.ShardID]*shardEntry{}
	return s
}

func (s *shardSet) path(id shardmap.ShardID) string {
	return filepath.Join(s.dir, "streams", id.Stream, strconv.Itoa(id.Shard))
}

// log returns the open log of shard id, opening (and recovering) it first
// if need be.
func (s *shardSet) log(id shardmap.ShardID, cfg shardmap.StreamConfig) (*wal.Log, error) {
	e, err := s.entry(id, cfg)
	if err != nil {
		return nil, err
	}
	return e.log, nil
}

// entry returns the entry of shard id once its log is open, opening (and
// recovering) it first if need be.
func (s *shardSet) entry(id shardmap.ShardID, cfg shardmap.StreamConfig) (*shardEntry, error) {
	s.mu.RLock()
	e := s.mu.entries[id]
	s.mu.RUnlock()
	if e == nil {
		s.mu.Lock()
		if s.mu.closed {
			s.mu.Unlock()
			return nil, errShardsClosed
		}
		e = s.mu.entries[id]
		if e == nil {
			e = &shardEntry{ready: make(chan struct{})}
			s.mu.entries[id] = e
			s.mu.Unlock()
			s.open(id, cfg, e)
		} else {
			s.mu.Unlock()
		}
	}
	<-e.ready
	if e.err != nil {
		return nil, e.err
	}
	return e, nil
}

func (s *shardSet) open(id shardmap.ShardID, cfg shardmap.StreamConfig, e *shardEntry) {
	defer close(e.ready)
	e.log, e.err = wal.Open(s.path(id), wal.Options{
		Name:           id.String(),
		SegmentSize:    s.segmentSize,
		RetentionBytes: cfg.RetentionBytes,
		RetentionAge:   cfg.RetentionAge,
		Logger:         s.logger,
		OnCommit:       s.tel.onCommit(e),
	})
	if e.err != nil {
		s.mu.Lock()
		delete(s.mu.entries, id)
		s.mu.Unlock()
		return
	}
	first, next := e.log.FirstOffset(), e.log.NextOffset()
	s.logger.Info("shard opened", "shard", id.String(), "records", next-first, "first", first, "next", next)
}

// retain closes the logs of shards m does not assign to node, and deletes
// the data of streams m no longer has.
func (s *shardSet) retain(m *shardmap.Map, node string) {
	s.mu.Lock()
	var drop []shardmap.ShardID
	var dropped []*shardEntry
	for id, e := range s.mu.entries {
		st, ok := m.Stream(id.Stream)
		if ok && id.Shard < len(st.Owners) && st.Owners[id.Shard] == node {
			continue
		}
		drop = append(drop, id)
		dropped = append(dropped, e)
		delete(s.mu.entries, id)
	}
	s.mu.Unlock()
	for i, e := range dropped {
		<-e.ready
		if e.log != nil {
			e.log.Close()
		}
		id := drop[i]
		if _, ok := m.Stream(id.Stream); !ok {
			if err := os.RemoveAll(s.path(id)); err != nil {
				s.logger.Error("removing data of deleted stream", "shard", id.String(), "err", err)
			} else {
				s.logger.Info("stream deleted; shard data removed", "shard", id.String())
			}
		} else {
			s.logger.Info("shard no longer owned; log closed", "shard", id.String())
		}
	}
}

func (s *shardSet) close() error {
	s.mu.Lock()
	s.mu.closed = true
	entries := s.mu.entries
	s.mu.entries = map[shardmap.ShardID]*shardEntry{}
	s.mu.Unlock()
	var errs []error
	for id, e := range entries {
		<-e.ready
		if e.log != nil {
			if err := e.log.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close shard %s: %w", id, err))
			}
		}
	}
	return errors.Join(errs...)
}
