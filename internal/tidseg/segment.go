package tidseg

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	tidwall "github.com/tidwall/wal"
)

// tidwall's layout: a segment file is named by the 20-digit zero-padded
// index of its first entry and holds entries of uvarint length + data (the
// Binary format). Transient files carry a .START, .END or .TEMP suffix
// after the 20 digits.

// Segment is one complete segment file found in a log directory.
type Segment struct {
	Index   uint64 // tidwall index of its first entry
	Path    string
	Size    int64
	ModTime time.Time // the file's last modification, by the local wall clock
}

// Dated returns ts, the timestamp (unix ns) of a record in segment s, as
// retention by age may date the record: ts, unless it is later than the
// file's last modification plus skew, then the modification time. The
// file was written after the record, by the local clock: a timestamp
// that far ahead was taken by a clock that was ahead then (or the local
// one has stepped back since), and trusting it would keep the segment
// until that clock's time came.
func (s Segment) Dated(ts int64, skew time.Duration) int64 {
	if m := s.ModTime.UnixNano(); ts > m+int64(skew) {
		return m
	}
	return ts
}

// Name returns the file name of the segment whose first entry is index.
func Name(index uint64) string { return fmt.Sprintf("%020d", index) }

// List returns the plain segment files of dir in index order, and whether
// tidwall's .START/.END files of an interrupted truncation exist.
func List(dir string) (segs []Segment, pending bool, err error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, false, fmt.Errorf("list segments in %q: %w", dir, err)
	}
	for _, e := range ents { // ReadDir sorts by name, so by index
		name := e.Name()
		if e.IsDir() || len(name) < 20 {
			continue
		}
		index, perr := strconv.ParseUint(name[:20], 10, 64)
		if perr != nil || index == 0 {
			continue
		}
		switch {
		case len(name) == 20:
			info, err := e.Info()
			if err != nil {
				return nil, false, fmt.Errorf("stat segment %q: %w", name, err)
			}
			segs = append(segs, Segment{Index: index, Path: filepath.Join(dir, name), Size: info.Size(), ModTime: info.ModTime()})
		case strings.HasSuffix(name, ".START") || strings.HasSuffix(name, ".END"):
			pending = true
		}
	}
	return segs, pending, nil
}

// Holding returns the first index of the segment file of dir that holds
// index (the one named by the greatest index not above it), 0 if none
// does, and the first index of the file after it, 0 if it is the last.
// It reads the directory's names only, stats no file, and ignores
// transient files.
func Holding(dir string, index uint64) (first, after uint64, err error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, fmt.Errorf("list segments in %q: %w", dir, err)
	}
	for _, e := range ents { // sorted by name, so by index
		name := e.Name()
		if len(name) != 20 || e.IsDir() {
			continue
		}
		i, perr := strconv.ParseUint(name, 10, 64)
		switch {
		case perr != nil || i == 0:
		case i <= index:
			first = i
		case first != 0:
			return first, i, nil
		default:
			return 0, 0, nil
		}
	}
	return first, 0, nil
}

// Total is the size of segs' files.
func Total(segs []Segment) int64 {
	var n int64
	for _, s := range segs {
		n += s.Size
	}
	return n
}

// NextEntry splits the first tidwall entry off b. ok is false if b does not
// start with a complete entry.
func NextEntry(b []byte) (data []byte, n int, ok bool) {
	size, h := binary.Uvarint(b)
	if h <= 0 || size > uint64(len(b)-h) {
		return nil, 0, false
	}
	end := h + int(size)
	return b[h:end], end, true
}

// EntrySize is the size of a tidwall binary entry holding data of size n.
func EntrySize(n int) int {
	h := 1
	for x := n; x >= 0x80; x >>= 7 {
		h++
	}
	return h + n
}

// Options are the options every Felix log opens tidwall with: binary
// entries, no sync by tidwall on each write (the caller fdatasyncs the tail
// segment once per batch, see FollowRoll), empty logs allowed.
func Options(segmentSize int) *tidwall.Options {
	return &tidwall.Options{
		NoSync:           true,
		SegmentSize:      segmentSize,
		LogFormat:        tidwall.Binary,
		SegmentCacheSize: 2,
		AllowEmpty:       true, // retention may drop every entry
		DirPerms:         0o750,
		FilePerms:        0o640,
	}
}
