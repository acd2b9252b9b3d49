package replica

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	tidwall "github.com/tidwall/wal"
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/felix-broker/felix/internal/tidseg"
)

// # Compaction and snapshots
//
// Retention (retention.go) drops whole segments from the front of the
// log: compact records the new compaction point in the state file
// (durably: snapIndex, its term, the offset after it and the
// configuration as of it), then has tidwall drop the entries before it.
// A crash between the two leaves a log that starts before the state's
// compaction point; reconcile, at open, finishes the truncation.
//
// A follower (or a joining replica) that needs entries the leader has
// dropped gets a snapshot. The log is the state machine, and the records
// before the compaction point are gone on purpose, so a snapshot carries
// no records: only the point it stands for (index, term, configuration),
// the offset of the first record after it and the owner's state as of the
// leader's last applied entry (snapshotData; the broker's idempotent
// producers, Config.SnapshotState). The
// follower installs it by dropping its whole log (installSnapshot):
// durably the new state first (compaction point and commit at the
// snapshot's index), then an empty log that starts right after it. A
// crash between the two leaves the old log: reconcile drops what lies at
// or before the compaction point and keeps what follows it, which is
// uncommitted (raft restores a snapshot only beyond its commit index) and
// which raft replaces, since it cannot match the leader's entries after
// the snapshot's index. The old log's tail may still end in the zeros
// preallocated after its entries (or in a torn entry): with the commit at
// the compaction point the log owes no entry, so the repair at open cuts
// them (repairTail) rather than refusing a log that ends below the
// committed index.

// Snapshot data versions, its first byte. Version 1 is the offset alone;
// version 2 adds the owner's state (Config.SnapshotState). A snapshot
// without owner state is written as version 1, which every release reads.
const (
	snapshotV1 = 1
	snapshotV2 = 2
)

// snapshotData is the data of a snapshot: the version byte, the offset of
// the first record after the snapshot's index (uint64, little endian),
// then (version 2) the owner's state.
func snapshotData(next uint64, state []byte) []byte {
	if len(state) == 0 {
		return binary.LittleEndian.AppendUint64([]byte{snapshotV1}, next)
	}
	b := make([]byte, 0, 9+len(state))
	b = binary.LittleEndian.AppendUint64(append(b, snapshotV2), next)
	return append(b, state...)
}

// decodeSnapshotData returns the offset and the owner's state (nil if
// none) a snapshot's data carries. state aliases b.
func decodeSnapshotData(b []byte) (next uint64, state []byte, err error) {
	switch {
	case len(b) == 9 && b[0] == snapshotV1:
	case len(b) > 9 && b[0] == snapshotV2:
		state = b[9:]
	default:
		return 0, nil, fmt.Errorf("snapshot data of %d bytes is neither version %d's 9 nor version %d's more", len(b), snapshotV1, snapshotV2)
	}
	return binary.LittleEndian.Uint64(b[1:9]), state, nil
}

// reconcile brings the log opened in s.tw in line with the compaction
// point of the state file, and sets s.last.
func (s *storage) reconcile() error {
	first, err := s.tw.FirstIndex()
	if err == nil {
		s.last, err = s.tw.LastIndex()
	}
	if err != nil {
		return fmt.Errorf("replica: group %q: log bounds: %w", s.name, err)
	}
	want := s.p.snapIndex + 1
	switch {
	case first == want:
	case s.last < first || s.last < want:
		// Empty (a new log starts at 1), or wholly before the compaction
		// point (a snapshot install stopped half-way): start afresh
		// right after it.
		if err := s.resetLog(want); err != nil {
			return err
		}
	case first > want:
		return fmt.Errorf("replica: group %q: %w: log starts at index %d, state expects %d", s.name, ErrCorrupt, first, want)
	default:
		// A compaction (or install) whose state was written before the
		// process stopped: drop what it dropped.
		s.logger.Warn("replica: finishing a compaction interrupted by a stop", "group", s.name, "from", first, "to", want)
		if err := s.truncateFront(want); err != nil {
			return err
		}
		if err := tidseg.SyncDir(s.dir); err != nil {
			return fmt.Errorf("replica: group %q: %w", s.name, err)
		}
	}
	return nil
}

// resetLog replaces the log with an empty one whose first index is
// index.
func (s *storage) resetLog(index uint64) error {
	if err := s.unpad(s.tail.size); err != nil {
		return err
	}
	// Readers wait meanwhile (readMu): none reads a closed log, nor
	// the files between.
	s.readMu.Lock()
	defer s.readMu.Unlock()
	if err := s.tw.Close(); err != nil {
		return fmt.Errorf("replica: group %q: close log: %w", s.name, err)
	}
	s.tw = nil
	if err := tidseg.Reset(s.dir, index); err != nil {
		return fmt.Errorf("replica: group %q: %w", s.name, err)
	}
	tw, err := tidwall.Open(s.dir, tidseg.Options(s.segSize))
	if err != nil {
		return fmt.Errorf("replica: group %q: open log %q: %w", s.name, s.dir, err)
	}
	s.tw, s.last = tw, index-1
	s.files.Drop(false)
	return nil
}

// compact drops the entries before cut, which must be a committed index
// of this log (or one past its last), with next the offset of the first
// record at or after cut and conf the configuration as of cut-1.
func (s *storage) compact(cut, next uint64, conf *pb.ConfState) error {
	if cut <= s.p.snapIndex+1 {
		return nil
	}
	if cut > s.p.commit+1 || cut > s.last+1 {
		return fmt.Errorf("replica: group %q: compaction to %d: log holds (%d, %d], committed %d", s.name, cut, s.p.snapIndex, s.last, s.p.commit)
	}
	term, err := s.Term(cut - 1)
	if err != nil {
		return fmt.Errorf("replica: group %q: compaction to %d: %w", s.name, cut, err)
	}
	s.p.snapIndex, s.p.snapTerm, s.p.snapNext = cut-1, term, next
	s.p.conf = cloneConf(conf)
	if err := s.st.write(&s.p, true); err != nil {
		return fmt.Errorf("replica: group %q: %w", s.name, err)
	}
	if err := s.unpad(s.tail.size); err != nil {
		return err
	}
	if err := s.truncateFront(cut); err != nil {
		return err
	}
	if err := tidseg.SyncDir(s.dir); err != nil {
		return fmt.Errorf("replica: group %q: %w", s.name, err)
	}
	s.dropTermsBefore(cut)
	return s.findTail() // tidwall rewrote the first segment it kept
}

// truncateFront drops the entries before cut (tidwall's TruncateFront),
// keeping the last-write time of the segment that holds cut, which
// tidwall rewrites into a new file: age retention reads that time as
// when this replica wrote the segment's records (see retain), and a
// rewrite stamped now would hold every segment behind it for another
// full RetentionAge.
func (s *storage) truncateFront(cut uint64) error {
	var written time.Time
	if segs, _, err := tidseg.List(s.dir); err == nil {
		for _, seg := range segs {
			if seg.Index > cut {
				break
			}
			if fi, err := os.Stat(seg.Path); err == nil {
				written = fi.ModTime()
			}
		}
	}
	if err := tidseg.TruncateFront(s.tw, cut); err != nil {
		return fmt.Errorf("replica: group %q: drop entries before %d: %w", s.name, cut, err)
	}
	s.files.Drop(false) // tidwall removed segments and rewrote the one holding cut
	if !written.IsZero() {
		// Unchanged atime (the zero time); a failure only keeps the
		// segment longer.
		if err := os.Chtimes(filepath.Join(s.dir, tidseg.Name(cut)), time.Time{}, written); err != nil {
			s.logger.Warn("replica: could not keep the last-write time of the segment truncation rewrote; age retention keeps it longer", "group", s.name, "err", err)
		}
	}
	return nil
}

// installSnapshot replaces the log with snap's compaction point: every
// entry is dropped, and the log goes on after snap's index.
func (s *storage) installSnapshot(snap *pb.Snapshot, next uint64) error {
	md := snap.GetMetadata()
	index := md.GetIndex()
	if index <= s.p.commit {
		return fmt.Errorf("replica: group %q: snapshot at %d, not beyond the committed index %d", s.name, index, s.p.commit)
	}
	if s.last > s.p.commit && s.p.commit > s.p.snapIndex {
		// What follows the commit index is not committed: drop it first,
		// so that a stop before the new log is in place leaves nothing
		// after the snapshot's index that another leader wrote.
		if err := s.truncate(s.p.commit); err != nil {
			return err
		}
	}
	s.p.snapIndex, s.p.snapTerm, s.p.snapNext = index, md.GetTerm(), next
	s.p.commit = max(s.p.commit, index)
	s.p.conf = cloneConf(md.GetConfState())
	if err := s.st.write(&s.p, true); err != nil {
		return fmt.Errorf("replica: group %q: %w", s.name, err)
	}
	if s.afterSnapshotState != nil {
		if err := s.afterSnapshotState(); err != nil {
			return fmt.Errorf("replica: group %q: install snapshot at %d: %w", s.name, index, err)
		}
	}
	if err := s.resetLog(index + 1); err != nil {
		return err
	}
	s.terms = nil
	return s.findTail()
}

// dropTermsBefore forgets the term runs of entries before index.
func (s *storage) dropTermsBefore(index uint64) {
	k := sort.Search(len(s.terms), func(k int) bool { return s.terms[k].index > index })
	if k == 0 {
		return
	}
	// terms[k-1] covers index: it now starts there.
	rest := append([]termRun{{index, s.terms[k-1].term}}, s.terms[k:]...)
	s.terms = rest
}
