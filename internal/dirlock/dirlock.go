// Package dirlock owns the lock that keeps one process at a time on a
// data directory. Two brokers on one directory both append to the same
// shard logs, each at its own idea of the next offset: acked records
// are overwritten (a review reproduced two records acked at one offset
// in every round), and the segment files no longer match either
// process's view. The lock is an advisory flock on <dir>/LOCK, held for
// the life of the process and dropped by the kernel when it exits,
// however it exits (kill -9 included), so a crash never leaves a stale
// lock behind.
package dirlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrInUse is returned by Take when another process holds the lock.
var ErrInUse = errors.New("dirlock: data directory in use")

// Name is the lock file's name in the directory.
const Name = "LOCK"

// Lock is a held lock on a directory.
type Lock struct{ f *os.File }

// Take locks dir, creating it and its lock file if need be, or fails
// with an error matching ErrInUse that names the process holding it
// (the pid it wrote in the file).
func Take(dir string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("dirlock: %w", err)
	}
	path := filepath.Join(dir, Name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("dirlock: %w", err)
	}
	if err := flock(f); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, errLocked) {
			who := "another process"
			if pid := strings.TrimSpace(string(holder)); pid != "" {
				who = "process " + pid
			}
			return nil, fmt.Errorf("%w: %s is used by %s (two processes on one data directory overwrite each other's records): stop it, or give this one its own directory", ErrInUse, dir, who)
		}
		return nil, fmt.Errorf("dirlock: lock %s: %w", path, err)
	}
	// Say who holds it, for the next one's error; the lock is what counts.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

// Release drops the lock. A nil Lock releases nothing.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the descriptor drops the flock
	l.f = nil
	return err
}
