package wal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	tidwall "github.com/tidwall/wal"
)

// repairTail cuts a torn tail off the last segment of the log in dir before
// tidwall opens it.
//
// A crash during a batch write can leave the last segment ending in an
// incomplete entry (tidwall then refuses to open), or in complete-looking
// entries whose bytes never reached the disk: the disk need not persist the
// pages of one write in order. No record of that batch was acknowledged,
// because acks follow the fsync. So the last segment is cut at the first
// entry that is incomplete or fails record verification, including the
// offset it must hold. Earlier segments were fsynced before the next one was
// created and are never cut.
//
// A cut below floor, the committed high-water mark, would drop acknowledged
// records: that is damage, not a crash. Then repairTail changes nothing and
// returns a *LostRecordsError, unless o.AcceptLoss (Open then fills the lost
// offsets with markers).
func repairTail(dir string, o *Options, floor uint64) error {
	segs, pending, err := listSegments(dir)
	if err != nil {
		return err
	}
	if pending {
		// Let tidwall finish an interrupted truncation (.START/.END files),
		// which it does before it loads the last segment.
		tw, err := tidwall.Open(dir, tidwallOptions(o))
		switch {
		case err == nil:
			if err := tw.Close(); err != nil {
				return fmt.Errorf("wal: shard %q: close log %q after cleanup: %w", o.Name, dir, err)
			}
		case !errors.Is(err, tidwall.ErrCorrupt):
			return fmt.Errorf("wal: shard %q: open log %q: %w", o.Name, dir, err)
		}
		if segs, _, err = listSegments(dir); err != nil {
			return err
		}
	}
	if len(segs) == 0 {
		return nil
	}
	last := segs[len(segs)-1]
	data, err := readFile(o.FS, last.path)
	if err != nil {
		return fmt.Errorf("wal: shard %q: read tail segment %q: %w", o.Name, last.path, err)
	}
	keep, records, reason := validPrefix(data, last.index-1, o.Name)
	if keep == len(data) {
		return nil
	}
	end := last.index - 1 + uint64(records)
	if end < floor && !o.AcceptLoss {
		return &LostRecordsError{Shard: o.Name, Dir: dir, From: end, To: floor,
			Reason: fmt.Sprintf("segment %s is damaged at byte %d of %d: %s", filepath.Base(last.path), keep, len(data), reason)}
	}
	f, err := o.FS.OpenFile(last.path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("wal: shard %q: open tail segment %q for repair: %w", o.Name, last.path, err)
	}
	err = f.Truncate(int64(keep))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("wal: shard %q: cut torn tail of segment %q: %w", o.Name, last.path, err)
	}
	o.Logger.Warn("wal: cut torn tail",
		"shard", o.Name,
		"file", last.path,
		"bytes_cut", len(data)-keep,
		"records_kept", records,
		"next_offset", end,
		"reason", reason)
	return nil
}

// validPrefix returns how many leading bytes of a segment whose first entry
// holds offset base are complete, valid records, how many records that is,
// and why it stops early.
func validPrefix(data []byte, base uint64, shard string) (keep, records int, reason string) {
	for keep < len(data) {
		entry, n, ok := nextEntry(data[keep:])
		if !ok {
			return keep, records, "incomplete entry"
		}
		// A lost-record marker (an accepted loss) is kept like a record.
		if !isLostMarker(entry, base+uint64(records)) {
			if _, err := decodeRecord(shard, entry, base+uint64(records)); err != nil {
				return keep, records, err.Error()
			}
		}
		keep += n
		records++
	}
	return keep, records, ""
}
