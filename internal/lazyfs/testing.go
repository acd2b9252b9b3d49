package lazyfs

import (
	"errors"
	"testing"
)

// MountForTest mounts a lazyfs at mountpoint over a new backing directory
// in tb's temp dir, and unmounts it when the test ends (an error then
// fails the test). It skips the test, saying why, where FUSE cannot be
// used (ErrUnavailable).
func MountForTest(tb testing.TB, mountpoint string) *FS {
	tb.Helper()
	fsys, err := Mount(tb.TempDir(), mountpoint)
	if errors.Is(err, ErrUnavailable) {
		tb.Skipf("no lazyfs at %s: %v", mountpoint, err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := fsys.Unmount(); err != nil {
			tb.Errorf("unmount the lazyfs at %s: %v", mountpoint, err)
		}
	})
	return fsys
}
