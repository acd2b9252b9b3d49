package replica

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/felix-broker/felix/internal/linktest"
	"github.com/felix-broker/felix/internal/tidseg"
	"github.com/felix-broker/felix/wal"
)

func testEntry(index, term uint64, value string) *pb.Entry {
	data := appendBatchHeader(nil, batchHeader{proposer: 1, seq: index, ts: int64(index), count: 1})
	data = appendBatchRecord(data, &wal.Record{Value: []byte(value)})
	return &pb.Entry{Index: new(index), Term: new(term), Type: pb.EntryNormal.Enum(), Data: data}
}

func openTestStorage(t *testing.T, dir string) (*storage, error) {
	t.Helper()
	return openStorage(dir, "orders/0", []uint64{1, 2, 3}, 1024, slog.New(slog.DiscardHandler))
}

// writeEntries creates a log in dir with entries 1..n of term 1 and the
// given committed index.
func writeEntries(t *testing.T, dir string, n, commit uint64) {
	t.Helper()
	s, err := openTestStorage(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	var ents []*pb.Entry
	for i := uint64(1); i <= n; i++ {
		ents = append(ents, testEntry(i, 1, fmt.Sprintf("value-%03d-%s", i, make([]byte, 40))))
		if len(ents) == 3 || i == n {
			if err := s.append(ents); err != nil {
				t.Fatal(err)
			}
			ents = nil
		}
	}
	if err := s.setState(&pb.HardState{Term: new(uint64(1)), Vote: new(uint64(1)), Commit: new(commit)}, nil, true); err != nil {
		t.Fatal(err)
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
}

// setSynced rewrites the state in dir with synced as the last index
// appended and synced.
func setSynced(t *testing.T, dir string, synced uint64) {
	t.Helper()
	st, p, _, err := openState(dir, persistent{})
	if err != nil {
		t.Fatal(err)
	}
	p.synced = synced
	if err := st.write(&p, true); err != nil {
		t.Fatal(err)
	}
	if err := st.close(); err != nil {
		t.Fatal(err)
	}
}

// lastSegment returns the path of dir's last segment, its bytes, and where
// its last entry starts (before the zeros preallocated after the entries,
// if any).
func lastSegment(t *testing.T, dir string) (string, []byte, int) {
	t.Helper()
	segs, _, err := tidseg.List(dir)
	if err != nil || len(segs) < 2 {
		t.Fatalf("segments: %v %v (the test wants several)", segs, err)
	}
	path := segs[len(segs)-1].Path
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	at := 0
	for pos := 0; pos < len(data) && !tidseg.ZeroTail(data[pos:]); {
		size, h := binary.Uvarint(data[pos:])
		at, pos = pos, pos+h+int(size)
	}
	return path, data, at
}

func TestStorageRepairsTornTail(t *testing.T) {
	// synced is the last index the state says was appended and synced:
	// 29 for a tear of entry 30, whose append a crash interrupted.
	cases := []struct {
		name     string
		damage   func(data []byte, lastAt int) []byte
		commit   uint64
		synced   uint64
		wantLast uint64
		wantErr  error
	}{
		{"half an entry appended", func(d []byte, _ int) []byte { return append(d, 0x40, 1, 2, 3) }, 30, 30, 30, nil},
		{"last entry cut short", func(d []byte, at int) []byte { return d[:len(d)-5] }, 29, 29, 29, nil},
		{"bit flipped in the last entry", func(d []byte, at int) []byte { d[len(d)-3] ^= 0x10; return d }, 29, 29, 29, nil},
		{"torn entry below the committed index", func(d []byte, at int) []byte { return d[:len(d)-5] }, 30, 30, 0, ErrCorrupt},
		{"bit flipped in a committed entry before others", func(d []byte, at int) []byte { d[at-3] ^= 0x10; return d }, 30, 30, 0, ErrCorrupt},
		// Synced, so perhaps acknowledged to the leader: damage, not a
		// tear. It was cut as one, and a committed record could be lost
		// with the leader.
		{"bit flipped in the last entry, synced but not committed here", func(d []byte, at int) []byte { d[len(d)-3] ^= 0x10; return d }, 29, 30, 0, ErrCorrupt},
		{"last entry cut short, synced but not committed here", func(d []byte, at int) []byte { return d[:len(d)-5] }, 29, 30, 0, ErrCorrupt},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeEntries(t, dir, 30, tc.commit)
			setSynced(t, dir, tc.synced)
			path, data, at := lastSegment(t, dir)
			damaged := tc.damage(data, at)
			if err := os.WriteFile(path, damaged, 0o640); err != nil {
				t.Fatal(err)
			}
			s, err := openTestStorage(t, dir)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("open: %v, want %v", err, tc.wantErr)
				}
				// Damage below the committed index is not cut: the
				// directory set aside for inspection keeps every byte.
				if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, damaged) {
					t.Fatalf("the damaged segment was changed by the failed open (%d bytes, want %d; %v)", len(after), len(damaged), err)
				}
				return
			}
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			defer s.close()
			if last, _ := s.LastIndex(); last != tc.wantLast {
				t.Fatalf("last index %d after repair, want %d", last, tc.wantLast)
			}
			ents, err := s.Entries(1, tc.wantLast+1, 1<<30)
			if err != nil || uint64(len(ents)) != tc.wantLast {
				t.Fatalf("entries after repair: %d, %v", len(ents), err)
			}
			// The repaired log takes the next entry where the cut left it.
			if err := s.append([]*pb.Entry{testEntry(tc.wantLast+1, 2, "after")}); err != nil {
				t.Fatalf("append after repair: %v", err)
			}
		})
	}
}

func TestStorageReplacesUncommittedSuffix(t *testing.T) {
	dir := t.TempDir()
	writeEntries(t, dir, 30, 20)
	s, err := openTestStorage(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.append([]*pb.Entry{testEntry(21, 2, "new21"), testEntry(22, 2, "new22")}); err != nil {
		t.Fatal(err)
	}
	if err := s.append([]*pb.Entry{testEntry(20, 2, "x")}); err == nil {
		t.Fatal("append replaced a committed entry")
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	s, err = openTestStorage(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if last, _ := s.LastIndex(); last != 22 {
		t.Fatalf("last index %d, want 22", last)
	}
	for i, want := range map[uint64]uint64{0: 0, 1: 1, 20: 1, 21: 2, 22: 2} {
		if got, err := s.Term(i); err != nil || got != want {
			t.Fatalf("term of %d: %d %v, want %d", i, got, err, want)
		}
	}
	ents, err := s.Entries(21, 23, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	_, recs, err := decodeBatch(ents[1].GetData(), 0)
	if err != nil || string(recs[0].Value) != "new22" {
		t.Fatalf("entry 22 holds %v %v", recs, err)
	}
}

func TestStateFileKeepsLastDurableState(t *testing.T) {
	dir := t.TempDir()
	conf := &pb.ConfState{Voters: []uint64{1, 2, 3}}
	sf, p, created, err := openState(dir, persistent{conf: conf})
	if err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	p.term, p.vote = 5, 2
	if err := sf.write(&p, true); err != nil {
		t.Fatal(err)
	}
	durable := sf.durable
	p.commit = 9
	if err := sf.write(&p, false); err != nil {
		t.Fatal(err)
	}
	if err := sf.close(); err != nil {
		t.Fatal(err)
	}

	// Both slots intact: the newer (commit 9) wins.
	sf, got, _, err := openState(dir, persistent{})
	if err != nil {
		t.Fatal(err)
	}
	sf.close()
	if got.term != 5 || got.vote != 2 || got.commit != 9 || len(got.conf.GetVoters()) != 3 {
		t.Fatalf("read %+v", got)
	}
	// The spare slot torn: the last durable state is still there.
	f, err := os.OpenFile(dir+"/"+stateFileName, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xff, 0xff}, int64((1-durable)*stateSlot+20)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	sf, got, _, err = openState(dir, persistent{})
	if err != nil {
		t.Fatal(err)
	}
	sf.close()
	if got.term != 5 || got.vote != 2 || got.commit != 0 {
		t.Fatalf("after tearing the spare slot: %+v, want term 5 vote 2 commit 0", got)
	}
}

func TestDecodeBatchNeverPanics(t *testing.T) {
	data := appendBatchHeader(nil, batchHeader{proposer: 1, seq: 1, ts: 1, count: 2})
	data = appendBatchRecord(data, &wal.Record{Key: []byte("k"), Value: []byte("v"), Headers: map[string]string{"a": "b"}, ProducerID: "p"})
	data = appendBatchRecord(data, &wal.Record{Value: []byte("w")})
	if _, recs, err := decodeBatch(data, 7); err != nil || len(recs) != 2 || recs[1].Offset != 8 || recs[0].Headers["a"] != "b" {
		t.Fatalf("decode: %v %v", recs, err)
	}
	for i := range data {
		if _, _, err := decodeBatch(data[:i], 0); err == nil {
			t.Fatalf("a batch cut at %d of %d bytes decoded", i, len(data))
		}
	}
}

func FuzzDecodeBatch(f *testing.F) {
	data := appendBatchHeader(nil, batchHeader{proposer: 1, seq: 1, ts: 1, count: 1})
	f.Add(appendBatchRecord(data, &wal.Record{Key: []byte("k"), Value: []byte("v"), Headers: map[string]string{"a": "b"}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, _ = decodeBatch(b, 0)
		_, _, _, _ = decodeEntry(b, 1)
		_, _, _ = decodeSlot(b)
	})
}

// TestStateFileIgnoresPlantedLink: a link placed where createState used
// to put its temporary file (raftstate.tmp) is not followed; the file it
// points to is left as it was. createState used to write the new state
// through it.
func TestStateFileIgnoresPlantedLink(t *testing.T) {
	dir := t.TempDir()
	untouched := linktest.Plant(t, filepath.Join(dir, stateFileName+".tmp"), filepath.Join(t.TempDir(), "victim"))
	sf, _, created, err := openState(dir, persistent{conf: &pb.ConfState{Voters: []uint64{1}}})
	if err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	sf.close()
	untouched()
	linktest.Regular(t, filepath.Join(dir, stateFileName))
}

// A failed fdatasync leaves the append's entries in the page cache, where
// a replica reopened after a restart would read them as written: the
// append cuts them back out of the segment files, across a segment roll
// too, and the reopened log ends where the last durable append did.
func TestFailedAppendCutFromFiles(t *testing.T) {
	for _, n := range []int{1, 3, 40} { // 40 entries of about 70 bytes roll a 1 KiB segment
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			dir := t.TempDir()
			writeEntries(t, dir, 10, 10)
			s, err := openTestStorage(t, dir)
			if err != nil {
				t.Fatal(err)
			}
			fault := errors.New("injected fdatasync failure")
			s.beforeSync = func(uint64) error { return fault }
			var ents []*pb.Entry
			for i := uint64(11); i < 11+uint64(n); i++ {
				ents = append(ents, testEntry(i, 1, fmt.Sprintf("value-%03d-%s", i, make([]byte, 40))))
			}
			if err := s.append(ents); !errors.Is(err, fault) {
				t.Fatalf("append = %v, want the injected failure", err)
			}
			if s.last != 10 {
				t.Fatalf("last %d after the failed append, want 10", s.last)
			}
			if err := s.close(); err != nil {
				t.Fatal(err)
			}
			r, err := openTestStorage(t, dir)
			if err != nil {
				t.Fatal(err)
			}
			defer r.close()
			if r.last != 10 {
				t.Fatalf("reopened, the log ends at %d; want 10, where the last durable append ended", r.last)
			}
			if err := r.append([]*pb.Entry{testEntry(11, 2, "after")}); err != nil {
				t.Fatalf("append after reopening: %v", err)
			}
		})
	}
}

// TestOpenRefusesMissingOrEmptiedSegment: a segment in the middle of the
// log removed, or emptied (a file of zero bytes): Open must refuse with
// ErrCorrupt (the broker then sets the replica aside and a new one joins
// in its place), not panic in tidwall's Read and take the process down.
func TestOpenRefusesMissingOrEmptiedSegment(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(path string) error
	}{
		{"removed", os.Remove},
		{"emptied", func(p string) error { return os.Truncate(p, 0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeEntries(t, dir, 30, 30)
			segs, _, _ := tidseg.List(dir)
			if len(segs) < 3 {
				t.Fatalf("%d segments, want 3 or more", len(segs))
			}
			if err := tc.damage(segs[1].Path); err != nil {
				t.Fatal(err)
			}
			s, err := openTestStorage(t, dir)
			if err == nil {
				s.close()
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("open: %v, want ErrCorrupt", err)
			}
		})
	}
}

// TestTruncatedStateFileIsCorrupt: a raft state file cut short. With no
// valid slot left it is ErrCorrupt, as a file whose slots are both
// damaged is (and the broker replaces the replica); with its first slot
// whole, the replica opens with that state.
func TestTruncatedStateFileIsCorrupt(t *testing.T) {
	for _, tc := range []struct {
		size    int64
		wantErr error
	}{{0, ErrCorrupt}, {20, ErrCorrupt}, {100, nil}, {stateSlot + 100, nil}} {
		dir := t.TempDir()
		writeEntries(t, dir, 30, 30)
		// writeEntries's setState went to slot 1 (the spare of the
		// created file): make slot 0 hold the newest state.
		s, err := openTestStorage(t, dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.st.write(&s.p, true); err != nil {
			t.Fatal(err)
		}
		s.close()
		if err := os.Truncate(filepath.Join(dir, stateFileName), tc.size); err != nil {
			t.Fatal(err)
		}
		s, err = openTestStorage(t, dir)
		if err == nil {
			if s.p.commit != 30 || s.last != 30 {
				t.Errorf("state file cut to %d bytes: opened with commit %d, last %d, want 30 and 30", tc.size, s.p.commit, s.last)
			}
			s.close()
		}
		if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
			t.Errorf("state file cut to %d bytes: open: %v, want %v", tc.size, err, tc.wantErr)
		}
	}
}

// TestStateKeepsSynced: the state carries synced after the ConfState, as
// a field a ConfState decoder keeps as unknown; a slot written before it
// was kept reads as synced 0, and the ConfState carries nothing of it.
func TestStateKeepsSynced(t *testing.T) {
	p := persistent{term: 3, vote: 2, commit: 40, synced: 45, snapIndex: 10, snapTerm: 1, snapNext: 11, conf: &pb.ConfState{Voters: []uint64{1, 2, 3}}}
	b, err := p.encode(nil, 7)
	if err != nil {
		t.Fatal(err)
	}
	got, seq, ok := decodeSlot(b)
	if !ok || seq != 7 || got.synced != 45 || got.commit != 40 || !proto.Equal(got.conf, p.conf) || len(got.conf.ProtoReflect().GetUnknown()) != 0 {
		t.Fatalf("decoded %+v (seq %d, %v), want %+v", got, seq, ok, p)
	}
	// The earlier format: the same body without the field.
	old := p
	old.synced = 0
	b, err = old.encode(nil, 8)
	if err != nil {
		t.Fatal(err)
	}
	trimmed := b[:len(b)-len(protowire.AppendVarint(protowire.AppendTag(nil, syncedField, protowire.VarintType), 0))]
	binary.LittleEndian.PutUint32(trimmed[4:], uint32(len(trimmed)-stateFixed))
	binary.LittleEndian.PutUint32(trimmed, crc32.Checksum(trimmed[4:], castagnoli))
	got, _, ok = decodeSlot(trimmed)
	if !ok || got.synced != 0 || got.commit != 40 || !proto.Equal(got.conf, p.conf) {
		t.Fatalf("a slot of the earlier format decoded as %+v (%v)", got, ok)
	}
}
