package wal

import (
	"encoding/binary"
	"fmt"

	tidwall "github.com/tidwall/wal"

	"github.com/felix-broker/felix/internal/tidseg"
)

// tidwall/wal's on-disk layout (segment names, entry framing, the segment
// roll) is known to package internal/tidseg, shared with package replica;
// these are wal's names for it.

// segmentFile is one complete segment file found in a log directory. Its
// Index is the tidwall index of its first entry (offset Index-1).
type segmentFile = tidseg.Segment

func segmentName(index uint64) string { return tidseg.Name(index) }

// listSegments returns the plain segment files of dir in index order, and
// whether tidwall's .START/.END files of an interrupted truncation exist.
func listSegments(dir string) ([]segmentFile, bool, error) {
	segs, pending, err := tidseg.List(dir)
	if err != nil {
		return nil, false, fmt.Errorf("wal: %w", err)
	}
	return segs, pending, nil
}

// nextEntry splits the first tidwall entry off b. ok is false if b does not
// start with a complete entry.
func nextEntry(b []byte) (data []byte, n int, ok bool) { return tidseg.NextEntry(b) }

// entrySize is the size of a tidwall binary entry holding data of size n.
func entrySize(n int) int { return tidseg.EntrySize(n) }

// tidwallOptions are the options every tidwall.Open of a shard uses: the
// committer fdatasyncs once per batch itself.
func tidwallOptions(o *Options) *tidwall.Options { return tidseg.Options(o.SegmentSize) }

// syncDir fsyncs dir on the real OS (retention's truncations: tidwall's
// own files, which the FS seam does not cover either).
func syncDir(dir string) error {
	if err := tidseg.SyncDir(dir); err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	return nil
}

// uvarintPrefix decodes the entry length at the start of b.
func uvarintPrefix(b []byte) (size uint64, n int) { return binary.Uvarint(b) }
