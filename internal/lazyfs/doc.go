// Package lazyfs is a FUSE filesystem for fault tests that loses, when
// told to crash, everything a power cut may lose: Jepsen's LazyFS, in Go,
// for Felix's power-loss tests. The fault suites that kill processes keep
// the page cache, so a missing fsync can never fail them; a lazyfs under
// the brokers' data directories can.
//
// It is a passthrough (go-fuse v2's loopback) over a backing directory:
// what a process writes reaches the backing files at once and is read
// back from them. Beside that, it keeps what a crash would take back, and
// Crash takes it back. It knows nothing of Felix, and is Linux only.
//
// # The model
//
// A crash loses everything that was not made durable, the worst case
// POSIX allows; nothing durable is ever lost. Precisely, after Crash:
//
//   - A regular file holds its content and size as of its last fsync or
//     fdatasync (the two are the same here), through any descriptor;
//     a file not synced since it was created is empty, and one not synced
//     since Mount is as it was at Mount. Every write, truncation (also
//     open with O_TRUNC) and fallocate that punched a hole or zeroed a
//     range since is undone, whole: no write is half kept, none reordered.
//     Closing a file makes nothing durable, and neither do sync(2) and
//     syncfs(2), which do not reach a FUSE filesystem.
//   - A directory holds its entries as of its last fsync (which reaches
//     the filesystem as FSYNCDIR), or as at Mount. Creating a file,
//     directory, device node or symbolic link, unlinking, removing a
//     directory and renaming are changes of the entries of the
//     directories they name, and are undone until those are fsynced. So a
//     file whose creation was not made durable is gone even if its data
//     was fsynced; a directory whose creation was not made durable is
//     gone with everything under it, fsynced or not; an unlinked file or
//     removed directory whose removal was not made durable is back, with
//     its content as of its last sync; a rename not made durable is
//     undone, and the file it replaced is back.
//   - A rename is atomic, as on every journaling Linux filesystem: after
//     a crash the entry is under its old name or its new one, never both
//     or neither. Within one directory, that directory's fsync makes it
//     durable. Between two, the target directory's fsync does (the old
//     name then leaves the source's durable entries too); the source's
//     alone does not: the entry stays durable under its old name, which
//     wins over an entry that took that name since.
//   - Not modeled, so kept as they are: mode, owner, times and extended
//     attributes. Refused: hard links (EPERM), O_TMPFILE, collapsing or
//     inserting a range with fallocate, and copy_file_range (EOPNOTSUPP:
//     the kernel copies with reads and writes instead), RENAME_EXCHANGE
//     and RENAME_WHITEOUT (EINVAL), and ioctls.
//
// A real disk may also keep some of what was not synced (write-back in
// any order), or tear a write; lazyfs explores only the outcome where all
// of it is lost, which is legal and the one most likely to find a missing
// fsync, and never tears or reorders.
//
// The crash happens at Cut (which Crash calls if the test did not): a
// sync that has not returned by then, or is called after, fails with EIO
// and makes nothing durable. Without it, a sync in flight when its
// process is killed would complete durably after the kill, since the
// kernel holds a killed process until the filesystem answers the request
// it is in. A sync returns at once unless SetSyncDelay makes it take a
// random time, as a disk's flush does, so that a cut can land while one
// is in flight; different delays on different mounts make one machine's
// disk faster than another's.
//
// # How
//
// Before the first change of a range of a file since the file's last
// sync, the bytes it overwrites (below the size at that sync) are kept in
// memory with that size, and fsync drops them: an undo record per file,
// holding the backing file open. Before the first change of a directory's
// entries since its last sync, its listing (names to backing inodes) is
// kept, and fsync drops it. Unlinked entries, and files a rename replaces,
// are moved into a hidden directory of the backing directory (.lazyfs,
// which the mount does not show and refuses to create) instead of being
// removed, while a kept listing may bring them back. Crash unmounts, puts
// the kept bytes back and truncates each changed file to its synced size,
// then rebuilds the tree from the kept listings (every inode moved out
// flat, the durable ones moved back under their durable names, the rest
// removed), and mounts again: a fresh mount, with no page cache or
// dentry the crash would have lost. Crash needs every file on the mount
// closed (kill every process that uses it first); it waits ReleaseWait
// for the kernel's releases of a killed process's files, then refuses,
// naming the files still open. Nothing is fsynced in the backing
// directory: durability is the model's, so an fsync through the mount
// costs no disk flush.
//
// # Usage
//
//	fsys, err := lazyfs.Mount(backing, dataDir) // as root (mount(2)), else fusermount3
//	if errors.Is(err, lazyfs.ErrUnavailable) { t.Skip(err) }
//	fsys.SetSyncDelay(2 * time.Millisecond) // optional
//	... run processes on dataDir ...
//	fsys.Cut() // the power goes
//	... kill -9 them ...
//	err = fsys.Crash() // dataDir now holds only what was durable
//	... restart them on dataDir ...
//	err = fsys.Unmount() // a clean shutdown: everything written is kept
package lazyfs
