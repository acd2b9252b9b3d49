package tidseg

import (
	"errors"
	"fmt"

	tidwall "github.com/tidwall/wal"
)

// Settle returns the segments of dir, as List does, after letting tidwall
// finish a truncation that a crash interrupted (its .START/.END files): it
// does so when it opens a log, before it loads the last segment. A log
// whose tail tidwall cannot parse (ErrCorrupt) is left to the caller's
// repair; that error is not returned.
func Settle(dir string, opts *tidwall.Options) ([]Segment, error) {
	segs, pending, err := List(dir)
	if err != nil || !pending {
		return segs, err
	}
	tw, err := tidwall.Open(dir, opts)
	switch {
	case err == nil:
		if err := tw.Close(); err != nil {
			return nil, fmt.Errorf("close log %q after cleanup: %w", dir, err)
		}
	case !errors.Is(err, tidwall.ErrCorrupt):
		return nil, fmt.Errorf("open log %q: %w", dir, err)
	}
	segs, _, err = List(dir)
	return segs, err
}

// ValidPrefix returns how many leading bytes of a segment's data, whose
// first entry has index first, are complete entries that check accepts,
// how many entries that is, and why it stops early: "incomplete entry", or
// the error check returned.
func ValidPrefix(data []byte, first uint64, check func(entry []byte, index uint64) error) (keep, entries int, reason string) {
	for keep < len(data) {
		entry, n, ok := NextEntry(data[keep:])
		if !ok {
			return keep, entries, "incomplete entry"
		}
		if err := check(entry, first+uint64(entries)); err != nil {
			return keep, entries, err.Error()
		}
		keep += n
		entries++
	}
	return keep, entries, ""
}

// Cutter is a segment file opened for writing: *os.File, or a file of a
// caller's fault-injection seam.
type Cutter interface {
	Truncate(size int64) error
	Sync() error
	Close() error
}

// Cut truncates f to keep bytes, syncs it and closes it (also on error).
func Cut(f Cutter, keep int64) error {
	err := f.Truncate(keep)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
