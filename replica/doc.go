// Package replica is a shard's log replicated on three (or any odd number
// of) machines by the raft consensus of go.etcd.io/raft/v3: the first stage
// of replication factor 3.
//
// It owns, for one replica of one shard: the raft log on disk, which is the
// shard's log (one copy, in a github.com/tidwall/wal directory: raft index
// = tidwall index, one raft entry per group-commit batch of records); the
// raft state file (HardState, ConfState, compaction point); the goroutine
// that drives the group's RawNode; the assignment of offsets to committed
// records; and reads of committed records by offset.
//
// It must never know about QUIC, shard maps, brokers or the control plane:
// it is handed records and a Transport, and returns offsets. Consensus,
// election and the replication protocol are raft's; this package only
// stores, sends and applies what raft's Ready says.
//
// # Storage
//
// Each tidwall entry holds one raft entry: the raftpb.Entry fields (type,
// term, data) with one CRC-32C over them and the index (storage.go), not
// records with a CRC each as in package wal: raft needs every entry's term,
// and an entry is always written and read whole, so one checksum covers it.
// A normal entry's data is a batch of records with their timestamp and the
// proposer's identity (codec.go). The appends of a Ready are written as one
// tidwall batch and fdatasynced once (the segment file directly, as package
// wal does, following tidwall's segment roll and fsyncing the directory
// when a segment starts: internal/tidseg, shared with package wal, knows
// tidwall's files); a suffix raft replaces is cut with TruncateBack,
// never a committed one. The tail segment is preallocated as a shard
// log's is (tidseg.Padding: zeros ahead of tidwall's writes, so that an
// fdatasync writes the data alone, not the inode of a grown file); the
// zeros are cut before anything that makes tidwall rewrite or reopen the
// tail (TruncateBack, a compaction, a snapshot install), from the segment
// a roll leaves, and on close. Open repairs a torn tail of the last
// segment (an append that was never acknowledged; zeros a crash left
// are cut without the warning) and refuses a log that ends below the
// committed index, or below the last index it had written and synced
// (which it may have acknowledged: damage, not a tear; state.go), but
// for the old log of a snapshot install that stopped before replacing
// it (compact.go). The raft state lives in a
// double-buffered, checksummed file (state.go): term and vote changes
// are fdatasynced before any message that depends on them leaves. Files
// are opened on the real OS: package wal's filesystem seam (wal.FS) is
// not used here; the fault seams are Knobs.BeforeSync and
// Knobs.AfterSnapshotState.
//
// # The Ready loop
//
// One goroutine per group owns the RawNode (etcd's synchronous storage
// contract; AsyncStorageWrites is off). Per Ready it: sends the leader's
// appends and heartbeats first, unless term or vote changed, so the
// leader's fdatasync runs in parallel with the followers' appends (raft
// thesis 10.2.1); applies committed entries it already holds on disk;
// writes and fdatasyncs the new entries, writes the HardState (synced if
// term or vote changed); sends the other messages (votes, append
// responses: only after the write); applies the rest; calls Advance. All
// records that arrived while the previous Ready was handled go into one
// entry (up to Config.MaxEntryBytes): group commit with no timer.
//
// # Peers' messages
//
// Step takes what other brokers send, authenticated but possibly buggy or
// hostile, and etcd raft panics on some inconsistent input. So a message
// reaches raft only after Step's stateless checks (ErrBadMessage: types,
// ids, terms, entries, no snapshot) and a check against the log on the
// group's goroutine (a commit index or an acknowledgement beyond the log:
// dropped and logged once per peer and type); see step.go. A panic that
// still happens on the group's goroutine is contained: the group fails
// with a *RaftPanicError (errors.Is ErrFailed) naming the peer and message
// type, its proposed records get ErrUnknownOutcome, and the process goes
// on; reopening the group re-reads its directory.
//
// What waits for the group's goroutine is bounded too: while it is held
// up (a slow fdatasync), a peer's message that would take the waiting
// ones past four times Config.MaxInflightBytes is dropped as a lost one
// and logged once per peer (one that arrives when none waits is taken
// whatever its size: the append of a leader configured for larger
// entries). They are counted by their data and 64 bytes per entry and
// 256 per message; decoded, they hold at most about twice that (entries
// with no data). So a peer can make a replica hold about
// 16 MiB waiting with 1 MiB entries (32 MiB with empty entries), and as
// much again in the Ready its goroutine is writing. A correct leader of
// the same configuration keeps at most MaxInflightBytes of entries' data
// and one append in flight to a follower (raft's
// Config.MaxInflightBytes), which counts under three times that with the
// smallest entries, so only the appends of a probe that overlap older
// ones still waiting can meet the bound; what is dropped the leader
// sends again once the follower answers and is found behind.
//
// # Offsets
//
// Offsets are assigned when entries apply, in log order: an entry with n
// records gets [next, next+n), so every replica gives every record the same
// offset. The offset index (8 bytes per entry) is not persisted: on open,
// raft hands back every committed entry to apply again, which rebuilds it.
// Readers see committed records only.
//
// # Acknowledgement
//
// AppendAsync's callback gets an offset only once the record's entry is
// committed (a majority has fsynced it) and applied here. A record whose
// entry another leader replaced, or that a replica which is not the leader
// refused, gets a *NotLeaderError naming the leader it knows; records whose
// fate a closing replica cannot learn get ErrUnknownOutcome. Never a false
// ack: a replica cut off from the majority keeps its proposals pending,
// and drops them when a new leader's entries replace them. With
// Config.CommitTimeout, the records of an entry still pending that long
// after its proposal are told ErrCommitTimeout first, and their fate
// later.
//
// # Producer sequences
//
// For idempotent publish above it, a group tells Config.OnSequenced of
// every committed record that carries a producer sequence as it applies
// (on open too), says when a leader has applied everything committed
// before its term (LeaderTerm), and proposes a record in the term it was
// decided in or not at all (AppendInTerm). See sequenced.go.
//
// # Quiescence
//
// With Config.Quiesce an idle group stops ticking and heartbeating on
// every replica, and its owner watches its hosts' liveness instead and
// calls Wake (quiesce.go): thousands of idle groups cost no timers and no
// messages.
//
// # Limits of this stage
//
// The only membership change is the replacement of a lost replica by a
// new one (Config.Join, Group.Admit; members.go): learner, then voter in
// its place by one joint change. Opening a replica reads its whole log
// once (terms, checksums) and applies the committed entries again before
// Open returns: retention bounds that work by bounding the log.
//
// # Retention and snapshots
//
// With Config.RetentionBytes or RetentionAge, EnforceRetention drops whole
// segments from the front of the log (retention.go): the state file
// keeps the compaction point, its configuration and the offset after it.
// A follower (or a joining replica) that needs entries a leader dropped
// gets a snapshot that carries no records, only that point: its log goes
// on from there (compact.go). Snapshots exist for nothing else.
//
// # Reads
//
// Read serves committed records only. The most recently committed entries
// stay in memory (Config.TailBytes, default 4 MiB, counting their data and
// their records once decoded by a first reader): live subscribers read
// them without tidwall; older entries are read from disk and decoded per
// read.
//
// Read reads old entries through tidwall, which loads a whole segment (1
// MiB) into a cache of two on a miss: readers catching up in three or
// more old segments evict each other's, and each read costs a segment. A
// Reader (NewReader; reader.go), for a reader that reads on from where
// it left off such as a subscription, reads them by file position
// instead (internal/tidseg's Cursor, shared with package wal): each entry
// read costs about its own bytes, verified as Read verifies it, and at
// anything unusual the entry is read through Read's path, with its
// errors. Since an entry is read whole, a Reader keeps what its read
// left of the entry it read last for its next read, at most 16 KiB, and
// a group's Readers at most 1 MiB together (past it they keep nothing);
// Close lets it go. The group keeps the two segment files Readers read
// most recently open, at most three at once (tidseg.FilesMax), and closes them when the files are rewritten
// (truncation, compaction, a snapshot install) and on Close. Measured
// with TestCatchUpReadersInterleaved: four readers at one record a read
// in different old segments, entries of 64 records, read 170 bytes per
// record through Readers, 1 MiB through Read.
//
// # Usage
//
//	g, err := replica.Open(replica.Config{ID: 1, Peers: []uint64{1, 2, 3}, Dir: dir, Transport: t})
//	defer g.Close()
//	// the owner: call g.Tick() every tick interval; hand received messages to g.Step(m)
//	g.AppendAsync(&wal.Record{Value: v}, func(offset uint64, ts int64, err error) { ... })
//	recs, err := g.Read(from, 100, 1<<20)
//	next, changed := g.Watch()
//	r := g.NewReader() // a subscription's: reads on by position
//	defer r.Close()
//	recs, err = r.Read(from, 100, 1<<20)
package replica
