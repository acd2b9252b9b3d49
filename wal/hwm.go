package wal

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"

	tidwall "github.com/tidwall/wal"
)

// The committed high-water mark (the "hwm" file beside the segments).
//
// It records NextOffset as of the last commit, so that Open can tell a log
// that lost acknowledged records (its segments end below the mark) from
// one that lost only a torn, unacknowledged tail to a crash (they end at
// or above it). It costs no fsync on the commit path: after each batch's
// fdatasync, and before the batch is acked, the committer writes the new
// mark into the file with one pwrite of 24 bytes into the page cache. The
// file is fdatasynced only on Open and Close.
//
// So the mark is never above what was durable when it was written, and:
//   - after a process crash (kill -9) the page cache survives: the mark
//     covers every acknowledged record exactly;
//   - after an OS crash or power loss it may lag by the kernel's writeback
//     delay (about 30 s by default): records acked in that window before
//     the crash, if their segment was then also damaged, are lost without
//     being noticed. A crash alone never makes the mark exceed the log.
//
// It also records the log's first offset (its low-water mark), so that
// Open can tell a log whose first segments were lost (removed, or a
// directory restored without them) from one that retention cut: a
// retention pass writes and fdatasyncs the new first offset before it
// drops a segment, so the mark is never above the log's real first
// offset after any crash, and segments that start above it lost the
// acknowledged records between.
//
// Layout: two 32-byte slots, at byte 0 and byte 512 (different sectors),
// written alternately, each
//
//	magic "FXH2" | next uint64 | first uint64 | generation uint64 | crc32c of the 28 bytes before it
//
// little endian. The valid slot with the higher generation wins, so a torn
// write of one slot leaves the other, older mark. A slot of the format
// before the first offset was kept (24 bytes: magic "FXHW" | next |
// generation | crc32c) is read as a mark with no first offset: that log
// opens without the check, and the mark is written anew.
//
// A log without the file (written before it existed) or whose slots are
// both damaged opens as it did before: a torn tail is cut without a check
// (the damaged case is logged as a warning), and the file is written anew.
const (
	hwmName     = "hwm"
	hwmSlot     = 512
	hwmRecord   = 32
	hwmRecordV1 = 24
)

var (
	hwmMagic   = [4]byte{'F', 'X', 'H', '2'}
	hwmMagicV1 = [4]byte{'F', 'X', 'H', 'W'}
)

// hwmFile is the open high-water-mark file. It is used by Open, then by
// whoever holds the commit role, then by Close.
type hwmFile struct {
	f    File
	path string
	// mu serialises the writes of the committer (next) and of the
	// retention pass (first).
	mu    sync.Mutex
	gen   uint64
	next  uint64 // as last written
	first uint64 // as last written
	buf   [hwmRecord]byte
}

// hwmMark is what the file held.
type hwmMark struct {
	next     uint64
	first    uint64
	hasFirst bool // written in the format that keeps it
}

// hwmState is what openHWM found.
type hwmState int

const (
	hwmMissing hwmState = iota // no file, or an empty one
	hwmDamaged                 // neither slot valid
	hwmValid
)

// openHWM opens (creating it if need be) the mark file of the log in dir
// and reads the mark.
func openHWM(fs FS, dir string) (h *hwmFile, mark hwmMark, state hwmState, err error) {
	path := filepath.Join(dir, hwmName)
	f, err := fs.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, mark, 0, fmt.Errorf("open %q: %w", path, err)
	}
	h = &hwmFile{f: f, path: path}
	size, err := f.Size()
	if err != nil {
		_ = f.Close()
		return nil, mark, 0, fmt.Errorf("stat %q: %w", path, err)
	}
	if size == 0 {
		return h, mark, hwmMissing, nil
	}
	var data [hwmSlot + hwmRecord]byte
	n, err := f.ReadAt(data[:min(int64(len(data)), size)], 0)
	if err != nil && int64(n) != min(int64(len(data)), size) {
		_ = f.Close()
		return nil, mark, 0, fmt.Errorf("read %q: %w", path, err)
	}
	state = hwmDamaged
	for _, at := range []int{0, hwmSlot} {
		m, gen, ok := decodeHWM(data[at:n])
		if ok && (state != hwmValid || gen > h.gen) {
			mark, h.gen, state = m, gen, hwmValid
		}
	}
	return h, mark, state, nil
}

// decodeHWM decodes the slot at the start of b, of either format.
func decodeHWM(b []byte) (m hwmMark, gen uint64, ok bool) {
	switch {
	case len(b) >= hwmRecord && [4]byte(b[0:4]) == hwmMagic:
		if binary.LittleEndian.Uint32(b[28:]) != crc32.Checksum(b[:28], castagnoli) {
			return m, 0, false
		}
		m = hwmMark{next: binary.LittleEndian.Uint64(b[4:]), first: binary.LittleEndian.Uint64(b[12:]), hasFirst: true}
		return m, binary.LittleEndian.Uint64(b[20:]), true
	case len(b) >= hwmRecordV1 && [4]byte(b[0:4]) == hwmMagicV1:
		if binary.LittleEndian.Uint32(b[20:]) != crc32.Checksum(b[:20], castagnoli) {
			return m, 0, false
		}
		return hwmMark{next: binary.LittleEndian.Uint64(b[4:])}, binary.LittleEndian.Uint64(b[12:]), true
	}
	return m, 0, false
}

// write stores next (and the first offset last set) in the older slot,
// without syncing.
func (h *hwmFile) write(next uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.writeLocked(next, h.first)
}

// setFirst stores first (and the next offset last written) and
// fdatasyncs it: before retention drops the records below first.
func (h *hwmFile) setFirst(first uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.writeLocked(h.next, first); err != nil {
		return err
	}
	return h.sync()
}

func (h *hwmFile) writeLocked(next, first uint64) error {
	h.gen++
	b := h.buf[:]
	copy(b, hwmMagic[:])
	binary.LittleEndian.PutUint64(b[4:], next)
	binary.LittleEndian.PutUint64(b[12:], first)
	binary.LittleEndian.PutUint64(b[20:], h.gen)
	binary.LittleEndian.PutUint32(b[28:], crc32.Checksum(b[:28], castagnoli))
	if _, err := h.f.WriteAt(b, int64(h.gen&1)*hwmSlot); err != nil {
		return fmt.Errorf("write %s: %w", hwmName, err)
	}
	h.next, h.first = next, first
	return nil
}

func (h *hwmFile) sync() error {
	if err := h.f.Sync(); err != nil {
		return fmt.Errorf("fdatasync %s: %w", hwmName, err)
	}
	return nil
}

// Lost-record markers fill the offsets of acknowledged records that
// Options.AcceptLoss gave up, so offsets stay dense in tidwall and are
// never reused. A marker is a record with version lostMarkerVersion, no
// fields and a valid checksum: repair keeps it, reads report it as a
// *CorruptError (unknown format version).
const lostMarkerVersion = 0xff

func appendLostMarker(dst []byte, off uint64, ts int64) []byte {
	start := len(dst)
	dst, _, _ = appendRecord(dst, &Record{}, off, ts)
	dst[start+versionAt] = lostMarkerVersion
	binary.LittleEndian.PutUint32(dst[start+crcAt:], crc32.Checksum(dst[start+versionAt:], castagnoli))
	return dst
}

// isLostMarker reports whether data is a valid marker for offset want.
func isLostMarker(data []byte, want uint64) bool {
	return len(data) >= recordFixed && data[versionAt] == lostMarkerVersion &&
		binary.LittleEndian.Uint32(data[crcAt:]) == crc32.Checksum(data[versionAt:], castagnoli) &&
		binary.LittleEndian.Uint64(data[offsetAt:]) == want
}

// fillLost writes markers for offsets [from, to) at the end of a freshly
// loaded log (whose next offset is from), makes them durable and moves the
// log's next offset to to. It runs in Open, before anything else uses l.
func (l *Log) fillLost(from, to uint64) error {
	var batch tidwall.Batch
	var buf []byte
	ts := l.c.lastTS
	for off := from; off < to; off++ {
		buf = appendLostMarker(buf[:0], off, ts)
		batch.Write(off+1, buf) // tidwall copies the data
	}
	if err := l.tw.WriteBatch(&batch); err != nil {
		return fmt.Errorf("wal: shard %q: write lost-record markers %d-%d: %w", l.name, from, to-1, err)
	}
	if err := l.tw.Sync(); err != nil { // tidwall synced the segments it left
		return fmt.Errorf("wal: shard %q: sync lost-record markers: %w", l.name, err)
	}
	segs, _, err := listSegments(l.dir)
	if err != nil {
		return err
	}
	if err := l.openTail(segs[len(segs)-1].Index); err != nil {
		return err
	}
	if err := l.syncDir(); err != nil {
		return err
	}
	l.next.Store(to)
	l.c.next = to
	l.ring.reset(l.opts.TailRecords, int64(l.opts.TailBytes), to)
	return nil
}
