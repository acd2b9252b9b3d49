// Package atomicfile owns the one way Felix replaces a small file whole:
// written to a new temporary file beside its final name, fsynced,
// renamed over it, and the directory fsynced, so that a reader (or a
// restart after a crash) sees either the old content or the new, never a
// part, and the new content survives a power loss once WriteFile
// returns. It also owns the way Felix creates a directory that must
// survive a power loss (MkdirAll, MkdirIn): the parent of every
// directory created is fsynced, without which the new name, and
// everything written under it, may be gone after the power comes back,
// however often the files under it were fsynced.
//
// The temporary file is created afresh (O_CREATE|O_EXCL, under a random
// name): never a fixed name that another local user could have placed a
// link at beforehand, which a write would follow to any file the process
// can write. A process killed between creating it and renaming it leaves
// it behind; the next write of the same name removes such files once
// they are a minute old.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// WriteFile replaces path with data, with permissions perm. On failure
// path is unchanged and the temporary file is removed.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	root, err := os.OpenRoot(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer root.Close()
	return WriteFileIn(root, filepath.Base(path), data, perm)
}

// WriteFileIn is WriteFile for a file named name inside root (a path
// relative to it, resolved by the root so that it cannot lead out).
func WriteFileIn(root *os.Root, name string, data []byte, perm os.FileMode) (err error) {
	f, tmp, err := createTemp(root, name)
	if err != nil {
		return fmt.Errorf("create a temporary file for %s in %s: %w", name, root.Name(), err)
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
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("chmod %s in %s: %w", tmp, root.Name(), err)
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
	removeStaleTemps(root, name, time.Now())
	return syncDirIn(root, filepath.Dir(name))
}

// staleTempAge is how old another temporary file of the same name must
// be before WriteFileIn removes it: a write in progress (another writer
// of the same name, between its create and its rename) takes far less.
const staleTempAge = time.Minute

// removeStaleTemps removes the temporary files of name that a process
// killed between creating one and renaming it left behind (createTemp's
// names: ".<base>.tmp-<n>"), once they are staleTempAge old, so that
// crashes do not pile them up. It is best effort: a file it cannot read
// or remove stays, and the write that called it has succeeded anyway.
// The directory is fsynced afterwards by the caller, with the rename.
func removeStaleTemps(root *os.Root, name string, now time.Time) {
	dir := filepath.Dir(name)
	d, err := root.Open(dir)
	if err != nil {
		return
	}
	entries, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return
	}
	prefix := "." + filepath.Base(name) + ".tmp-"
	for _, e := range entries {
		n, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || !e.Type().IsRegular() {
			continue
		}
		if _, err := strconv.ParseUint(n, 10, 32); err != nil {
			continue // not one of createTemp's names
		}
		if fi, err := e.Info(); err != nil || now.Sub(fi.ModTime()) < staleTempAge {
			continue
		}
		_ = root.Remove(filepath.Join(dir, e.Name()))
	}
}

// syncDirIn fsyncs the directory dir of root.
func syncDirIn(root *os.Root, dir string) error {
	d, err := root.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir %s in %s: %w", dir, root.Name(), err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync dir %s in %s: %w", dir, root.Name(), err)
	}
	return nil
}

// MkdirIn creates the directory name in root (its parent must exist),
// with permissions perm, and fsyncs its parent, so that it survives a
// power loss. It reports whether it created it: an existing directory
// (or other file: the caller checks what it is) is no error.
func MkdirIn(root *os.Root, name string, perm os.FileMode) (created bool, err error) {
	if err := root.Mkdir(name, perm); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return false, nil
		}
		return false, fmt.Errorf("create %q in %s: %w", name, root.Name(), err)
	}
	return true, syncDirIn(root, filepath.Dir(name))
}

// MkdirAll is os.MkdirAll that fsyncs the parent of every directory it
// creates, the first one's included, so that path survives a power loss
// once it returns.
func MkdirAll(path string, perm os.FileMode) error {
	path = filepath.Clean(path)
	if fi, err := os.Stat(path); err == nil {
		if !fi.IsDir() {
			return &fs.PathError{Op: "mkdir", Path: path, Err: syscall.ENOTDIR}
		}
		return nil
	}
	if parent := filepath.Dir(path); parent != path {
		if err := MkdirAll(parent, perm); err != nil {
			return err
		}
	}
	if err := os.Mkdir(path, perm); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil // made meanwhile, by someone who syncs it
		}
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir fsyncs directory dir, so that the names of files created,
// renamed or removed in it survive a power loss.
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

// createTemp creates a new file beside name in root, ".<base>.tmp-<n>",
// as os.CreateTemp does: O_EXCL, so that an existing file or link
// (dangling or not) at the name chosen is never opened, and another
// name is tried.
func createTemp(root *os.Root, name string) (*os.File, string, error) {
	prefix := filepath.Join(filepath.Dir(name), "."+filepath.Base(name)+".tmp-")
	for range 100 {
		tmp := prefix + strconv.FormatUint(uint64(rand.Uint32()), 10)
		f, err := root.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return f, tmp, err
	}
	return nil, "", fmt.Errorf("100 names like %s* taken", prefix)
}
