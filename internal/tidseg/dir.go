package tidseg

import (
	"fmt"
	"github.com/felix-broker/felix/internal/atomicfile"
	"os"
	"path/filepath"
	"strconv"
)

// SyncDir fsyncs directory dir, so that the names of files created,
// renamed or removed in it survive a crash (atomicfile.SyncDir).
func SyncDir(dir string) error { return atomicfile.SyncDir(dir) }

// Reset empties the log in dir so that its next entry is index: every
// segment (and any file of an interrupted truncation) is removed and one
// empty segment named index is left, which tidwall opens as an empty log
// whose first index is index. The directory is synced. The log must not
// be open.
func Reset(dir string, index uint64) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("reset log %q: %w", dir, err)
	}
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() || len(name) < 20 {
			continue
		}
		if _, perr := strconv.ParseUint(name[:20], 10, 64); perr != nil {
			continue
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("reset log %q: %w", dir, err)
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, Name(index)), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o640)
	if err != nil {
		return fmt.Errorf("reset log %q: %w", dir, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("reset log %q: %w", dir, err)
	}
	return SyncDir(dir)
}
