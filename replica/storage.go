package replica

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	tidwall "github.com/tidwall/wal"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/felix-broker/felix/internal/atomicfile"
	"github.com/felix-broker/felix/internal/tidseg"
	"github.com/felix-broker/felix/wal"
)

// Stored entry format, one raft entry in one tidwall entry at the same
// index (all integers little endian):
//
//	crc32c  uint32  Castagnoli, over the entry's index (8 bytes, not stored) then every byte after it
//	type    byte    raftpb.EntryType
//	term    uint64
//	data    the entry's Data to the end (a batch for a normal entry, see codec.go)
//
// These are the fields of a raftpb.Entry, with one checksum over all of
// them: raft needs the term of every entry (Storage.Term), and an entry is
// always written and read whole, so a checksum per record inside it would
// only repeat this one. Folding the index into the checksum catches an
// entry found at the wrong index.
const entryFixed = 4 + 1 + 8

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// storage is one replica's raft log and state on disk: it implements
// raft.Storage for the group's RawNode. Its fields are owned by the group's
// goroutine; only readEntry is called by readers too, under readMu, and
// files is used by Readers (its own lock).
type storage struct {
	dir, name string
	logger    *slog.Logger
	segSize   int
	tw        *tidwall.Log
	// readMu serializes reads of tw, and guards tw for the readers while
	// the group's goroutine replaces or closes it: tidwall changes its
	// segment cache under its read lock, so two concurrent Reads can
	// panic (tidwall/wal#34; package wal serializes its reads alike).
	readMu sync.Mutex
	// files keeps open the segment files Readers read by position
	// (reader.go): two, closed when the log's files are rewritten
	// (truncations, compactions, a snapshot install) and on close.
	files tidseg.Files
	// closed is set once close begins: Readers read through readEntry
	// then, which says so.
	closed atomic.Bool
	tail   struct {
		f     *os.File // the last segment, opened to fdatasync it (and preallocate it)
		index uint64   // its first index
		size  int64
		pad   tidseg.Padding // zeros written ahead of tidwall's writes
		// presize gives a new tail's tidwall cache its room at once
		// when the log fills its segments fast (tidseg.Presizer).
		presize tidseg.Presizer
	}
	st    *stateFile
	p     persistent // last state written
	last  uint64     // last index held; first is p.snapIndex+1
	terms []termRun  // covering (p.snapIndex, last]
	batch tidwall.Batch
	buf   []byte
	// bytes is the size of the segment files, for Group.Size (read by
	// any goroutine).
	bytes atomic.Int64

	beforeSync         func(last uint64) error         // Knobs.BeforeSync
	onSync             func(time.Duration, int, int64) // Config.OnSync
	afterSnapshotState func() error                    // Knobs.AfterSnapshotState

	// Parking fdatasyncs while the process's logs are busy (Config.SyncGroup):
	// this replica's membership, busy from an append until a round of its
	// group's goroutine that appends nothing (settle); whether this round
	// appended; its parked syncer, made on first use.
	member   wal.SyncMember
	appended bool
	parker   tidseg.Parker
}

// termRun says entries from index on have term, up to the next run.
type termRun struct{ index, term uint64 }

// openStorage opens or creates the log in dir. voters is the group's
// configuration for a new log; an existing one keeps its own.
func openStorage(dir, name string, voters []uint64, segSize int, logger *slog.Logger) (*storage, error) {
	if err := atomicfile.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("replica: group %q: create dir: %w", name, err)
	}
	st, p, _, err := openState(dir, persistent{conf: &pb.ConfState{Voters: voters}})
	if err != nil {
		return nil, err
	}
	s := &storage{dir: dir, name: name, logger: logger, segSize: segSize, st: st, p: p}
	s.files.Init(dir, tidseg.OSFile)
	if err := s.open(); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *storage) open() error {
	if err := repairTail(s.dir, s.name, s.segSize, s.p.snapIndex, max(s.p.commit, s.p.synced), s.logger); err != nil {
		return err
	}
	tw, err := tidwall.Open(s.dir, tidseg.Options(s.segSize))
	if err != nil {
		return fmt.Errorf("replica: group %q: open log %q: %w", s.name, s.dir, err)
	}
	s.tw = tw
	// tidwall creates the first segment of a new log: without a sync of
	// the directory, a power loss before the segment rolls empties the
	// log, whose state file still holds the term and vote (and the
	// replica then answers as one that never had the entries it acked).
	if err := tidseg.SyncDir(s.dir); err != nil {
		return fmt.Errorf("replica: group %q: %w", s.name, err)
	}
	if err := s.reconcile(); err != nil {
		return err
	}
	if s.last < s.p.commit {
		return fmt.Errorf("replica: group %q: %w: log ends at index %d, below the committed index %d", s.name, ErrCorrupt, s.last, s.p.commit)
	}
	if s.last < s.p.synced && s.p.synced > s.p.snapIndex {
		return fmt.Errorf("replica: group %q: %w: log ends at index %d, below index %d, which it had written and synced", s.name, ErrCorrupt, s.last, s.p.synced)
	}
	for i := s.p.snapIndex + 1; i <= s.last; i++ {
		typ, term, _, err := s.readEntry(i)
		if err != nil {
			return err
		}
		if typ != pb.EntryNormal && typ != pb.EntryConfChange && typ != pb.EntryConfChangeV2 {
			return fmt.Errorf("replica: group %q: %w: entry %d has type %d", s.name, ErrCorrupt, i, typ)
		}
		s.noteTerm(i, term)
	}
	return s.findTail()
}

// findTail opens the last segment file, the one append fdatasyncs.
func (s *storage) findTail() error {
	segs, _, err := tidseg.List(s.dir)
	if err != nil {
		return fmt.Errorf("replica: group %q: %w", s.name, err)
	}
	if len(segs) == 0 {
		return fmt.Errorf("replica: group %q: no segment in %q", s.name, s.dir)
	}
	last := segs[len(segs)-1]
	f, err := os.OpenFile(last.Path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("replica: group %q: open tail segment: %w", s.name, err)
	}
	if s.tail.f != nil {
		_ = s.tail.f.Close()
	}
	// Never preallocated yet: the zeros of the tail before were cut
	// (unpad) before anything that reopens it.
	s.tail.f, s.tail.index, s.tail.size, s.tail.pad = f, last.Index, last.Size, tidseg.Padding{}
	s.bytes.Store(tidseg.Total(segs))
	return nil
}

// dataSegments lists the log's segment files, the tail's size without
// the zeros preallocated after its entries (what retention counts), and
// whether a truncation of tidwall's is pending.
func (s *storage) dataSegments() ([]tidseg.Segment, bool, error) {
	segs, pending, err := tidseg.List(s.dir)
	return s.tail.pad.Unpad(segs, s.tail.index, s.tail.size), pending, err
}

func (s *storage) noteTerm(index, term uint64) {
	if n := len(s.terms); n == 0 || s.terms[n-1].term != term {
		s.terms = append(s.terms, termRun{index, term})
	}
}

// append writes ents (consecutive, from raft's Ready) and fdatasyncs them.
// Entries at or after the first one's index are dropped first: raft sends
// a suffix that conflicts with an uncommitted one of ours.
func (s *storage) append(ents []*pb.Entry) error {
	if len(ents) == 0 {
		return nil
	}
	first := ents[0].GetIndex()
	if first <= s.p.commit || first > s.last+1 || first <= s.p.snapIndex {
		return fmt.Errorf("replica: group %q: append at index %d: log holds (%d, %d], committed %d", s.name, first, s.p.snapIndex, s.last, s.p.commit)
	}
	if first <= s.last {
		if err := s.truncate(first - 1); err != nil {
			return err
		}
	}
	s.member.SetBusy(true)
	s.appended = true
	if err := s.write(first, ents); err != nil {
		if cerr := s.cutFailed(first); cerr != nil {
			err = fmt.Errorf("%w; cutting them back out of the segment files failed too (reopened, the log may show entries its disk does not hold): %v", err, cerr)
		}
		return err
	}
	for _, e := range ents {
		s.noteTerm(e.GetIndex(), e.GetTerm())
	}
	s.last = ents[len(ents)-1].GetIndex()
	s.p.synced = s.last // written with the next state (setState)
	return nil
}

// write writes ents (the first at index first) and fdatasyncs them.
func (s *storage) write(first uint64, ents []*pb.Entry) error {
	s.batch.Clear()
	sizes := make([]int, 0, len(ents))
	records := 0 // for OnSync: the records of the batches among ents
	for _, e := range ents {
		if s.onSync != nil && e.GetType() == pb.EntryNormal && len(e.GetData()) > 0 {
			if h, _, err := decodeBatchHeader(e.GetData()); err == nil {
				records += h.count
			}
		}
		s.buf = encodeEntry(s.buf[:0], e)
		s.batch.Write(e.GetIndex(), s.buf)
		sizes = append(sizes, tidseg.EntrySize(len(s.buf)))
	}
	if err := s.tail.pad.Extend(s.tail.f, s.tail.size, int64(s.segSize), sizes); err != nil {
		return fmt.Errorf("replica: group %q: preallocate the tail segment: %w", s.name, err)
	}
	writeStart := time.Now() // OnSync's duration: the write and the fdatasync, as wal's Commit.Sync
	if err := s.tw.WriteBatch(&s.batch); err != nil {
		return fmt.Errorf("replica: group %q: write entries %d-%d: %w", s.name, first, first+uint64(len(ents))-1, err)
	}
	// Follow tidwall's segment roll: only the final tail needs our sync.
	rolled, size, written := tidseg.FollowRoll(s.tail.size, int64(s.segSize), first, sizes)
	s.bytes.Add(written)
	if rolled != 0 {
		// The segment tidwall left ends with its last entry, not zeros.
		oldEnd, _ := tidseg.TailEnd(s.tail.size, int64(s.segSize), sizes)
		if err := s.unpad(oldEnd); err != nil {
			return err
		}
		if err := s.findTail(); err != nil {
			return err
		}
		if s.tail.index != rolled {
			return fmt.Errorf("replica: group %q: tail segment starts at %d, expected %d", s.name, s.tail.index, rolled)
		}
		if err := tidseg.SyncDir(s.dir); err != nil { // the new segment's name must survive a crash
			return fmt.Errorf("replica: group %q: %w", s.name, err)
		}
		s.tail.presize.Roll(time.Now(), s.tw, s.segSize, &s.readMu)
	}
	s.tail.size = size
	if s.beforeSync != nil {
		if err := s.beforeSync(ents[len(ents)-1].GetIndex()); err != nil {
			return fmt.Errorf("replica: group %q: fdatasync entries %d-%d: %w", s.name, first, first+uint64(len(ents))-1, err)
		}
	}
	if err := s.fdatasync(); err != nil {
		return fmt.Errorf("replica: group %q: fdatasync entries %d-%d: %w", s.name, first, first+uint64(len(ents))-1, err)
	}
	if s.onSync != nil {
		s.onSync(time.Since(writeStart), records, written)
	}
	return nil
}

// cutFailed takes the entries of a failed append (from index first on)
// back out of the segment files, as wal's Log does with a failed batch:
// a failed fdatasync leaves them in the page cache, marked clean, where
// the replica reopened after a restart would read them as written and
// count them towards a commit its disk may not hold. None was
// acknowledged: the group fails with the append's error.
func (s *storage) cutFailed(first uint64) error {
	last, err := s.tw.LastIndex()
	if err != nil {
		return err
	}
	if last < first {
		return nil // none of them indexed
	}
	s.files.Drop(false) // tidwall rewrites the segment holding first-1
	if err := s.tw.TruncateBack(first - 1); err != nil {
		return err
	}
	if err := tidseg.SyncDir(s.dir); err != nil {
		return err
	}
	return s.findTail()
}

// fdatasync syncs the tail segment: parked while the sync group says so
// (many of the process's logs busy), otherwise blocking with the
// goroutine's P handed to the rest of the process (a leader's fsync runs
// while the broker reads its followers' answers and serves other groups;
// see tidseg.FdatasyncHandOff).
func (s *storage) fdatasync() error {
	if !s.member.Park() {
		return tidseg.FdatasyncHandOff(s.tail.f)
	}
	s.member.Parking()
	return s.parker.Fdatasync(s.tail.f)
}

// settle ends a round of the group's goroutine: a replica that appended
// nothing in it is idle in its sync group.
func (s *storage) settle() {
	if !s.appended {
		s.member.SetBusy(false)
	}
	s.appended = false
}

// unpad cuts the zeros written ahead of the tail's data, whose entries
// end at size: before tidwall rewrites or reopens the tail, and when it
// leaves it.
func (s *storage) unpad(size int64) error {
	if s.tail.f == nil {
		return nil
	}
	err := s.tail.pad.Cut(s.tail.f, size)
	if errors.Is(err, tidseg.ErrNotZeros) {
		// The count of the tail's bytes is wrong: cutting nothing is
		// safe (zeros after an older segment's entries are harmless).
		s.logger.Error("replica: lost track of the tail segment's end; its preallocated zeros are left", "group", s.name, "err", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("replica: group %q: cut the preallocated zeros of the tail segment: %w", s.name, err)
	}
	return nil
}

// truncate drops the entries after index, which are not committed.
func (s *storage) truncate(index uint64) error {
	if s.p.synced > index {
		// Lowered first: a stop after the cut must not find the log
		// ending below what the state says was durable (state.go).
		s.p.synced = index
		if err := s.st.write(&s.p, false); err != nil {
			return fmt.Errorf("replica: group %q: %w", s.name, err)
		}
	}
	if err := s.unpad(s.tail.size); err != nil {
		return err
	}
	if err := s.tw.TruncateBack(index); err != nil {
		return fmt.Errorf("replica: group %q: drop entries after %d: %w", s.name, index, err)
	}
	s.files.Drop(false) // tidwall rewrote the tail segment
	if err := tidseg.SyncDir(s.dir); err != nil {
		return fmt.Errorf("replica: group %q: %w", s.name, err)
	}
	s.last = index
	k := sort.Search(len(s.terms), func(k int) bool { return s.terms[k].index > index })
	s.terms = s.terms[:k]
	return s.findTail()
}

func encodeEntry(dst []byte, e *pb.Entry) []byte {
	dst = append(dst, 0, 0, 0, 0, byte(e.GetType()))
	dst = binary.LittleEndian.AppendUint64(dst, e.GetTerm())
	dst = append(dst, e.GetData()...)
	binary.LittleEndian.PutUint32(dst, entryCRC(e.GetIndex(), dst[4:]))
	return dst
}

func entryCRC(index uint64, rest []byte) uint32 {
	var ib [8]byte
	binary.LittleEndian.PutUint64(ib[:], index)
	return crc32.Update(crc32.Checksum(ib[:], castagnoli), castagnoli, rest)
}

// decodeEntry checks a stored entry that must hold index.
func decodeEntry(b []byte, index uint64) (typ pb.EntryType, term uint64, data []byte, ok bool) {
	if len(b) < entryFixed || entryCRC(index, b[4:]) != binary.LittleEndian.Uint32(b) {
		return 0, 0, nil, false
	}
	return pb.EntryType(b[4]), binary.LittleEndian.Uint64(b[5:]), b[entryFixed:], true
}

// readEntry reads entry index from disk. Safe for concurrent use. An entry
// the log no longer holds at its front (retention or a snapshot dropped it
// after the caller found it) is ErrOutOfRange.
func (s *storage) readEntry(index uint64) (pb.EntryType, uint64, []byte, error) {
	s.readMu.Lock()
	var b []byte
	err := ErrClosed
	dropped := false
	if s.tw != nil {
		b, err = tidseg.Read(s.tw, index)
		if errors.Is(err, tidwall.ErrNotFound) {
			first, ferr := s.tw.FirstIndex()
			dropped = ferr == nil && index < first
		}
	}
	s.readMu.Unlock()
	if dropped { // retention or a snapshot dropped it while a reader held its place
		return 0, 0, nil, fmt.Errorf("replica: group %q: read entry %d: %w: the log now starts after it", s.name, index, ErrOutOfRange)
	}
	if errors.Is(err, tidwall.ErrCorrupt) { // a segment that does not parse
		return 0, 0, nil, fmt.Errorf("replica: group %q: read entry %d: %w: %w", s.name, index, ErrCorrupt, err)
	}
	if err != nil {
		return 0, 0, nil, fmt.Errorf("replica: group %q: read entry %d: %w", s.name, index, err)
	}
	typ, term, data, ok := decodeEntry(b, index)
	if !ok {
		return 0, 0, nil, fmt.Errorf("replica: group %q: entry %d: %w: checksum mismatch", s.name, index, ErrCorrupt)
	}
	return typ, term, data, nil
}

// diskEntries is the storage as Group.Read's entrySource: it keeps
// nothing between reads.
type diskEntries struct{ s *storage }

func (diskEntries) held(uint64) []wal.Record { return nil }

func (d diskEntries) readEntry(index uint64) (pb.EntryType, []byte, error) {
	typ, _, data, err := d.s.readEntry(index)
	return typ, data, err
}

func (diskEntries) decoded(uint64, []wal.Record) {}

// setState records hs and cs (either may be nil: unchanged), durably if sync.
func (s *storage) setState(hs *pb.HardState, cs *pb.ConfState, sync bool) error {
	if hs != nil {
		s.p.term, s.p.vote, s.p.commit = hs.GetTerm(), hs.GetVote(), hs.GetCommit()
	}
	if cs != nil {
		s.p.conf = proto.Clone(cs).(*pb.ConfState)
	}
	if err := s.st.write(&s.p, sync); err != nil {
		return fmt.Errorf("replica: group %q: %w", s.name, err)
	}
	return nil
}

// InitialState implements raft.Storage.
func (s *storage) InitialState() (*pb.HardState, *pb.ConfState, error) {
	hs := &pb.HardState{Term: new(s.p.term), Vote: new(s.p.vote), Commit: new(s.p.commit)}
	return hs, proto.Clone(s.p.conf).(*pb.ConfState), nil
}

// Entries implements raft.Storage.
func (s *storage) Entries(lo, hi, maxSize uint64) ([]*pb.Entry, error) {
	if lo <= s.p.snapIndex {
		return nil, raft.ErrCompacted
	}
	if hi > s.last+1 || lo > hi {
		return nil, raft.ErrUnavailable
	}
	var out []*pb.Entry
	var size uint64
	for i := lo; i < hi; i++ {
		typ, term, data, err := s.readEntry(i)
		if err != nil {
			return nil, err
		}
		e := &pb.Entry{Index: new(i), Term: new(term), Type: typ.Enum(), Data: data}
		if size += uint64(proto.Size(e)); len(out) > 0 && size > maxSize {
			break
		}
		out = append(out, e)
	}
	return out, nil
}

// Term implements raft.Storage.
func (s *storage) Term(i uint64) (uint64, error) {
	switch {
	case i == s.p.snapIndex:
		return s.p.snapTerm, nil
	case i < s.p.snapIndex:
		return 0, raft.ErrCompacted
	case i > s.last:
		return 0, raft.ErrUnavailable
	}
	k := sort.Search(len(s.terms), func(k int) bool { return s.terms[k].index > i })
	return s.terms[k-1].term, nil
}

// LastIndex implements raft.Storage.
func (s *storage) LastIndex() (uint64, error) { return s.last, nil }

// FirstIndex implements raft.Storage.
func (s *storage) FirstIndex() (uint64, error) { return s.p.snapIndex + 1, nil }

func (s *storage) close() error {
	s.closed.Store(true)
	var errs []error
	errs = append(errs, s.unpad(s.tail.size))
	s.readMu.Lock()
	if s.tw != nil {
		errs = append(errs, s.tw.Close())
		s.tw = nil
	}
	s.readMu.Unlock()
	s.files.Drop(true)
	if s.tail.f != nil {
		errs = append(errs, s.tail.f.Close())
	}
	errs = append(errs, s.st.close())
	errs = append(errs, s.parker.Close())
	s.member.SetBusy(false)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("replica: group %q: close storage: %w", s.name, err)
	}
	return nil
}
