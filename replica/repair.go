package replica

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	tidwall "github.com/tidwall/wal"
)

// repairTail cuts a torn tail off the last segment of the log in dir before
// tidwall opens it.
//
// A crash during an append can leave the last segment ending in an
// incomplete entry (tidwall then refuses to open), or in complete-looking
// entries whose bytes never reached the disk in full. None of them was
// acknowledged to raft: a replica reports an append (MsgAppResp, or the
// leader's own progress) only after its fdatasync. So the last segment is
// cut at the first entry that is incomplete or fails its checksum. Earlier
// segments were fsynced before the next one was created and are never cut.
// Open then checks that the log still reaches the committed index.
func repairTail(dir, name string, segSize int, logger *slog.Logger) error {
	segs, pending, err := listSegments(dir)
	if err != nil {
		return err
	}
	if pending {
		// Let tidwall finish an interrupted truncation (.START/.END
		// files), which it does before it loads the last segment.
		tw, err := tidwall.Open(dir, tidwallOptions(segSize))
		switch {
		case err == nil:
			if err := tw.Close(); err != nil {
				return fmt.Errorf("replica: group %q: close log %q after cleanup: %w", name, dir, err)
			}
		case !errors.Is(err, tidwall.ErrCorrupt):
			return fmt.Errorf("replica: group %q: open log %q: %w", name, dir, err)
		}
		if segs, _, err = listSegments(dir); err != nil {
			return err
		}
	}
	if len(segs) == 0 {
		return nil
	}
	last := segs[len(segs)-1]
	data, err := os.ReadFile(last.path)
	if err != nil {
		return fmt.Errorf("replica: group %q: read tail segment %q: %w", name, last.path, err)
	}
	keep, entries, reason := validPrefix(data, last.index)
	if keep == len(data) {
		return nil
	}
	f, err := os.OpenFile(last.path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("replica: group %q: open tail segment %q for repair: %w", name, last.path, err)
	}
	err = f.Truncate(int64(keep))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("replica: group %q: cut torn tail of segment %q: %w", name, last.path, err)
	}
	logger.Warn("replica: cut torn tail",
		"group", name,
		"file", filepath.Base(last.path),
		"bytes_cut", len(data)-keep,
		"entries_kept", entries,
		"last_index", last.index+uint64(entries)-1,
		"reason", reason)
	return nil
}

// validPrefix returns how many leading bytes of a segment whose first entry
// has index first are complete, valid entries, how many entries that is,
// and why it stops early.
func validPrefix(data []byte, first uint64) (keep, entries int, reason string) {
	for keep < len(data) {
		size, h := binary.Uvarint(data[keep:])
		if h <= 0 || size > uint64(len(data)-keep-h) {
			return keep, entries, "incomplete entry"
		}
		end := keep + h + int(size)
		if _, _, _, ok := decodeEntry(data[keep+h:end], first+uint64(entries)); !ok {
			return keep, entries, "checksum mismatch"
		}
		keep = end
		entries++
	}
	return keep, entries, ""
}
