// Package linktest plants links where code that writes a file must not
// follow them (a name another local user could have created first), for
// tests of that code. It is for tests only.
package linktest

import (
	"os"
	"path/filepath"
	"testing"
)

const content = "not felix's\n"

// Plant makes link a symbolic link, relative to link's directory, to
// victim, a new file it writes; it returns a check that fails t if
// victim no longer holds what Plant wrote.
func Plant(t testing.TB, link, victim string) (untouched func()) {
	t.Helper()
	if err := os.WriteFile(victim, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(filepath.Dir(link), victim)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(rel, link); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if b, err := os.ReadFile(victim); err != nil || string(b) != content {
			t.Errorf("the file a link planted at %s points to holds %q (%v); want it untouched", link, b, err)
		}
	}
}

// Regular fails t unless path is a regular file (not a link).
func Regular(t testing.TB, path string) {
	t.Helper()
	if fi, err := os.Lstat(path); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("%s: %v, %v; want a regular file", path, fi.Mode(), err)
	}
}
