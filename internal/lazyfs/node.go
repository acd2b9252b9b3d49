//go:build linux

package lazyfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is a file or directory of the mount: go-fuse's loopback node, with
// every operation that changes a file's bytes or a directory's entries
// going through the model first, and the operations the model does not
// cover refused.
type node struct {
	*fs.LoopbackNode
	fsys *FS
}

var (
	_ fs.NodeWrapChilder    = (*node)(nil)
	_ fs.NodeLookuper       = (*node)(nil)
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.NodeMkdirer        = (*node)(nil)
	_ fs.NodeMknoder        = (*node)(nil)
	_ fs.NodeSymlinker      = (*node)(nil)
	_ fs.NodeLinker         = (*node)(nil)
	_ fs.NodeTmpfiler       = (*node)(nil)
	_ fs.NodeUnlinker       = (*node)(nil)
	_ fs.NodeRmdirer        = (*node)(nil)
	_ fs.NodeRenamer        = (*node)(nil)
	_ fs.NodeSetattrer      = (*node)(nil)
	_ fs.NodeCopyFileRanger = (*node)(nil)
)

// WrapChild makes every node of the tree a *node.
func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*fs.LoopbackNode), fsys: n.fsys}
}

// path is the node's path in the backing directory.
func (n *node) path() string {
	return filepath.Join(n.RootData.Path, n.Path(nil))
}

// hidden reports whether name in n is the model's own directory.
func (n *node) hidden(name string) bool { return name == hiddenName && n.IsRoot() }

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.hidden(name) {
		return nil, syscall.ENOENT
	}
	return n.LoopbackNode.Lookup(ctx, name, out)
}

// changeDir runs op, a change of an entry of n, under the model's lock,
// after the model has kept n's listing.
func (n *node) changeDir(name string, op func() syscall.Errno) syscall.Errno {
	if n.hidden(name) {
		return syscall.EPERM
	}
	m := n.fsys.lock()
	defer n.fsys.unlock()
	if _, err := m.touchDir(n.path()); err != nil {
		return fs.ToErrno(err)
	}
	return op()
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (ch *fs.Inode, fh fs.FileHandle, fuseFlags uint32, errno syscall.Errno) {
	p := filepath.Join(n.path(), name)
	errno = n.changeDir(name, func() syscall.Errno {
		if flags&syscall.O_TRUNC != 0 {
			// An existing file (a CREATE that raced with another):
			// the open truncates it.
			if _, err := os.Lstat(p); err == nil {
				if errno := n.fsys.m.resizePath(p, 0); errno != 0 {
					return errno
				}
			}
		}
		ch, fh, fuseFlags, errno = n.LoopbackNode.Create(ctx, name, flags, mode, out)
		return errno
	})
	if errno != 0 {
		return nil, nil, 0, errno
	}
	h, errno := n.fsys.newHandle(fh, p)
	return ch, h, fuseFlags, errno
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_TRUNC != 0 {
		// The kernel sends O_TRUNC as a size change unless the mount
		// takes it with the open (atomic_o_trunc, not asked for);
		// covered both ways.
		m := n.fsys.lock()
		errno := m.resizePath(n.path(), 0)
		n.fsys.unlock()
		if errno != 0 {
			return nil, 0, errno
		}
	}
	inner, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	fh, errno := n.fsys.newHandle(inner, n.path())
	return fh, fuseFlags, errno
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	d, errno := n.fsys.newDirHandle(n.path(), n.IsRoot())
	if errno != 0 {
		return nil, 0, errno
	}
	return d, 0, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (ch *fs.Inode, errno syscall.Errno) {
	errno = n.changeDir(name, func() syscall.Errno {
		ch, errno = n.LoopbackNode.Mkdir(ctx, name, mode, out)
		return errno
	})
	return ch, errno
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (ch *fs.Inode, errno syscall.Errno) {
	errno = n.changeDir(name, func() syscall.Errno {
		ch, errno = n.LoopbackNode.Mknod(ctx, name, mode, rdev, out)
		return errno
	})
	return ch, errno
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (ch *fs.Inode, errno syscall.Errno) {
	errno = n.changeDir(name, func() syscall.Errno {
		ch, errno = n.LoopbackNode.Symlink(ctx, target, name, out)
		return errno
	})
	return ch, errno
}

// Link is refused: an inode under two names is not in the model.
func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

// Tmpfile is refused (O_TMPFILE): a file with no name, linked later, is
// not in the model.
func (n *node) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EOPNOTSUPP
}

// CopyFileRange is refused, so that the kernel copies with reads and
// writes, which the model sees.
func (n *node) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode, fhOut fs.FileHandle, offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	return 0, syscall.EOPNOTSUPP
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	p := filepath.Join(n.path(), name)
	return n.changeDir(name, func() syscall.Errno {
		fi, err := os.Lstat(p)
		if err != nil {
			return fs.ToErrno(err)
		}
		if fi.IsDir() {
			return syscall.EISDIR
		}
		_, err = n.fsys.m.unlinked(p)
		return fs.ToErrno(err)
	})
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	p := filepath.Join(n.path(), name)
	return n.changeDir(name, func() syscall.Errno {
		if errno := emptyDir(p); errno != 0 {
			return errno
		}
		_, err := n.fsys.m.unlinked(p)
		return fs.ToErrno(err)
	})
}

// emptyDir returns 0 if p is an empty directory, else the error rmdir(p)
// would fail with.
func emptyDir(p string) syscall.Errno {
	fi, err := os.Lstat(p)
	if err != nil {
		return fs.ToErrno(err)
	}
	if !fi.IsDir() {
		return syscall.ENOTDIR
	}
	d, err := os.Open(p)
	if err != nil {
		return fs.ToErrno(err)
	}
	defer d.Close()
	if names, _ := d.Readdirnames(1); len(names) > 0 {
		return syscall.ENOTEMPTY
	}
	return 0
}

// Rename renames with flags 0 or RENAME_NOREPLACE (RENAME_EXCHANGE and
// RENAME_WHITEOUT are refused). A target it replaces is moved into gone,
// as an unlinked entry is.
func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok || np.fsys != n.fsys {
		return syscall.EXDEV
	}
	if flags&^unix.RENAME_NOREPLACE != 0 {
		return syscall.EINVAL
	}
	if n.hidden(name) || np.hidden(newName) {
		return syscall.EPERM
	}
	m := n.fsys.lock()
	defer n.fsys.unlock()
	fromDir, toDir := n.path(), np.path()
	from, to := filepath.Join(fromDir, name), filepath.Join(toDir, newName)
	src, err := os.Lstat(from)
	if err != nil {
		return fs.ToErrno(err)
	}
	dst, err := os.Lstat(to)
	switch {
	case err == nil && os.SameFile(src, dst):
		return 0 // the same inode: rename does nothing
	case err == nil && flags&unix.RENAME_NOREPLACE != 0:
		return syscall.EEXIST
	case err == nil && dst.IsDir() && !src.IsDir():
		return syscall.EISDIR
	case err == nil && !dst.IsDir() && src.IsDir():
		return syscall.ENOTDIR
	case err == nil && dst.IsDir():
		if errno := emptyDir(to); errno != 0 {
			return errno
		}
	case err != nil && !os.IsNotExist(err):
		return fs.ToErrno(err)
	}
	fromIno, err := m.touchDir(fromDir)
	if err != nil {
		return fs.ToErrno(err)
	}
	toIno, err := m.touchDir(toDir)
	if err != nil {
		return fs.ToErrno(err)
	}
	var replaced string // where the entry the rename replaces went
	if dst != nil {
		if replaced, err = m.unlinked(to); err != nil {
			return fs.ToErrno(err)
		}
	}
	if err := os.Rename(from, to); err != nil {
		if replaced != "" {
			os.Rename(replaced, to)
		}
		return fs.ToErrno(err)
	}
	if fromIno != toIno {
		ino, err := inode(to)
		if err != nil {
			return fs.ToErrno(err)
		}
		m.renames = append(m.renames, rename{ino: ino, dir: src.IsDir(), from: fromIno, to: toIno, name: name})
	}
	return 0
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	var inner fs.FileHandle
	h, _ := f.(*handle)
	if h != nil {
		inner = h.lf
	}
	size, resize := in.GetSize()
	if !resize {
		return n.LoopbackNode.Setattr(ctx, inner, in, out)
	}
	m := n.fsys.lock()
	defer n.fsys.unlock()
	var errno syscall.Errno
	if h != nil {
		errno = m.resizeHandle(h, int64(size))
	} else {
		errno = m.resizePath(n.path(), int64(size))
	}
	if errno != 0 {
		return errno
	}
	return n.LoopbackNode.Setattr(ctx, inner, in, out)
}

// resizePath keeps what changing the size of the file at path to size
// would take back.
func (m *model) resizePath(path string, size int64) syscall.Errno {
	ino, err := inode(path)
	if err != nil {
		return fs.ToErrno(err)
	}
	u, err := m.undo(ino, func() (*os.File, error) { return os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW, 0) })
	if err != nil {
		return fs.ToErrno(err)
	}
	return fs.ToErrno(u.resize(size))
}

// resizeHandle is resizePath for the file open as h.
func (m *model) resizeHandle(h *handle, size int64) syscall.Errno {
	u, err := m.undo(h.ino, h.reopen)
	if err != nil {
		return fs.ToErrno(err)
	}
	return fs.ToErrno(u.resize(size))
}

// handle is an open file: go-fuse's loopback file, with writes, size
// changes and fsync going through the model. It implements only the
// operations listed below (not passthrough, ioctl or locks: the kernel
// keeps flock and POSIX locks itself).
type handle struct {
	fsys *FS
	lf   *fs.LoopbackFile
	fd   int
	ino  uint64
	path string // at open, for Crash's error
}

var (
	_ fs.FileReader    = (*handle)(nil)
	_ fs.FileWriter    = (*handle)(nil)
	_ fs.FileWritever  = (*handle)(nil)
	_ fs.FileFsyncer   = (*handle)(nil)
	_ fs.FileFlusher   = (*handle)(nil)
	_ fs.FileReleaser  = (*handle)(nil)
	_ fs.FileGetattrer = (*handle)(nil)
	_ fs.FileStatxer   = (*handle)(nil)
	_ fs.FileAllocater = (*handle)(nil)
	_ fs.FileLseeker   = (*handle)(nil)
)

// newHandle wraps inner, a *fs.LoopbackFile, and counts it open.
func (f *FS) newHandle(inner fs.FileHandle, path string) (*handle, syscall.Errno) {
	lf := inner.(*fs.LoopbackFile)
	fd, ok := lf.PassthroughFd()
	if !ok {
		lf.Release(context.Background())
		return nil, syscall.EBADF
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		lf.Release(context.Background())
		return nil, fs.ToErrno(err)
	}
	h := &handle{fsys: f, lf: lf, fd: fd, ino: st.Ino, path: path}
	f.opened(h, path)
	return h, 0
}

// reopen opens the handle's file again, read-write (the handle may be
// write-only), for its undo record.
func (h *handle) reopen() (*os.File, error) {
	return os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", h.fd), os.O_RDWR, 0)
}

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return h.lf.Read(ctx, dest, off)
}

// beforeWrite saves what writing n bytes at off changes.
func (h *handle) beforeWrite(m *model, off, n int64) syscall.Errno {
	u, err := m.undo(h.ino, h.reopen)
	if err != nil {
		return fs.ToErrno(err)
	}
	return fs.ToErrno(u.save(off, off+n))
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	m := h.fsys.lock()
	defer h.fsys.unlock()
	if errno := h.beforeWrite(m, off, int64(len(data))); errno != 0 {
		return 0, errno
	}
	return h.lf.Write(ctx, data, off)
}

func (h *handle) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	var n int64
	for _, b := range data {
		n += int64(len(b))
	}
	m := h.fsys.lock()
	defer h.fsys.unlock()
	if errno := h.beforeWrite(m, off, n); errno != 0 {
		return 0, errno
	}
	return h.lf.Writev(ctx, data, off)
}

// Fsync makes the file's content durable, fsync and fdatasync alike, at
// the end of the sync delay (the kernel holds the file's lock meanwhile:
// no write comes in between), unless the power was cut by then (EIO). It
// does not fsync the backing file: durability is the model's, not the
// backing disk's.
func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	h.fsys.syncing()
	m := h.fsys.lock()
	defer h.fsys.unlock()
	if h.fsys.cut {
		return syscall.EIO
	}
	m.fileSynced(h.ino)
	return 0
}

func (h *handle) Flush(ctx context.Context) syscall.Errno { return h.lf.Flush(ctx) }

func (h *handle) Release(ctx context.Context) syscall.Errno {
	h.fsys.released(h)
	return h.lf.Release(ctx)
}

func (h *handle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return h.lf.Getattr(ctx, out)
}

func (h *handle) Statx(ctx context.Context, flags uint32, mask uint32, out *fuse.StatxOut) syscall.Errno {
	return h.lf.Statx(ctx, flags, mask, out)
}

func (h *handle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	return h.lf.Lseek(ctx, off, whence)
}

// Allocate passes fallocate through: plain or FALLOC_FL_KEEP_SIZE changes
// no byte below the synced size (past the end of a shrunk file, those
// bytes were saved when it shrank); punching a hole or zeroing a range
// saves the range first; collapsing or inserting a range is refused.
func (h *handle) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	const shifts = unix.FALLOC_FL_COLLAPSE_RANGE | unix.FALLOC_FL_INSERT_RANGE
	if mode&shifts != 0 {
		return syscall.EOPNOTSUPP
	}
	m := h.fsys.lock()
	defer h.fsys.unlock()
	if mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_ZERO_RANGE) != 0 {
		if errno := h.beforeWrite(m, int64(off), int64(size)); errno != 0 {
			return errno
		}
	}
	return h.lf.Allocate(ctx, off, size, mode)
}

// dirHandle is an open directory: its fsync makes its entries durable,
// and the root's listing leaves out the model's own directory.
type dirHandle struct {
	fsys *FS
	ds   fs.DirStream
	dir  *os.File // its own descriptor of the directory, wherever renames take it
	ino  uint64
	root bool
}

var (
	_ fs.FileReaddirenter = (*dirHandle)(nil)
	_ fs.FileSeekdirer    = (*dirHandle)(nil)
	_ fs.FileReleasedirer = (*dirHandle)(nil)
	_ fs.FileFsyncdirer   = (*dirHandle)(nil)
)

// newDirHandle opens the directory at path, with go-fuse's loopback
// directory stream for its entries, and counts it open.
func (f *FS) newDirHandle(path string, root bool) (*dirHandle, syscall.Errno) {
	ds, errno := fs.NewLoopbackDirStream(path)
	if errno != 0 {
		return nil, errno
	}
	dir, err := os.Open(path)
	if err != nil {
		ds.Close()
		return nil, fs.ToErrno(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(dir.Fd()), &st); err != nil {
		ds.Close()
		dir.Close()
		return nil, fs.ToErrno(err)
	}
	d := &dirHandle{fsys: f, ds: ds, dir: dir, ino: st.Ino, root: root}
	f.opened(d, path)
	return d, 0
}

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	for {
		de, errno := d.ds.(fs.FileReaddirenter).Readdirent(ctx)
		if errno != 0 || de == nil || !d.root || de.Name != hiddenName {
			return de, errno
		}
	}
}

func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	return d.ds.(fs.FileSeekdirer).Seekdir(ctx, off)
}

func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) {
	d.fsys.released(d)
	d.ds.Close()
	d.dir.Close()
}

// Fsyncdir makes the directory's entries durable, at the end of the sync
// delay (the kernel holds the directory's lock meanwhile: no entry
// changes in between), unless the power was cut by then (EIO). It does
// not fsync the backing directory.
func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	d.fsys.syncing()
	m := d.fsys.lock()
	defer d.fsys.unlock()
	if d.fsys.cut {
		return syscall.EIO
	}
	return fs.ToErrno(m.dirSynced(d.ino, fmt.Sprintf("/proc/self/fd/%d", d.dir.Fd())))
}
