//go:build linux

package atomicfile_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/felix-broker/felix/internal/atomicfile"
	"github.com/felix-broker/felix/internal/lazyfs"
)

// TestDirectoriesSurvivePowerLoss: directories made by MkdirAll and
// MkdirIn, and a file written in them with WriteFileIn, are there after
// a power loss (lazyfs: what was not fsynced is gone). With os.MkdirAll
// or a plain Mkdir, the new directories, and the file under them, were
// gone: that lost every shard directory of a broker whose disk lost
// power (TestPowerLoss).
func TestDirectoriesSurvivePowerLoss(t *testing.T) {
	mnt := t.TempDir()
	fsys := lazyfs.MountForTest(t, mnt)
	if err := atomicfile.MkdirAll(filepath.Join(mnt, "data", "streams"), 0o750); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(filepath.Join(mnt, "data", "streams"))
	if err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"orders", filepath.Join("orders", "0")} {
		if created, err := atomicfile.MkdirIn(root, rel, 0o750); err != nil || !created {
			t.Fatalf("MkdirIn %s: created %v, %v", rel, created, err)
		}
	}
	if created, err := atomicfile.MkdirIn(root, "orders", 0o750); err != nil || created {
		t.Fatalf("MkdirIn of an existing directory: created %v, %v; want false, nil", created, err)
	}
	if err := atomicfile.WriteFileIn(root, filepath.Join("orders", "0", "mark"), []byte("7\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	root.Close()
	if err := fsys.Crash(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(mnt, "data", "streams", "orders", "0", "mark"))
	if err != nil || string(b) != "7\n" {
		t.Fatalf("after the power loss: %q, %v; want the file written", b, err)
	}
}
