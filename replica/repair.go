package replica

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/felix-broker/felix/internal/tidseg"
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
//
// The log must hold the entries after snapIndex, its compaction point,
// up to floor: the replica's committed index, or the last index it had
// written and fdatasynced (the state's synced), whichever is higher. A
// cut that would reach one of them is not a torn tail (a crash tears
// only what was never synced, and so never acknowledged) but damage to
// entries raft may have counted as durable here: the segment is left as it is and the error is
// ErrCorrupt, so that the directory set aside for inspection (broker's
// openGroup) still holds every byte of it. When floor is the compaction
// point, the log owes no entry: every one it holds is either at or before
// that point, which reconcile drops, or not committed. That is the state
// a snapshot install writes before it replaces the log (commit and
// compaction point at the snapshot's index, compact.go); a stop between
// the two leaves the old log, whose tail may end in preallocated zeros (or
// a torn entry), and the cut lets reconcile finish the install.
func repairTail(dir, name string, segSize int, snapIndex, floor uint64, logger *slog.Logger) error {
	segs, err := tidseg.Settle(dir, tidseg.Options(segSize))
	if err != nil {
		return fmt.Errorf("replica: group %q: %w", name, err)
	}
	if len(segs) == 0 {
		return nil
	}
	last := segs[len(segs)-1]
	data, err := os.ReadFile(last.Path)
	if err != nil {
		return fmt.Errorf("replica: group %q: read tail segment %q: %w", name, last.Path, err)
	}
	keep, entries, reason := tidseg.ValidPrefix(data, last.Index, func(entry []byte, index uint64) error {
		if _, _, _, ok := decodeEntry(entry, index); !ok {
			return errChecksum
		}
		return nil
	})
	if keep == len(data) {
		return nil
	}
	if kept := last.Index + uint64(entries); kept <= floor && floor > snapIndex {
		return fmt.Errorf("replica: group %q: %w: segment %q holds entries up to %d intact (%s after), below index %d, which it had committed or synced",
			name, ErrCorrupt, filepath.Base(last.Path), kept-1, reason, floor)
	}
	f, err := os.OpenFile(last.Path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("replica: group %q: open tail segment %q for repair: %w", name, last.Path, err)
	}
	if err := tidseg.Cut(f, int64(keep)); err != nil {
		return fmt.Errorf("replica: group %q: cut torn tail of segment %q: %w", name, last.Path, err)
	}
	if tidseg.ZeroTail(data[keep:]) {
		// What a crash leaves of the zeros written ahead of the entries
		// (tidseg.Padding): no entry was there.
		logger.Debug("replica: cut preallocated zeros", "group", name, "file", filepath.Base(last.Path), "bytes_cut", len(data)-keep)
		return nil
	}
	logger.Warn("replica: cut torn tail",
		"group", name,
		"file", filepath.Base(last.Path),
		"bytes_cut", len(data)-keep,
		"entries_kept", entries,
		"last_index", last.Index+uint64(entries)-1,
		"reason", reason)
	return nil
}

var errChecksum = errors.New("checksum mismatch")
