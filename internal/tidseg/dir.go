package tidseg

import (
	"fmt"
	"os"
)

// SyncDir fsyncs directory dir, so that the names of files created,
// renamed or removed in it survive a crash.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir %q for sync: %w", dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync dir %q: %w", dir, err)
	}
	return nil
}
