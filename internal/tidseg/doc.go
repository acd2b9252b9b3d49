// Package tidseg owns Felix's knowledge of github.com/tidwall/wal's files
// on disk (v1.2.1, the version go.mod pins), shared by package wal (a
// shard's log) and package replica (a shard's raft log): the segment
// files' names and their entry framing, the options every Felix log opens
// tidwall with, the segment roll that tidwall's WriteBatch performs (so that
// a caller fdatasyncs the right file itself instead of letting tidwall fsync
// every write), the step of a tail repair that lets tidwall finish an
// interrupted truncation, the scan and cut of a torn tail, and fdatasync
// per platform.
//
// The layout and the roll rule are tidwall's internals, not its API:
// segment_test.go checks them against the tidwall this module builds with,
// so that an upgrade that changes them fails there, not in production.
//
// It must never know what an entry holds (records, raft entries, offsets,
// checksums): callers pass a check for that. It never logs, holds no state
// and starts no goroutine. It performs its file operations on the real OS
// only; package wal's fault-injection seam (wal.FS) stays in wal, which
// opens the files it must be able to fail itself and hands them here.
package tidseg
