package replica

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/felix-broker/felix/internal/atomicfile"
	"github.com/felix-broker/felix/internal/tidseg"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The state file holds what raft must find again after a restart besides
// the log: the HardState (term, vote, commit), the ConfState (voters and
// learners) as of the compaction point (the configuration at creation:
// later changes are entries of the log, which raft replays on open) and
// the compaction point (the index and term of the last entry
// dropped from the front of the log, and the offset that follows it).
//
// It is a double buffer: two slots of stateSlot bytes, each
//
//	crc32c  uint32  Castagnoli, over every byte after it up to length's end
//	length  uint32  bytes of body
//	seq     uint64  incremented on every write; the valid slot with the higher one wins
//	body    term, vote, commit, snapIndex, snapTerm, snapNext (uint64 each), ConfState (protobuf),
//	        then synced as protobuf field syncedField (varint), which a
//	        ConfState decoder keeps as an unknown field: a state without it
//	        (written before it was kept) reads as synced 0
//
// synced is the last index this replica appended and fdatasynced (and so
// may have acknowledged to a leader), written with the commit index
// after each append, without a sync of its own: it is never above what
// was durable. Open refuses a log whose intact entries end below it, as
// below the commit index (repair.go): an entry there is damaged, not torn
// by a crash, and raft may have counted it. It is lowered, written first,
// before a suffix raft replaces is cut.
//
// A durable write (term or vote changed, or the ConfState) goes to the slot
// that does not hold the last durable state, then fdatasyncs: a torn write
// leaves the other slot, the previous durable state, intact. A write that
// need not be durable (only commit moved: raft recomputes commit after a
// restart, as etcd does when Ready.MustSync is false) goes to that same
// spare slot without a sync, so it never overwrites the last durable state
// either. The file is created whole with fsync and an atomic rename.
const (
	// syncedField is the protobuf field number that carries synced after
	// the ConfState's fields: far above any ConfState has.
	syncedField protowire.Number = 1000

	stateFileName = "raftstate"
	stateSlot     = 4096
	stateFixed    = 4 + 4 + 8
)

// persistent is the content of the state file.
type persistent struct {
	term, vote, commit uint64
	synced             uint64 // last index appended and fdatasynced (see above)
	snapIndex          uint64 // last index dropped from the log's front; 0 if none
	snapTerm           uint64 // its term
	snapNext           uint64 // the first offset after it
	conf               *pb.ConfState
}

type stateFile struct {
	f       *os.File
	seq     uint64
	durable int // slot holding the last durable state
	buf     []byte
}

func (p *persistent) encode(dst []byte, seq uint64) ([]byte, error) {
	cs, err := proto.Marshal(p.conf)
	if err != nil {
		return nil, fmt.Errorf("marshal conf state: %w", err)
	}
	dst = append(dst[:0], make([]byte, stateFixed)...)
	for _, v := range []uint64{p.term, p.vote, p.commit, p.snapIndex, p.snapTerm, p.snapNext} {
		dst = binary.LittleEndian.AppendUint64(dst, v)
	}
	dst = append(dst, cs...)
	dst = protowire.AppendTag(dst, syncedField, protowire.VarintType)
	dst = protowire.AppendVarint(dst, p.synced)
	if len(dst) > stateSlot {
		return nil, fmt.Errorf("state of %d bytes does not fit a %d-byte slot", len(dst), stateSlot)
	}
	binary.LittleEndian.PutUint32(dst[4:], uint32(len(dst)-stateFixed))
	binary.LittleEndian.PutUint64(dst[8:], seq)
	binary.LittleEndian.PutUint32(dst, crc32.Checksum(dst[4:], castagnoli))
	return dst, nil
}

// decodeSlot returns the state in one slot, or ok false if the slot does not
// hold a complete, checksummed state.
func decodeSlot(b []byte) (p persistent, seq uint64, ok bool) {
	if len(b) < stateFixed {
		return p, 0, false
	}
	n := int(binary.LittleEndian.Uint32(b[4:]))
	if n < 48 || n > len(b)-stateFixed || crc32.Checksum(b[4:stateFixed+n], castagnoli) != binary.LittleEndian.Uint32(b) {
		return p, 0, false
	}
	seq = binary.LittleEndian.Uint64(b[8:])
	body := b[stateFixed : stateFixed+n]
	v := func(i int) uint64 { return binary.LittleEndian.Uint64(body[8*i:]) }
	p = persistent{term: v(0), vote: v(1), commit: v(2), snapIndex: v(3), snapTerm: v(4), snapNext: v(5), conf: &pb.ConfState{}}
	if err := proto.Unmarshal(body[48:], p.conf); err != nil {
		return p, 0, false
	}
	// synced rides in the ConfState's unknown fields; not kept there.
	p.conf.ProtoReflect().SetUnknown(nil)
	for b := body[48:]; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		b = b[n:]
		if num == syncedField && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return p, 0, false
			}
			p.synced = v
			b = b[n:]
			continue
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			break
		}
		b = b[n:]
	}
	return p, seq, true
}

// openState reads the state file in dir; if there is none it creates one
// holding initial. created reports which.
// HasState reports whether dir holds a replica's state: false for a
// replica never opened there (or whose directory was emptied).
func HasState(dir string) (bool, error) {
	_, err := os.Stat(filepath.Join(dir, stateFileName))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	}
	return false, fmt.Errorf("replica: %w", err)
}

func openState(dir string, initial persistent) (*stateFile, persistent, bool, error) {
	path := filepath.Join(dir, stateFileName)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		s, err := createState(dir, initial)
		return s, initial, true, err
	}
	if err != nil {
		return nil, persistent{}, false, fmt.Errorf("replica: open state %q: %w", path, err)
	}
	// A file cut short (damage: it is created whole) keeps what its
	// slots still hold; one with no valid slot left is ErrCorrupt below.
	b := make([]byte, 2*stateSlot)
	if _, err := io.ReadFull(f, b); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		_ = f.Close()
		return nil, persistent{}, false, fmt.Errorf("replica: read state %q: %w", path, err)
	}
	s := &stateFile{f: f, durable: -1}
	var best persistent
	for i := range 2 {
		p, seq, ok := decodeSlot(b[i*stateSlot : (i+1)*stateSlot])
		if ok && (s.durable < 0 || seq > s.seq) {
			best, s.seq, s.durable = p, seq, i
		}
	}
	if s.durable < 0 {
		_ = f.Close()
		return nil, persistent{}, false, fmt.Errorf("replica: state %q: %w: neither slot holds a valid state", path, ErrCorrupt)
	}
	// The slot read may not be durable yet (a write without sync): make it so.
	if err := tidseg.Fdatasync(f); err != nil {
		_ = f.Close()
		return nil, persistent{}, false, fmt.Errorf("replica: sync state %q: %w", path, err)
	}
	return s, best, false, nil
}

func createState(dir string, initial persistent) (*stateFile, error) {
	path := filepath.Join(dir, stateFileName)
	b, err := initial.encode(nil, 1)
	if err != nil {
		return nil, fmt.Errorf("replica: create state %q: %w", path, err)
	}
	b = append(b, make([]byte, 2*stateSlot-len(b))...)
	if err := atomicfile.WriteFile(path, b, 0o640); err != nil {
		return nil, fmt.Errorf("replica: create state %q: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("replica: open state %q: %w", path, err)
	}
	return &stateFile{f: f, seq: 1, durable: 0}, nil
}

// write stores p, durably if sync.
func (s *stateFile) write(p *persistent, sync bool) error {
	var err error
	s.seq++
	if s.buf, err = p.encode(s.buf, s.seq); err != nil {
		return err
	}
	spare := 1 - s.durable
	if _, err := s.f.WriteAt(s.buf, int64(spare*stateSlot)); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	if sync {
		if err := tidseg.Fdatasync(s.f); err != nil {
			return fmt.Errorf("sync state: %w", err)
		}
		s.durable = spare
	}
	return nil
}

func (s *stateFile) close() error {
	err := tidseg.Fdatasync(s.f)
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	return err
}
