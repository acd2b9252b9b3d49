package wal

import (
	"log/slog"
	"path/filepath"
	"time"
)

// Options configure a Log. The zero value of every field means its default.
type Options struct {
	// Name is the shard name used in errors and logs, e.g. "orders/2".
	// Default: the base name of the directory.
	Name string
	// SegmentSize is the target size of a segment file in bytes.
	// Default: 1 MiB. tidwall/wal keeps the tail segment in a byte slice
	// that grows by reallocation as records are appended; with 4 MiB
	// segments that growth (fresh pages, copies) cost a fifth of the
	// broker's CPU under pipelined load, and 1 MiB segments gave 25% more
	// acked records per second in BenchmarkPublishThroughput.
	SegmentSize int
	// MaxBatch is the most records written and fsynced as one batch.
	// Default: 8192.
	MaxBatch int
	// TailRecords is how many recent records are kept in memory for live
	// readers, at most. Default: 4096.
	TailRecords int
	// TailBytes bounds the memory those records hold: their keys, values,
	// producer ids and headers, plus 64 bytes per header and a record's
	// slot (about 100 bytes). The oldest leave to make room; a record
	// larger than the bound is not kept (readers read it from disk).
	// Records share the buffer of the batch they were committed in, so a
	// log may keep up to about twice this alive. Default: 1 MiB, so that
	// an idle shard holds at most that.
	TailBytes int
	// RetentionBytes drops whole oldest records while the log's files are
	// larger than this. Default 0: unlimited.
	RetentionBytes int64
	// RetentionAge drops records whose commit timestamp is older than this,
	// by the wall clock: a clock stepped forward drops records early (as
	// Kafka's time retention does), and a record stamped while the clock
	// was far ahead is dated by its segment file's last write
	// (retention.go). Default 0: unlimited.
	RetentionAge time.Duration
	// RetentionCheck is how often the background retention pass runs.
	// Default: 10s. The pass runs only if RetentionBytes or RetentionAge is
	// set; Open runs one before it returns, and Close stops them (a caller
	// that keeps a log closed applies its retention itself: see Expiry).
	RetentionCheck time.Duration
	// Logger receives warnings (torn tail cut, retention failures) and
	// errors (failed commits). Default: slog.Default(). Never one line per
	// record.
	Logger *slog.Logger
	// OnCommit, if set, is called once per successful commit, after the
	// fsync and before the batch's records are completed, by the goroutine
	// that committed the batch (the committer goroutine, or an append that
	// committed inline), which then runs the batch's done callbacks; calls
	// never overlap. It must not block: it delays every append.
	OnCommit func(Commit)
	// Answered, if set, is called once per successful commit after the
	// batch's done callbacks, by the goroutine that ran them (see
	// OnCommit). Callbacks may leave work for it that is cheaper done
	// once per batch: the broker writes the batch's acks to each
	// publisher stream in one write. It must not block.
	Answered func()

	// AcceptLoss lets Open continue past acknowledged records that are
	// missing (a *LostRecordsError otherwise): it cuts the damaged tail,
	// fills the lost offsets with markers that reads report as corrupt
	// (*CorruptError), logs the loss, and continues at the old high-water
	// mark, so no acknowledged offset is ever given to another record. An
	// operator's decision for one shard, never a default.
	AcceptLoss bool

	// ParkedSync parks the committer goroutine's fdatasyncs on the kernel
	// (Linux AIO; see tidseg.ParkedSyncer) instead of blocking its thread
	// (with its P handed to the rest of the process, see tailSync), so
	// that no thread waits for the disk. A lone record committed inline
	// on an idle log (Append, AppendNow) never parks: parked it costs
	// tens of microseconds more. Off by default; measured on a 2-vCPU VM
	// with brokers at GOMAXPROCS=1 (docs/performance.md, "Always
	// parked, an option"), against the blocking call when it still kept its P, it helped many
	// shards and moderate load and hurt a saturated CPU: each parked
	// commit's completion waits for the scheduler to run its goroutine
	// again.
	ParkedSync bool

	// SyncGroup, shared by the logs of one process on one disk, parks
	// the committer's fdatasyncs as ParkedSync does while at least the
	// group's threshold of its logs have records to commit, and lets them
	// block otherwise (see SyncGroup). Nil: only ParkedSync decides.
	SyncGroup *SyncGroup

	// FS is a testing knob: the filesystem under the operations the
	// package performs itself (see FS for what it covers). Default nil:
	// the OS. Production code never sets it.
	FS FS
	// Now is a testing knob: the wall clock commits are stamped with
	// (read once per batch, never per record), for a clock that steps.
	// Default nil: time.Now. Production code never sets it.
	Now func() time.Time
}

// Commit describes one group commit, for Options.OnCommit.
type Commit struct {
	Records int           // records made durable
	Bytes   int           // bytes written
	Start   time.Time     // when the write began
	Sync    time.Duration // time spent writing and fsyncing
}

const (
	defaultSegmentSize    = 1 << 20
	defaultMaxBatch       = 8192
	defaultTailRecords    = 4096
	defaultTailBytes      = 1 << 20
	defaultRetentionCheck = 10 * time.Second
)

// withDefaults returns a copy of o with defaults applied.
func (o Options) withDefaults(dir string) Options {
	if o.Name == "" {
		o.Name = filepath.Base(dir)
	}
	if o.SegmentSize <= 0 {
		o.SegmentSize = defaultSegmentSize
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = defaultMaxBatch
	}
	if o.TailRecords <= 0 {
		o.TailRecords = defaultTailRecords
	}
	if o.TailBytes <= 0 {
		o.TailBytes = defaultTailBytes
	}
	if o.RetentionCheck <= 0 {
		o.RetentionCheck = defaultRetentionCheck
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.FS == nil {
		o.FS = osFS{}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}
