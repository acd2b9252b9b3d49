package wal

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	tidwall "github.com/tidwall/wal"
)

// This file knows tidwall/wal's on-disk layout: segment files named by the
// 20-digit zero-padded index of their first entry, each a sequence of
// entries of uvarint length + data. Transient files carry a .START, .END or
// .TEMP suffix after the 20 digits.

// segmentFile is one complete segment file found in a log directory.
type segmentFile struct {
	index uint64 // tidwall index of its first entry (offset index-1)
	path  string
	size  int64
}

func segmentName(index uint64) string { return fmt.Sprintf("%020d", index) }

// listSegments returns the plain segment files of dir in index order, and
// whether tidwall's .START/.END files of an interrupted truncation exist.
func listSegments(dir string) (segs []segmentFile, pending bool, err error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, false, fmt.Errorf("wal: list segments in %q: %w", dir, err)
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
				return nil, false, fmt.Errorf("wal: stat segment %q: %w", name, err)
			}
			segs = append(segs, segmentFile{index: index, path: filepath.Join(dir, name), size: info.Size()})
		case strings.HasSuffix(name, ".START") || strings.HasSuffix(name, ".END"):
			pending = true
		}
	}
	return segs, pending, nil
}

// nextEntry splits the first tidwall entry off b. ok is false if b does not
// start with a complete entry.
func nextEntry(b []byte) (data []byte, n int, ok bool) {
	size, h := binary.Uvarint(b)
	if h <= 0 || size > uint64(len(b)-h) {
		return nil, 0, false
	}
	end := h + int(size)
	return b[h:end], end, true
}

// entrySize is the size of a tidwall binary entry holding data of size n.
func entrySize(n int) int { return uvarintLen(n) + n }

// tidwallOptions are the options every tidwall.Open of a shard uses.
func tidwallOptions(o *Options) *tidwall.Options {
	return &tidwall.Options{
		NoSync:           true, // the committer fdatasyncs once per batch itself
		SegmentSize:      o.SegmentSize,
		LogFormat:        tidwall.Binary,
		SegmentCacheSize: 2,
		AllowEmpty:       true, // retention may drop every record
		DirPerms:         0o750,
		FilePerms:        0o640,
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("wal: open dir %q for sync: %w", dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("wal: sync dir %q: %w", dir, err)
	}
	return nil
}

// uvarintPrefix decodes the entry length at the start of b.
func uvarintPrefix(b []byte) (size uint64, n int) { return binary.Uvarint(b) }
