package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/linktest"
)

// WriteFile replaces the file whole with the permissions asked for, and
// leaves no temporary file behind, whether it succeeds or fails.
func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state")
	for _, content := range []string{"first", "second, longer"} {
		if err := WriteFile(path, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil || string(b) != content {
			t.Fatalf("read %q, %v; want %q", b, err, content)
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v, %v; want 0640", fi.Mode(), err)
	}
	// A rename over a directory fails: the temporary file goes too.
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(filepath.Join(dir, "d"), []byte("x"), 0o600); err == nil {
		t.Fatal("WriteFile over a directory succeeded")
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 2 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("directory holds %v, want only state and d", names)
	}
}

// WriteFileIn replaces a file inside a root, in a subdirectory too, leaves
// no temporary file behind, and cannot be led out of the root.
func TestWriteFileIn(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o750); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for _, content := range []string{"first", "second, longer"} {
		if err := WriteFileIn(root, filepath.Join("sub", "mark"), []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, "sub", "mark"))
		if err != nil || string(b) != content {
			t.Fatalf("read %q, %v; want %q", b, err, content)
		}
	}
	if ents, err := os.ReadDir(filepath.Join(dir, "sub")); err != nil || len(ents) != 1 {
		t.Fatalf("sub holds %v (%v), want only mark", ents, err)
	}
	if err := WriteFileIn(root, "../escape", []byte("x"), 0o640); err == nil {
		t.Fatal("WriteFileIn wrote outside its root")
	}
}

// A link placed in a root where WriteFileIn used to put its temporary
// file (name + ".tmp") is not followed, even to a file inside the root:
// that file is left as it was and name is a file of its own. WriteFileIn
// used to write through the link and rename the link over name.
func TestWriteFileInIgnoresPlantedLink(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o750); err != nil {
		t.Fatal(err)
	}
	untouched := linktest.Plant(t, filepath.Join(dir, "sub", "mark.tmp"), filepath.Join(dir, "victim"))
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if err := WriteFileIn(root, filepath.Join("sub", "mark"), []byte("mark"), 0o640); err != nil {
		t.Fatal(err)
	}
	untouched()
	linktest.Regular(t, filepath.Join(dir, "sub", "mark"))
}

// A write removes the temporary files of its name that a process killed
// before its rename left behind, once they are old enough that no write
// in progress can own them; a recent one, other names' and files not
// named as createTemp names them stay.
func TestWriteFileRemovesStaleTemps(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-2 * staleTempAge)
	file := func(name string, mtime time.Time) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		return name
	}
	stale := []string{file(".mark.tmp-12345", old), file(".mark.tmp-4294967295", old)}
	kept := []string{
		file(".mark.tmp-777", time.Now()), // a write in progress
		file(".other.tmp-12345", old),     // another file's
		file(".mark.tmp-x1", old),         // not createTemp's name
		file(".markx.tmp-1", old),
	}
	if err := WriteFile(filepath.Join(dir, "mark"), []byte("mark"), 0o640); err != nil {
		t.Fatal(err)
	}
	for _, n := range stale {
		if _, err := os.Lstat(filepath.Join(dir, n)); !os.IsNotExist(err) {
			t.Errorf("stale temporary file %s: still there (%v)", n, err)
		}
	}
	for _, n := range kept {
		if _, err := os.Lstat(filepath.Join(dir, n)); err != nil {
			t.Errorf("%s: removed (%v), want it kept", n, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "mark")); err != nil || string(b) != "mark" {
		t.Errorf("mark: %q, %v", b, err)
	}
}
