//go:build linux

package lazyfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// model is what a power cut would take back: per file, the bytes changed
// since its last fsync (fileUndo); per directory, its listing as of its
// last fsync (dirs); the renames between directories not yet durable. It
// works on the backing directory only and knows nothing of FUSE: the nodes
// (node.go) call it before each change they pass through, under mu, so
// that a change and its undo record are one step.
type model struct {
	root    string // the backing directory
	rootIno uint64
	gone    string // where unlinked entries wait (hiddenName/goneName)

	files   map[uint64]*fileUndo // by backing inode: files changed since their last sync
	dirs    map[uint64]listing   // by backing inode: directories changed since their last sync, as of it
	renames []rename             // between two directories, not yet durable
	seq     uint64               // names entries moved into gone
}

// entry is one name of a directory listing.
type entry struct {
	ino uint64
	dir bool
}

// listing is a directory's entries by name.
type listing map[string]entry

// rename is a rename of ino from directory from (as name) into another
// directory, to: durable once to is fsynced, until then undone by Crash.
type rename struct {
	ino      uint64
	dir      bool
	from, to uint64
	name     string
}

// fileUndo is what restores one file to its content and size as of its
// last sync.
type fileUndo struct {
	f      *os.File // the backing file, read-write; holds the inode while the record lives
	synced int64    // the file's size at its last sync
	saved  []extent // the old bytes of every range below synced changed since; disjoint, by offset
}

// extent is bytes of a file at an offset.
type extent struct {
	off  int64
	data []byte
}

func (e extent) end() int64 { return e.off + int64(len(e.data)) }

func newModel(root string) (*model, error) {
	ino, err := inode(root)
	if err != nil {
		return nil, err
	}
	return &model{
		root:    root,
		rootIno: ino,
		gone:    filepath.Join(root, hiddenName, goneName),
		files:   map[uint64]*fileUndo{},
		dirs:    map[uint64]listing{},
	}, nil
}

// undo returns the undo record of the file with inode ino, creating it
// with open (the backing file, opened read-write) if the file has none:
// the file is as of its last sync until this change.
func (m *model) undo(ino uint64, open func() (*os.File, error)) (*fileUndo, error) {
	if u, ok := m.files[ino]; ok {
		return u, nil
	}
	f, err := open()
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	u := &fileUndo{f: f, synced: st.Size()}
	m.files[ino] = u
	return u, nil
}

// save keeps the bytes of [from, to) below the synced size that no earlier
// change since the last sync has saved: the first change of a byte keeps
// its synced value, later ones keep nothing.
func (u *fileUndo) save(from, to int64) error {
	to = min(to, u.synced)
	for from < to {
		// The first saved extent ending after from.
		i := sort.Search(len(u.saved), func(i int) bool { return u.saved[i].end() > from })
		if i < len(u.saved) && u.saved[i].off <= from {
			from = u.saved[i].end() // saved already
			continue
		}
		gapEnd := to
		if i < len(u.saved) {
			gapEnd = min(to, u.saved[i].off)
		}
		buf := make([]byte, gapEnd-from)
		n, err := u.f.ReadAt(buf, from)
		if n > 0 {
			u.saved = slices.Insert(u.saved, i, extent{off: from, data: buf[:n]})
		}
		if n < len(buf) {
			if err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			// Below the synced size but past the end of the file: the
			// shrink that cut it saved it (resize).
			return nil
		}
		from = gapEnd
	}
	return nil
}

// resize saves what changing the file's size to size changes: the bytes
// cut off, or those a growth fills with zeros.
func (u *fileUndo) resize(size int64) error {
	st, err := u.f.Stat()
	if err != nil {
		return err
	}
	return u.save(min(size, st.Size()), max(size, st.Size()))
}

// restore puts the saved bytes back and the file at its synced size, and
// closes the record's file.
func (u *fileUndo) restore() error {
	var err error
	for _, e := range u.saved {
		if _, werr := u.f.WriteAt(e.data, e.off); werr != nil && err == nil {
			err = werr
		}
	}
	if terr := u.f.Truncate(u.synced); terr != nil && err == nil {
		err = terr
	}
	if cerr := u.f.Close(); cerr != nil && err == nil {
		err = cerr
	}
	return err
}

// fileSynced drops the undo record of file ino: its content is durable.
func (m *model) fileSynced(ino uint64) {
	if u, ok := m.files[ino]; ok {
		u.f.Close()
		delete(m.files, ino)
	}
}

// touchDir is called before a change of an entry of the directory at
// path: the first since its last sync keeps its listing.
func (m *model) touchDir(path string) (uint64, error) {
	ino, err := inode(path)
	if err != nil {
		return 0, err
	}
	if _, ok := m.dirs[ino]; ok {
		return ino, nil
	}
	l, err := m.list(path, ino)
	if err != nil {
		return 0, err
	}
	m.dirs[ino] = l
	return ino, nil
}

// dirSynced makes the entries of directory ino (at path) durable, with
// the renames into it (whose old names leave their directories' durable
// listings as they arrive here). A rename out of it into a directory not
// yet synced stays undone: its old name stays in this listing.
func (m *model) dirSynced(ino uint64, path string) error {
	kept := m.renames[:0]
	for _, r := range m.renames {
		if r.to != ino {
			kept = append(kept, r)
			continue
		}
		if l, ok := m.dirs[r.from]; ok && l[r.name].ino == r.ino {
			delete(l, r.name)
		}
	}
	m.renames = kept
	if _, dirty := m.dirs[ino]; !dirty {
		return nil
	}
	l, err := m.list(path, ino)
	if err != nil {
		return err
	}
	pending := false
	for _, r := range m.renames {
		if r.from == ino {
			l[r.name] = entry{ino: r.ino, dir: r.dir}
			pending = true
		}
	}
	if pending {
		m.dirs[ino] = l
	} else {
		delete(m.dirs, ino)
	}
	return m.collect()
}

// unlinked moves the entry at path (a file, or a directory already found
// empty) into gone instead of removing it: a crash may bring it back. It
// returns where the entry went.
func (m *model) unlinked(path string) (string, error) {
	m.seq++
	to := filepath.Join(m.gone, strconv.FormatUint(m.seq, 10))
	return to, os.Rename(path, to)
}

// collect removes the entries of gone that no durable listing holds and
// no pending rename may bring back.
func (m *model) collect() error {
	held := map[uint64]bool{}
	for _, l := range m.dirs {
		for _, e := range l {
			held[e.ino] = true
		}
	}
	for _, r := range m.renames {
		held[r.ino] = true
	}
	ents, err := os.ReadDir(m.gone)
	if err != nil {
		return err
	}
	for _, de := range ents {
		p := filepath.Join(m.gone, de.Name())
		if ino, err := inode(p); err == nil && !held[ino] {
			if err := os.Remove(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// list reads the listing of the backing directory ino at path (the
// model's own directory left out of the root's).
func (m *model) list(path string, ino uint64) (listing, error) {
	ents, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	l := make(listing, len(ents))
	for _, de := range ents {
		if ino == m.rootIno && de.Name() == hiddenName {
			continue
		}
		ino, err := inode(filepath.Join(path, de.Name()))
		if err != nil {
			return nil, err
		}
		l[de.Name()] = entry{ino: ino, dir: de.IsDir()}
	}
	return l, nil
}

// crash reverts the backing directory to what was durable: every file
// changed since its last sync back to its content and size then, and the
// tree back to the durable listings of its directories. The model is
// clean afterwards: everything in the backing directory is durable.
func (m *model) crash() error {
	var errs []error
	for ino, u := range m.files {
		if err := u.restore(); err != nil {
			errs = append(errs, fmt.Errorf("restore inode %d: %w", ino, err))
		}
	}
	clear(m.files)
	if len(errs) > 0 {
		return errs[0]
	}
	if len(m.dirs) > 0 {
		if err := m.rebuild(); err != nil {
			return err
		}
	}
	clear(m.dirs)
	m.renames = nil
	if err := os.RemoveAll(m.gone); err != nil {
		return err
	}
	return os.Mkdir(m.gone, 0o700)
}

// rebuild makes the tree under the backing directory the durable one: it
// finds every inode (in the tree or in gone), works out the durable tree
// from the root (a changed directory's listing as of its last sync, an
// unchanged one's as it is), moves every inode out flat into a staging
// directory, then moves the durable tree's back into place. What is left
// in staging was not durable and is removed.
func (m *model) rebuild() error {
	where := map[uint64]string{}
	depth := map[uint64]int{}
	walk := func(top string, skip string) error {
		return filepath.WalkDir(top, func(p string, de fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if p == top {
				return nil
			}
			if p == skip {
				return filepath.SkipDir
			}
			ino, err := inode(p)
			if err != nil {
				return err
			}
			where[ino] = p
			depth[ino] = strings.Count(p, string(filepath.Separator))
			return nil
		})
	}
	hidden := filepath.Join(m.root, hiddenName)
	if err := walk(m.root, hidden); err != nil {
		return fmt.Errorf("find the inodes: %w", err)
	}
	if err := walk(m.gone, ""); err != nil {
		return fmt.Errorf("find the unlinked inodes: %w", err)
	}
	rootIno := m.rootIno

	// The durable tree, read before anything moves.
	durable := map[uint64]listing{}
	placed := map[uint64]bool{}
	var plan func(ino uint64, path string) error
	plan = func(ino uint64, path string) error {
		l, ok := m.dirs[ino]
		if !ok {
			var err error
			if l, err = m.list(path, ino); err != nil {
				return fmt.Errorf("read durable directory %s: %w", path, err)
			}
		}
		durable[ino] = l
		for name, e := range l {
			p, ok := where[e.ino]
			if !ok {
				return fmt.Errorf("durable entry %q (inode %d) of %s is nowhere in the backing directory", name, e.ino, path)
			}
			if placed[e.ino] {
				return fmt.Errorf("inode %d is durable under two names (%q of %s)", e.ino, name, path)
			}
			placed[e.ino] = true
			if e.dir {
				if err := plan(e.ino, p); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := plan(rootIno, m.root); err != nil {
		return err
	}

	// Flat: deepest first, so that each path is still valid when moved.
	stage := filepath.Join(hidden, stageName)
	if err := os.RemoveAll(stage); err != nil {
		return err
	}
	if err := os.Mkdir(stage, 0o700); err != nil {
		return err
	}
	inos := make([]uint64, 0, len(where))
	for ino := range where {
		inos = append(inos, ino)
	}
	sort.Slice(inos, func(i, j int) bool { return depth[inos[i]] > depth[inos[j]] })
	staged := func(ino uint64) string { return filepath.Join(stage, strconv.FormatUint(ino, 10)) }
	for _, ino := range inos {
		if err := os.Rename(where[ino], staged(ino)); err != nil {
			return fmt.Errorf("stage: %w", err)
		}
	}
	var place func(ino uint64, path string) error
	place = func(ino uint64, path string) error {
		for name, e := range durable[ino] {
			p := filepath.Join(path, name)
			if err := os.Rename(staged(e.ino), p); err != nil {
				return fmt.Errorf("put back: %w", err)
			}
			if e.dir {
				if err := place(e.ino, p); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := place(rootIno, m.root); err != nil {
		return err
	}
	return os.RemoveAll(stage)
}

// inode returns the inode number of the entry at path (not following a
// symbolic link).
func inode(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return 0, &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	return st.Ino, nil
}
