package broker

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/felix-broker/felix/internal/atomicfile"
	"github.com/felix-broker/felix/internal/tidseg"
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
//
// A mark is one line appended to the file and fdatasynced, so that a
// broker taking on n replicas writes O(n) bytes and makes n small
// fdatasyncs; rewriting the whole file for each (as before) wrote O(n²)
// bytes with a file and a directory fsync each. Only a line ended by its
// newline counts: a crash in the middle of an append leaves a partial
// last line, whose add never returned and whose replica therefore never
// wrote any state, and it is ignored. The file is rewritten whole
// (atomically) when a stream's marks are removed, and before the next
// append when the last one failed or the file does not end with a
// newline, so that a partial line never runs into the next mark.
type replicaMarks struct {
	root *os.Root
	mu   sync.Mutex
	ids  map[string]bool // guarded by mu
	// app is the file open for appends, nil until the first append after
	// loading or a rewrite; rewrite says the next add must rewrite the
	// file whole first. Both guarded by mu.
	app     *os.File
	rewrite bool
}

// loadReplicaMarks reads the marks under root; no file means none.
func loadReplicaMarks(root *os.Root) (*replicaMarks, error) {
	m := &replicaMarks{root: root, ids: map[string]bool{}}
	b, err := root.ReadFile(replicaMarksFile)
	if errors.Is(err, fs.ErrNotExist) {
		m.rewrite = true // creates the file (and syncs its directory)
		return m, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s in %s: %w", replicaMarksFile, root.Name(), err)
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		// A torn append: its line does not count, and must not run into
		// the next one.
		b, m.rewrite = b[:bytes.LastIndexByte(b, '\n')+1], true
	}
	for line := range strings.Lines(string(b)) {
		if id := strings.TrimSpace(line); id != "" {
			m.ids[id] = true
		}
	}
	return m, nil
}

// has reports whether this broker created its replica of id.
func (m *replicaMarks) has(id shardmap.ShardID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ids[id.String()]
}

// add marks ids, durably (one write and one fdatasync), before their
// replicas' state is first written.
func (m *replicaMarks) add(ids ...shardmap.ShardID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var keys []string
	var lines strings.Builder
	for _, id := range ids {
		if key := id.String(); !m.ids[key] {
			m.ids[key] = true
			keys = append(keys, key)
			lines.WriteString(key + "\n")
		}
	}
	if len(keys) == 0 {
		return nil
	}
	undo := func() {
		for _, key := range keys {
			delete(m.ids, key)
		}
	}
	if m.rewrite {
		if err := m.writeLocked(); err != nil {
			undo()
			return err
		}
		return nil
	}
	if err := m.appendLocked(lines.String()); err != nil {
		undo()
		m.closeAppendLocked()
		m.rewrite = true // whatever the failed append left is replaced
		return err
	}
	return nil
}

// appendLocked appends lines (each ended by a newline) to the file and
// fdatasyncs it.
func (m *replicaMarks) appendLocked(lines string) error {
	if m.app == nil {
		f, err := m.root.OpenFile(replicaMarksFile, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return fmt.Errorf("open %s in %s: %w", replicaMarksFile, m.root.Name(), err)
		}
		m.app = f
	}
	if _, err := m.app.WriteString(lines); err != nil {
		return fmt.Errorf("append to %s in %s: %w", replicaMarksFile, m.root.Name(), err)
	}
	if err := tidseg.Fdatasync(m.app); err != nil {
		return fmt.Errorf("fdatasync %s in %s: %w", replicaMarksFile, m.root.Name(), err)
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
// durably; the next mark is appended to the new file.
func (m *replicaMarks) writeLocked() error {
	ids := make([]string, 0, len(m.ids))
	for id := range m.ids {
		ids = append(ids, id+"\n")
	}
	slices.Sort(ids)
	m.closeAppendLocked() // it would append to the file being replaced
	if err := atomicfile.WriteFileIn(m.root, replicaMarksFile, []byte(strings.Join(ids, "")), 0o640); err != nil {
		m.rewrite = true
		return err
	}
	m.rewrite = false
	return nil
}

func (m *replicaMarks) closeAppendLocked() {
	if m.app != nil {
		_ = m.app.Close() // every append was fdatasynced
		m.app = nil
	}
}

// close closes the file open for appends, if any.
func (m *replicaMarks) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closeAppendLocked()
}

// remove forgets the mark of id: the replica moved to another broker and
// its data here is removed (moves.go).
func (m *replicaMarks) remove(id shardmap.ShardID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := id.String()
	if !m.ids[key] {
		return nil
	}
	delete(m.ids, key)
	return m.writeLocked()
}
