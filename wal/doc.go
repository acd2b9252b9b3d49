// Package wal is Felix's per-shard durable log.
//
// It owns, for one shard: appending records with group commit (one
// committer goroutine per Log writes everything that queued up during the
// previous fsync as one batch and fsyncs once), the stored record format
// with its CRC-32C checksum, repair of a torn tail after a crash, reads for
// subscribers (recent records from an in-memory tail, older ones from disk),
// and retention by size and age. Files on disk are managed by
// github.com/tidwall/wal; this package adds the record format, the commit
// protocol and the recovery rules on top of it. What Felix knows of
// tidwall's files (segment names, entry framing, its segment roll) lives in
// internal/tidseg, shared with package replica.
//
// It must never know about networking, QUIC, shard maps or brokers: it is
// handed bytes and returns offsets.
//
// # Offsets
//
// Offsets are dense and start at 0 for each shard. Offset o is stored at
// tidwall index o+1. Retention moves FirstOffset forward; NextOffset never
// goes backwards, also across restarts: a committed high-water mark (the
// file hwm, see hwm.go) records NextOffset after each commit, and a log
// whose segments end below it lost acknowledged records, which a crash
// cannot do (a torn tail is never acked). Open then fails with a
// *LostRecordsError (errors.Is ErrLostRecords) naming the lost offsets and
// cuts no record, unless Options.AcceptLoss: the offsets are then
// filled with markers that read as *CorruptError and the log continues
// after them, so an acknowledged offset is never given to another record.
// The mark costs no fsync: it is written (pwrite, page cache) after each
// batch's fdatasync and before its acks, and fdatasynced on Open and Close.
// It is exact after a process crash; after an OS crash or power loss it may
// lag by the kernel's writeback delay, so a loss of records acked in that
// window is not detected. A log without the file (older than it) opens as
// before and gets one. The file also keeps FirstOffset, written and
// fdatasynced by retention before it drops a segment: a log whose first
// segments are missing fails Open the same way (*LostRecordsError with
// Front), or, with AcceptLoss, is served from the first segment left.
//
// # Durability
//
// Append returns, and AppendAsync's callback runs, only after the record's
// bytes are fsynced (fdatasync on Linux). If a write or fsync fails, every
// record of that batch gets the error and the Log fails for good: an fsync
// failure cannot be retried safely, so the shard must be reopened. The
// batch is cut back out of the segment files first (cutFailed): the page
// cache keeps a failed fdatasync's pages, marked clean, and the reopened
// log would read them as written.
//
// The committer goroutine's fdatasync hands its P to the rest of the
// process for the call (tidseg.FdatasyncHandOff: the runtime's own entry
// for a blocking system call), so that the process reads its network and
// commits its other logs while the disk works; an ordinary call would
// keep the P until Go's sysmon saw it twice, which on a small VM it
// seldom does. With Options.ParkedSync, or with Options.SyncGroup while
// enough of the group's logs have records to commit at once, it is parked
// on Linux instead (submitted to the kernel as AIO IOCB_CMD_FDSYNC, the
// goroutine waiting on an eventfd in Go's poller; see
// tidseg.ParkedSyncer), so that the fsyncs of hundreds of logs overlap
// with no thread blocked for each. A lone record on an idle log,
// committed inline by Append or AppendNow, keeps the ordinary call (and
// its P) while no log of its SyncGroup is busy, which costs tens of
// microseconds less when nothing else is waiting, and hands the P on
// otherwise. Every way is the same fdatasync, with the same guarantee and
// the same failure handling.
//
// The tail segment is preallocated (tidseg.Padding, prealloc.go): the
// committer writes zeros ahead of tidwall's writes, so that a batch
// overwrites blocks the file already has and its fdatasync writes no
// inode, about 30% faster on ext4. The zeros are not records; Close, a
// segment roll and repair on Open cut them.
//
// On Open, the last segment is checked record by record and cut at the first
// record past the high-water mark that is incomplete or fails its checksum
// (a torn write), so a crash never leaves garbage at the end of the log, and
// what it keeps past the mark is fdatasynced before it is served. Below the
// mark a record that fails its checksum is damage, not a crash: it is kept
// and reported as a *CorruptError when read, as long as a later record
// verifies at its own offset (else the entries' framing itself is in doubt,
// and Open refuses with a *LostRecordsError). Records in earlier segments
// are never cut: a damaged one is reported as a *CorruptError when read.
//
// # Readers
//
// Log.Read reads records older than the in-memory tail through tidwall,
// which loads the segment file holding one whole (1 MiB by default) into
// a cache of two segments. A reader that goes on from where its last read
// ended (a subscription) reads through a Reader instead (cursor.go): it
// keeps the position of its next record (segment file and byte) and reads
// from there about what it returns, with preads of at most 64 KiB (or one
// larger record), so a record costs about its own bytes read whatever the
// number of records asked for and however many Readers read other parts
// of the log at once. Measured with BenchmarkCatchUpRead: four readers at
// one record a read in different old segments read 206 bytes per record
// of 163 (its entry) through Readers, 1 MiB through Log.Read.
//
// A Reader holds its position only between reads (a Reader is 56 bytes):
// no file and no data. A read holds what it returns and at most one
// partial entry per pread; placing a Reader (its first read, or one after
// the tail left it behind) reads the segment holding its offset up to it
// once, through a 64 KiB buffer dropped after the read. The Log keeps the
// two segment files Readers read most recently open, shared by its
// Readers, has at most three open at once (a read that needs another
// waits until one closes: tidseg.FilesMax), and closes them when retention rewrites the segments and on
// Close. Every record a Reader returns is verified as Log.Read verifies
// it; at anything unusual (a file gone, an entry that does not verify, a
// segment the wal found damaged, a failed file operation) the read goes
// through Log.Read's path, with its *CorruptError and *OutOfRangeError, and
// the Reader places itself afresh later.
//
// # Fault injection
//
// Options.FS is a testing knob: the filesystem under the file operations
// this package performs itself (FaultFS fails chosen ones, after pebble's
// vfs/errorfs). It covers the tail segment's preallocated zeros, its
// fdatasync and size check after each batch, the directory fsyncs, the high-water-mark file, and the
// repair's read and cut of the tail segment on Open, and Readers' reads of
// segment files. It cannot cover what tidwall/wal does with its own files:
// the writes of batches into segments, segment creation on a roll, reads
// for Log.Read and retention's truncations.
// A failed write of a batch is tested through the mark's write, which
// fails the batch exactly as a segment write would.
//
// # Damage
//
// wal reads segments through tidwall/wal and, for a segment tidwall cannot
// parse (it parses a segment file whole, so one bad length prefix fails
// every record in it), or whose entry does not verify as the record it
// should be, parses the format itself: entry by entry, and past damage it
// resynchronises on the next entry holding a record whose checksum holds.
// Such a record is placed by the offset stored in its own header (covered
// by the checksum), which must lie in the segment's range (its file name to
// the next file's) and after the last record found. The offsets of the
// range that no intact record holds are damaged.
//
// Read serves every intact record before and after damage, each at its
// offset, and a read that reaches damaged offsets returns a *CorruptError
// naming the shard and the damaged range From..To: read on at To+1 to skip
// it. Damage costs only what it touched: a flipped bit in a length prefix,
// a header or a payload costs that one record; a segment cut short costs
// its records from the cut on; bytes that belong to no record (garbage
// appended) cost nothing. Each damaged segment is logged once, with its
// damaged ranges.
//
// Limits: a payload that itself holds a stored Felix record (bytes copied
// from a segment, with an offset in the damaged segment's range) could be
// taken for a record while resynchronising inside a damaged entry; records
// are never returned at an offset other than their own, and never twice.
//
// # Usage
//
//	l, err := wal.Open("/var/lib/felix/orders/2", wal.Options{Name: "orders/2"})
//	if err != nil { ... }
//	defer l.Close()
//	off, err := l.Append(ctx, &wal.Record{Key: k, Value: v})
//	recs, err := l.Read(from, 100, 1<<20)
//	next, changed := l.Watch() // wait on changed, then Read(next, ...)
package wal
