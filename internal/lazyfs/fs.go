//go:build linux

package lazyfs

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// The model's own directory in the backing directory, hidden from the
// mount: unlinked entries wait in goneName until no durable listing holds
// them; Crash stages the tree in stageName.
const (
	hiddenName = ".lazyfs"
	goneName   = "gone"
	stageName  = "stage"
)

// ErrUnavailable is returned by Mount where FUSE cannot be used at all:
// no /dev/fuse, or neither root nor fusermount3 to mount with, or a mount
// the system does not permit. Tests skip on it, saying why.
var ErrUnavailable = errors.New("lazyfs: FUSE is not available")

// ReleaseWait is how long Crash waits for the releases of files still
// open on the mount (the kernel sends them after a killed process has
// exited, asynchronously) before it refuses.
const ReleaseWait = 10 * time.Second

// FS is a mounted lazyfs.
type FS struct {
	backing, mountpoint string
	syncDelay           atomic.Int64 // the most a sync takes, in ns (SetSyncDelay)

	// mu guards the model, the open handles and cut. Each change is made
	// to the backing directory under it, together with its undo record.
	mu     sync.Mutex
	m      *model
	cut    bool           // since Cut, until Crash: no sync makes anything durable
	open   map[any]string // open file and directory handles -> path at open
	server *fuse.Server   // nil while not mounted
}

// Mount mounts a lazyfs over the directory backing at mountpoint (both
// must exist; mountpoint empty). What backing holds at Mount is taken as
// durable. It fails with an error matching ErrUnavailable where FUSE
// cannot be used.
func Mount(backing, mountpoint string) (*FS, error) {
	if err := available(); err != nil {
		return nil, err
	}
	backing, err := filepath.Abs(backing)
	if err != nil {
		return nil, err
	}
	if mountpoint, err = filepath.Abs(mountpoint); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(backing, hiddenName, goneName), 0o700); err != nil {
		return nil, fmt.Errorf("lazyfs: %w", err)
	}
	m, err := newModel(backing)
	if err != nil {
		return nil, fmt.Errorf("lazyfs: %w", err)
	}
	f := &FS{backing: backing, mountpoint: mountpoint, m: m, open: map[any]string{}}
	if err := f.mount(); err != nil {
		return nil, err
	}
	return f, nil
}

// available says why FUSE cannot be used here, or nil.
func available() error {
	dev, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	dev.Close()
	if os.Geteuid() != 0 {
		if _, err := exec.LookPath("fusermount3"); err != nil {
			return fmt.Errorf("%w: not root, and no fusermount3 to mount with: %v", ErrUnavailable, err)
		}
	}
	return nil
}

// mount serves a new tree over the backing directory at the mountpoint.
func (f *FS) mount() error {
	var st syscall.Stat_t
	if err := syscall.Stat(f.backing, &st); err != nil {
		return fmt.Errorf("lazyfs: %w", err)
	}
	lroot := &fs.LoopbackRoot{Path: f.backing, Dev: uint64(st.Dev)}
	root := &node{LoopbackNode: &fs.LoopbackNode{RootData: lroot}, fsys: f}
	lroot.RootNode = root
	timeout := time.Second
	server, err := fs.Mount(f.mountpoint, root, &fs.Options{
		EntryTimeout: &timeout,
		AttrTimeout:  &timeout,
		MountOptions: fuse.MountOptions{
			FsName:      "lazyfs:" + f.backing,
			Name:        "lazyfs",
			DirectMount: true, // mount(2) as root, else fusermount3
			// Every write reaches the model: no passthrough to the
			// backing file behind it (the kernel's write-back cache is
			// not asked for either).
			DisabledCapabilities: fuse.CAP_PASSTHROUGH,
		},
	})
	if err != nil {
		if errors.Is(err, syscall.EPERM) {
			return fmt.Errorf("%w: mount %s: %v", ErrUnavailable, f.mountpoint, err)
		}
		return fmt.Errorf("lazyfs: mount %s over %s: %w", f.mountpoint, f.backing, err)
	}
	f.mu.Lock()
	f.server = server
	f.mu.Unlock()
	return nil
}

// unmount unmounts and waits for the server's goroutines to end.
func (f *FS) unmount() error {
	f.mu.Lock()
	server := f.server
	f.mu.Unlock()
	if server == nil {
		return nil
	}
	if err := server.Unmount(); err != nil {
		return fmt.Errorf("lazyfs: unmount %s: %w", f.mountpoint, err)
	}
	server.Wait()
	f.mu.Lock()
	f.server = nil
	f.mu.Unlock()
	return nil
}

// Cut is the instant the power goes: from now until Crash, nothing
// becomes durable. A sync not returned by then (still in its delay: see
// SetSyncDelay), or called after, fails with EIO and makes nothing
// durable; writes and entry changes go on, to be undone by Crash. Call
// Cut, then kill the processes using the mount, then Crash: a process
// killed in a sync the filesystem has already taken is held by the
// kernel until the filesystem answers, so without Cut the sync would
// complete, durably, after the kill.
func (f *FS) Cut() {
	f.mu.Lock()
	f.cut = true
	f.mu.Unlock()
}

// Crash completes a power cut (it calls Cut if that was not called): it
// unmounts, reverts the backing directory to what was durable (see the
// package doc), and mounts it again at the same mountpoint, powered
// again. No process may have a file open on the mount (kill every
// process using it first): Crash waits up to ReleaseWait for the
// releases of files still open, and refuses, naming them, if some stay
// open.
func (f *FS) Crash() error {
	f.Cut()
	deadline := time.Now().Add(ReleaseWait)
	for {
		f.mu.Lock()
		var open []string
		for _, p := range f.open {
			open = append(open, p)
		}
		f.mu.Unlock()
		if len(open) == 0 {
			break
		}
		if time.Now().After(deadline) {
			slices.Sort(open)
			return fmt.Errorf("lazyfs: crash refused: %d files still open on %s after %v (is a process still using it?): %v", len(open), f.mountpoint, ReleaseWait, open)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := f.unmount(); err != nil {
		return fmt.Errorf("lazyfs: crash: %w", err)
	}
	m := f.lock()
	err := m.crash()
	f.cut = false
	f.unlock()
	if err != nil {
		return fmt.Errorf("lazyfs: crash: revert %s: %w", f.backing, err)
	}
	return f.mount()
}

// Unmount unmounts the filesystem as a clean shutdown would: what was
// written stays in the backing directory, durable or not, and the
// model's own directory is removed. The mountpoint must not be in use.
func (f *FS) Unmount() error {
	if err := f.unmount(); err != nil {
		return err
	}
	m := f.lock()
	for ino := range m.files {
		m.fileSynced(ino)
	}
	clear(m.dirs)
	m.renames = nil
	f.unlock()
	return os.RemoveAll(filepath.Join(f.backing, hiddenName))
}

// SetSyncDelay makes every fsync, fdatasync and directory fsync from now
// on take a random time up to most (uniform), as a disk's flushes do,
// instead of returning at once (a sync through the mount flushes no
// disk). What a sync makes durable becomes durable at its end: a crash
// during it loses it. Without a delay, what a process does between
// handing a sync to the disk and the sync's return (a reply sent before
// its own fdatasync has returned, say) is hardly ever caught by a crash;
// with disks of different delays, a process on a fast disk that counts
// on one on a slow disk can be. Default 0.
func (f *FS) SetSyncDelay(most time.Duration) { f.syncDelay.Store(int64(most)) }

// syncing waits as long as a sync takes (SetSyncDelay).
func (f *FS) syncing() {
	if most := f.syncDelay.Load(); most > 0 {
		time.Sleep(time.Duration(rand.Int64N(most + 1)))
	}
}

// lock locks the model and returns it.
func (f *FS) lock() *model {
	f.mu.Lock()
	return f.m
}

func (f *FS) unlock() { f.mu.Unlock() }

// opened counts h open.
func (f *FS) opened(h any, path string) {
	f.mu.Lock()
	f.open[h] = path
	f.mu.Unlock()
}

// released counts h closed.
func (f *FS) released(h any) {
	f.mu.Lock()
	delete(f.open, h)
	f.mu.Unlock()
}
