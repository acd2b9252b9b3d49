// Package tidseg owns Felix's knowledge of github.com/tidwall/wal's files
// on disk (v1.2.1, the version go.mod pins), shared by package wal (a
// shard's log) and package replica (a shard's raft log): the segment
// files' names and their entry framing, the options every Felix log opens
// tidwall with, the segment roll that tidwall's WriteBatch performs (so that
// a caller fdatasyncs the right file itself instead of letting tidwall fsync
// every write), the step of a tail repair that lets tidwall finish an
// interrupted truncation, the scan and cut of a torn tail, fdatasync per
// platform, and the reading of entries by file position for readers that
// read on from where they left off (Cursor, over a log's small cache of
// open segment files, Files: cursor.go), which wal.Reader and
// replica.Reader share, and the room of tidwall's in-memory copy of the
// tail segment (PresizeTail: tailcache.go).
//
// The layout, the roll rule and where tidwall keeps the tail's copy are
// its internals, not its API: segment_test.go and tailcache_test.go check
// them against the tidwall this module builds with, so that an upgrade
// that changes them fails there, not in production.
//
// It must never know what an entry holds (records, raft entries, offsets,
// checksums): callers pass a check for that (a Cursor's Taker verifies
// what it reads). It never logs and starts no goroutine; the only state
// it holds is a Files' open files, owned by the caller's log. It performs
// its file operations on the real OS only; package wal's fault-injection
// seam (wal.FS) stays in wal, which opens the files it must be able to
// fail itself and hands them here (Files.Init takes how to open one).
package tidseg
