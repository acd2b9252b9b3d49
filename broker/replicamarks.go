package broker

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/felix-broker/felix/internal/atomicfile"
	"github.com/felix-broker/felix/shardmap"
)

// replicaMarksFile lists, one shard id per line, the replicated shards
// whose replica this broker created in its shard data directory. It lives
// at the top of that directory (a dot-name, which no stream can have).
const replicaMarksFile = ".replicas"

// replicaMarks remembers which replicas of replicated shards this broker
// created, apart from their own directories, so that a replica whose
// directory disappeared while the broker's data directory stayed (one
// shard's or one stream's directory deleted) is known to be lost: opened
// as a new, empty replica, it would take part in elections with a log and
// votes it has forgotten, and could elect a replica lacking an entry it
// helped commit. (A broker whose whole data directory is gone starts
// fresh, and noteLostLocked covers that case.)
//
// The file is written before a new replica's first state, so a crash in
// between leaves a mark without state: that replica is then treated as
// lost, which costs it its place (the shard goes on with two) but never a
// wrong vote.
type replicaMarks struct {
	root *os.Root
	mu   sync.Mutex
	ids  map[string]bool // guarded by mu
}

// loadReplicaMarks reads the marks under root; no file means none.
func loadReplicaMarks(root *os.Root) (*replicaMarks, error) {
	m := &replicaMarks{root: root, ids: map[string]bool{}}
	b, err := root.ReadFile(replicaMarksFile)
	if errors.Is(err, fs.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s in %s: %w", replicaMarksFile, root.Name(), err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" {
			m.ids[line] = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s in %s: %w", replicaMarksFile, root.Name(), err)
	}
	return m, nil
}

// has reports whether this broker created its replica of id.
func (m *replicaMarks) has(id shardmap.ShardID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ids[id.String()]
}

// add marks id, durably, before its replica's state is first written.
func (m *replicaMarks) add(id shardmap.ShardID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ids[id.String()] {
		return nil
	}
	m.ids[id.String()] = true
	if err := m.writeLocked(); err != nil {
		delete(m.ids, id.String())
		return err
	}
	return nil
}

// removeStream forgets the marks of stream's shards: its data is being
// removed, and a stream created later under the same name is new.
func (m *replicaMarks) removeStream(stream string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	prefix, changed := stream+"/", false
	for id := range m.ids {
		if strings.HasPrefix(id, prefix) {
			delete(m.ids, id)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return m.writeLocked()
}

// writeLocked replaces the file with the current marks, atomically and
// durably.
func (m *replicaMarks) writeLocked() error {
	ids := make([]string, 0, len(m.ids))
	for id := range m.ids {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return atomicfile.WriteFileIn(m.root, replicaMarksFile, []byte(strings.Join(ids, "\n")+"\n"), 0o640)
}
