//go:build linux

package lazyfs_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/felix-broker/felix/internal/lazyfs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// mount mounts a lazyfs over a new backing directory and returns it and
// its mountpoint; it is unmounted when the test ends. It skips the test
// where FUSE cannot be used, saying why.
func mount(t *testing.T) (*lazyfs.FS, string) {
	t.Helper()
	mnt := t.TempDir()
	return lazyfs.MountForTest(t, mnt), mnt
}

// write creates or truncates the file at path and writes data to it, with
// no sync.
func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeAt writes data at off into the existing file at path, with no
// sync.
func writeAt(t *testing.T, path string, off int64, data string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte(data), off); err != nil {
		t.Fatal(err)
	}
}

// fdatasync fdatasyncs the file at path.
func fdatasync(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
}

// fsync fsyncs the file or directory at path (a directory's fsync reaches
// the filesystem as FSYNCDIR).
func fsync(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// durable writes data to the file at path and makes it and its name
// durable.
func durable(t *testing.T, path, data string) {
	t.Helper()
	write(t, path, data)
	fsync(t, path)
	fsync(t, filepath.Dir(path))
}

// mkdir creates the directory at path, with no sync.
func mkdir(t *testing.T, path string) {
	t.Helper()
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
}

// durableDirs creates the directories names in dir, durably.
func durableDirs(t *testing.T, dir string, names ...string) {
	t.Helper()
	for _, name := range names {
		mkdir(t, filepath.Join(dir, name))
	}
	fsync(t, dir)
}

// rename renames from to to, with no sync.
func rename(t *testing.T, from, to string) {
	t.Helper()
	if err := os.Rename(from, to); err != nil {
		t.Fatal(err)
	}
}

// replace replaces the file at path with one holding data the way
// package atomicfile does, but for the directory's fsync: written beside
// it, fsynced, renamed over it.
func replace(t *testing.T, path, data string) {
	t.Helper()
	write(t, path+".tmp", data)
	fsync(t, path+".tmp")
	rename(t, path+".tmp", path)
}

// remove unlinks the file at path, with no sync.
func remove(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}

// tree returns every file of the tree at dir with its content, and every
// directory with a trailing slash, sorted.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			out = append(out, rel+"/")
			return nil
		}
		b, err := os.ReadFile(p)
		out = append(out, rel+"="+string(b))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// TestCrash runs each case on a new mount: before makes a durable state,
// change changes it, and after Crash the tree must be want.
func TestCrash(t *testing.T) {
	// Two durable directories, x holding a durable file f.
	xyf := func(t *testing.T, d string) {
		durableDirs(t, d, "x", "y")
		durable(t, d+"/x/f", "F")
	}
	// Renaming x/f to y/g, then fsyncing sync.
	moveAndSync := func(sync string) func(t *testing.T, d string) {
		return func(t *testing.T, d string) {
			rename(t, d+"/x/f", d+"/y/g")
			fsync(t, d+"/"+sync)
		}
	}
	for _, c := range []struct {
		name   string
		before func(t *testing.T, dir string)
		change func(t *testing.T, dir string)
		want   []string
	}{
		{
			name:   "write without sync is lost",
			before: func(t *testing.T, d string) { durable(t, d+"/f", "synced") },
			change: func(t *testing.T, d string) { writeAt(t, d+"/f", 6, " and more") },
			want:   []string{"f=synced"},
		},
		{
			name:   "write then fdatasync is kept",
			before: func(t *testing.T, d string) { durable(t, d+"/f", "synced") },
			change: func(t *testing.T, d string) {
				writeAt(t, d+"/f", 6, " and more")
				fdatasync(t, d+"/f")
			},
			want: []string{"f=synced and more"},
		},
		{
			name: "overwrite in the middle of a synced file: the old bytes come back",
			before: func(t *testing.T, d string) {
				durable(t, d+"/f", "0123456789")
			},
			change: func(t *testing.T, d string) {
				writeAt(t, d+"/f", 3, "abc")
				writeAt(t, d+"/f", 4, "XYZW")      // over the first write, and past it
				writeAt(t, d+"/f", 8, "tail past") // past the synced end
			},
			want: []string{"f=0123456789"},
		},
		{
			name:   "create without a directory fsync is lost, even fsynced",
			before: func(t *testing.T, d string) {},
			change: func(t *testing.T, d string) {
				write(t, d+"/new", "data")
				fsync(t, d+"/new")
			},
			want: nil,
		},
		{
			name:   "create, file fsync, directory fsync: kept",
			before: func(t *testing.T, d string) {},
			change: func(t *testing.T, d string) { durable(t, d+"/new", "data") },
			want:   []string{"new=data"},
		},
		{
			name:   "create and directory fsync, no file fsync: the name is kept, empty",
			before: func(t *testing.T, d string) {},
			change: func(t *testing.T, d string) {
				write(t, d+"/new", "data")
				fsync(t, d)
			},
			want: []string{"new="},
		},
		{
			name:   "rename without a directory fsync is reverted",
			before: func(t *testing.T, d string) { durable(t, d+"/a", "A") },
			change: func(t *testing.T, d string) {
				rename(t, d+"/a", d+"/b")
			},
			want: []string{"a=A"},
		},
		{
			name:   "rename, then a directory fsync: kept",
			before: func(t *testing.T, d string) { durable(t, d+"/a", "A") },
			change: func(t *testing.T, d string) {
				rename(t, d+"/a", d+"/b")
				fsync(t, d)
			},
			want: []string{"b=A"},
		},
		{
			name:   "replace by rename (atomicfile) without the directory fsync: the old file is back",
			before: func(t *testing.T, d string) { durable(t, d+"/f", "old") },
			change: func(t *testing.T, d string) { replace(t, d+"/f", "new") },
			want:   []string{"f=old"},
		},
		{
			name:   "replace by rename with the directory fsync: the new file",
			before: func(t *testing.T, d string) { durable(t, d+"/f", "old") },
			change: func(t *testing.T, d string) {
				replace(t, d+"/f", "new")
				fsync(t, d)
			},
			want: []string{"f=new"},
		},
		{
			name:   "unlink without a directory fsync: back, with its synced content",
			before: func(t *testing.T, d string) { durable(t, d+"/f", "synced") },
			change: func(t *testing.T, d string) {
				writeAt(t, d+"/f", 0, "changed and longer")
				remove(t, d+"/f")
			},
			want: []string{"f=synced"},
		},
		{
			name:   "unlink, then a directory fsync: gone",
			before: func(t *testing.T, d string) { durable(t, d+"/f", "synced") },
			change: func(t *testing.T, d string) {
				remove(t, d+"/f")
				fsync(t, d)
			},
			want: nil,
		},
		{
			name:   "truncate without sync is reverted",
			before: func(t *testing.T, d string) { durable(t, d+"/f", "0123456789") },
			change: func(t *testing.T, d string) {
				if err := os.Truncate(d+"/f", 4); err != nil {
					t.Fatal(err)
				}
				writeAt(t, d+"/f", 6, "xy") // grows it again, a hole in between
			},
			want: []string{"f=0123456789"},
		},
		{
			name:   "truncate then fsync is kept",
			before: func(t *testing.T, d string) { durable(t, d+"/f", "0123456789") },
			change: func(t *testing.T, d string) {
				if err := os.Truncate(d+"/f", 4); err != nil {
					t.Fatal(err)
				}
				fsync(t, d+"/f")
			},
			want: []string{"f=0123"},
		},
		{
			name:   "open with O_TRUNC and rewrite, no sync: the old content",
			before: func(t *testing.T, d string) { durable(t, d+"/f", "old content") },
			change: func(t *testing.T, d string) { write(t, d+"/f", "new") },
			want:   []string{"f=old content"},
		},
		{
			name:   "mkdir without the parent's fsync: gone with what it holds, synced or not",
			before: func(t *testing.T, d string) {},
			change: func(t *testing.T, d string) {
				mkdir(t, d+"/sub")
				durable(t, d+"/sub/f", "data")
			},
			want: nil,
		},
		{
			name:   "mkdir and the parent's fsync: kept",
			before: func(t *testing.T, d string) {},
			change: func(t *testing.T, d string) {
				durableDirs(t, d, "sub")
				durable(t, d+"/sub/f", "data")
			},
			want: []string{"sub/", "sub/f=data"},
		},
		{
			name: "rmdir without the parent's fsync: back, with its synced files",
			before: func(t *testing.T, d string) {
				durableDirs(t, d, "sub")
				durable(t, d+"/sub/f", "data")
			},
			change: func(t *testing.T, d string) {
				if err := os.RemoveAll(d + "/sub"); err != nil {
					t.Fatal(err)
				}
			},
			want: []string{"sub/", "sub/f=data"},
		},
		{
			name:   "rename between directories, the source's fsync only: reverted",
			before: xyf,
			change: moveAndSync("x"),
			want:   []string{"x/", "x/f=F", "y/"},
		},
		{
			name:   "rename between directories, the target's fsync: moved as one",
			before: xyf,
			change: moveAndSync("y"),
			want:   []string{"x/", "y/", "y/g=F"},
		},
		{
			name: "a renamed directory keeps what was durable in it",
			before: func(t *testing.T, d string) {
				durableDirs(t, d, "x")
				durable(t, d+"/x/f", "F")
			},
			change: func(t *testing.T, d string) {
				rename(t, d+"/x", d+"/z")
				fsync(t, d)
				write(t, d+"/z/new", "not durable")
				writeAt(t, d+"/z/f", 0, "G")
			},
			want: []string{"z/", "z/f=F"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			fsys, mnt := mount(t)
			c.before(t, mnt)
			c.change(t, mnt)
			if err := fsys.Crash(); err != nil {
				t.Fatal(err)
			}
			if got := tree(t, mnt); !slices.Equal(got, c.want) {
				t.Errorf("after Crash: %q, want %q", got, c.want)
			}
			// And the mount works on after it.
			durable(t, mnt+"/after", "x")
			if err := fsys.Crash(); err != nil {
				t.Fatal(err)
			}
			if got := tree(t, mnt); !slices.Contains(got, "after=x") {
				t.Errorf("after a second Crash: %q, want after=x among them", got)
			}
		})
	}
}

// TestCrashRefusedWhileOpen checks that Crash refuses, naming the file,
// while a file is open on the mount, and works once it is closed.
func TestCrashRefusedWhileOpen(t *testing.T) {
	if testing.Short() {
		t.Skip("waits lazyfs.ReleaseWait")
	}
	fsys, mnt := mount(t)
	f, err := os.Create(mnt + "/open")
	if err != nil {
		t.Fatal(err)
	}
	err = fsys.Crash()
	if err == nil || !strings.Contains(err.Error(), "open") || !strings.Contains(err.Error(), "still open") {
		t.Errorf("Crash with a file open: %v, want a refusal naming it", err)
	}
	f.Close()
	if err := fsys.Crash(); err != nil {
		t.Fatalf("Crash after the close: %v", err)
	}
	if got := tree(t, mnt); len(got) != 0 {
		t.Errorf("after Crash: %q, want nothing (the create was not durable)", got)
	}
}

// TestHiddenDirectory checks that the model's own directory in the
// backing directory cannot be seen or touched through the mount.
func TestHiddenDirectory(t *testing.T) {
	_, mnt := mount(t)
	if _, err := os.Stat(mnt + "/.lazyfs"); !os.IsNotExist(err) {
		t.Errorf("stat .lazyfs: %v, want not found", err)
	}
	if err := os.Mkdir(mnt+"/.lazyfs", 0o755); err == nil {
		t.Errorf("mkdir .lazyfs succeeded")
	}
	durable(t, mnt+"/f", "x")
	if got := tree(t, mnt); !slices.Equal(got, []string{"f=x"}) {
		t.Errorf("listing: %q", got)
	}
}

// TestCut checks that nothing becomes durable between Cut and Crash: a
// sync then fails with EIO, and the crash takes back what it synced.
func TestCut(t *testing.T) {
	fsys, mnt := mount(t)
	durable(t, mnt+"/f", "before")
	fsys.Cut()
	writeAt(t, mnt+"/f", 0, "after!")
	f, err := os.OpenFile(mnt+"/f", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fdatasync(int(f.Fd())); !errors.Is(err, unix.EIO) {
		t.Errorf("fdatasync after Cut: %v, want EIO", err)
	}
	f.Close()
	if err := fsys.Crash(); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, mnt); !slices.Equal(got, []string{"f=before"}) {
		t.Errorf("after Crash: %q, want the content synced before Cut", got)
	}
	durable(t, mnt+"/f", "powered again") // fails the test if a sync fails
}

// TestSyncDelay checks that syncs take time with SetSyncDelay.
func TestSyncDelay(t *testing.T) {
	fsys, mnt := mount(t)
	const most, syncs = 20 * time.Millisecond, 10
	write(t, mnt+"/f", "x")
	fsys.SetSyncDelay(most)
	began := time.Now()
	for range syncs {
		fdatasync(t, mnt+"/f")
	}
	// Uniform up to most: 10 take most*5 on average; less than most in
	// all is a chance of about 1 in 4 million.
	if took := time.Since(began); took < most || took > 2*syncs*most {
		t.Errorf("%d fdatasyncs of up to %v each took %v", syncs, most, took)
	}
}
