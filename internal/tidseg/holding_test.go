package tidseg

import (
	"os"
	"path/filepath"
	"testing"
)

// TestHolding: the segment file holding an index is the one named by the
// greatest index not above it; transient files and other names are not
// segments.
func TestHolding(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{Name(5), Name(9), Name(20), Name(30) + ".START", Name(40) + ".TEMP", "hwm", "0000000000000000000x"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ index, first, after uint64 }{
		{1, 0, 0}, {4, 0, 0}, {5, 5, 9}, {8, 5, 9}, {9, 9, 20}, {19, 9, 20}, {20, 20, 0}, {35, 20, 0}, {1 << 40, 20, 0},
	} {
		first, after, err := Holding(dir, tc.index)
		if err != nil || first != tc.first || after != tc.after {
			t.Errorf("Holding(%d) = %d, %d, %v; want %d, %d", tc.index, first, after, err, tc.first, tc.after)
		}
	}
	if _, _, err := Holding(filepath.Join(dir, "gone"), 1); err == nil {
		t.Error("Holding of a missing directory: no error")
	}
}
