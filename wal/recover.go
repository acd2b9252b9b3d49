package wal

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/felix-broker/felix/internal/tidseg"
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
// Entries below floor, the committed high-water mark, were acknowledged,
// so fsynced: a crash cannot tear them, and one that fails verification is
// damage, kept and served as a *CorruptError as damage in an earlier
// segment is (validTail). A cut below floor, where the entries' framing
// breaks, would drop acknowledged records: that is damage too, not a
// crash. Then repairTail changes nothing and
// returns a *LostRecordsError, unless o.AcceptLoss (Open then fills the lost
// offsets with markers).
func repairTail(dir string, o *Options, floor uint64) error {
	segs, err := tidseg.Settle(dir, tidwallOptions(o))
	if err != nil {
		return fmt.Errorf("wal: shard %q: %w", o.Name, err)
	}
	if len(segs) == 0 {
		return nil
	}
	last := segs[len(segs)-1]
	data, err := readFile(o.FS, last.Path)
	if err != nil {
		return fmt.Errorf("wal: shard %q: read tail segment %q: %w", o.Name, last.Path, err)
	}
	keep, records, reason := validTail(data, last.Index, floor, func(entry []byte, index uint64) error {
		// A lost-record marker (an accepted loss) is kept like a record.
		if isLostMarker(entry, index-1) {
			return nil
		}
		_, err := decodeRecord(o.Name, entry, index-1)
		return err
	})
	if keep == len(data) {
		return nil
	}
	end := last.Index - 1 + uint64(records)
	if end < floor && !o.AcceptLoss {
		return &LostRecordsError{Shard: o.Name, Dir: dir, From: end, To: floor,
			Reason: fmt.Sprintf("segment %s is damaged at byte %d of %d: %s", filepath.Base(last.Path), keep, len(data), reason)}
	}
	f, err := o.FS.OpenFile(last.Path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("wal: shard %q: open tail segment %q for repair: %w", o.Name, last.Path, err)
	}
	if err := tidseg.Cut(f, int64(keep)); err != nil {
		return fmt.Errorf("wal: shard %q: cut torn tail of segment %q: %w", o.Name, last.Path, err)
	}
	if tidseg.ZeroTail(data[keep:]) {
		// What a crash leaves of the zeros written ahead of the data
		// (prealloc.go): no record was there.
		o.Logger.Debug("wal: cut preallocated zeros", "shard", o.Name, "file", last.Path, "bytes_cut", len(data)-keep, "next_offset", end)
		return nil
	}
	o.Logger.Warn("wal: cut torn tail",
		"shard", o.Name,
		"file", last.Path,
		"bytes_cut", len(data)-keep,
		"records_kept", records,
		"next_offset", end,
		"reason", reason)
	return nil
}

// validTail returns how many leading bytes of the tail segment's data,
// whose first entry has index first, to keep, how many entries that is,
// and why it stops early (see tidseg.ValidPrefix). Past floor (offsets
// floor and up: never acknowledged) it stops at the first entry that
// check refuses, a torn write. Below floor it keeps a damaged entry (one
// flipped bit must not cost the acked records after it) provided the
// damage is anchored: a later entry verifies at its own offset. Otherwise
// the framing itself is in doubt (a damaged length prefix shifts every
// entry after it) and it stops at the first damaged entry; damage to the
// last acknowledged records is then a loss for Open to refuse, or to mark
// with Options.AcceptLoss, which costs only the damaged records.
func validTail(data []byte, first, floor uint64, check func(entry []byte, index uint64) error) (keep, entries int, reason string) {
	badKeep, badEntries, badReason, at := -1, 0, "", 0
	keep, entries, reason = tidseg.ValidPrefix(data, first, func(entry []byte, index uint64) error {
		pos := at
		at += tidseg.EntrySize(len(entry))
		switch err := check(entry, index); {
		case err == nil:
			badKeep = -1 // anchored
		case index-1 >= floor:
			return err
		case badKeep < 0:
			badKeep, badEntries, badReason = pos, int(index-first), err.Error()
		}
		return nil
	})
	if badKeep >= 0 {
		return badKeep, badEntries, badReason
	}
	return keep, entries, reason
}
