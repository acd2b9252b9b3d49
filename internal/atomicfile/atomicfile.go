// Package atomicfile owns the one way Felix replaces a small file whole:
// written beside its final name, fsynced, renamed over it, and the
// directory fsynced, so that a reader (or a restart after a crash) sees
// either the old content or the new, never a part, and the new content
// survives a power loss once WriteFile returns.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// WriteFile replaces path with data, with permissions perm. On failure
// path is unchanged and the temporary file is removed.
func WriteFile(path string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(perm); err != nil {
		return fmt.Errorf("chmod %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp.Name(), err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}

// WriteFileIn is WriteFile for a file named name inside root (a path
// relative to it, resolved by the root so that it cannot lead out): the
// temporary file is name + ".tmp" beside it.
func WriteFileIn(root *os.Root, name string, data []byte, perm os.FileMode) (err error) {
	tmp := name + ".tmp"
	f, err := root.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, perm)
	if err != nil {
		return fmt.Errorf("create %s in %s: %w", tmp, root.Name(), err)
	}
	defer func() {
		if err != nil {
			f.Close()
			root.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s in %s: %w", tmp, root.Name(), err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s in %s: %w", tmp, root.Name(), err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s in %s: %w", tmp, root.Name(), err)
	}
	if err := root.Rename(tmp, name); err != nil {
		return fmt.Errorf("rename %s in %s: %w", tmp, root.Name(), err)
	}
	d, err := root.Open(filepath.Dir(name))
	if err != nil {
		return fmt.Errorf("open dir of %s in %s: %w", name, root.Name(), err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync dir of %s in %s: %w", name, root.Name(), err)
	}
	return nil
}
