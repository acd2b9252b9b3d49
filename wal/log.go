package wal

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	tidwall "github.com/tidwall/wal"

	"github.com/felix-broker/felix/internal/atomicfile"
	"github.com/felix-broker/felix/internal/tidseg"
)

// Log is one shard's durable log. All methods are safe for concurrent use.
type Log struct {
	dir    string
	name   string
	opts   Options
	logger *slog.Logger
	tw     *tidwall.Log
	fs     FS       // Options.FS: the seam under our own file operations
	hwm    *hwmFile // committed high-water mark; written by the commit role

	// mu guards the queue between appenders and the committer, and the
	// commit role: whoever sets committing owns l.c until it clears it.
	mu struct {
		sync.Mutex
		pending    []*request
		committing bool  // a batch is being committed
		closed     bool  // Close was called: no more appends
		failed     error // a commit failed: no more appends
	}
	wake          chan struct{} // capacity 1: "pending may be non-empty"
	committerDone chan struct{}
	c             committer // owned by whoever holds the commit role (mu.committing)

	// tail is the segment file tidwall appends to, opened again by us so
	// the committer can fdatasync it without holding tidwall's lock (which
	// would stall readers for a whole fsync). The committer holds the lock
	// across write+sync; retention holds it while it truncates, because
	// tidwall then replaces the tail file.
	tail struct {
		sync.Mutex
		f     File
		index uint64         // tidwall index of the file's first entry
		size  int64          // bytes tidwall has written to it
		pad   tidseg.Padding // zeros written ahead of them (prealloc.go)
		// presize gives a new tail's tidwall cache its room at once
		// when the log fills its segments fast (tidseg.Presizer).
		presize tidseg.Presizer
		// lost is set when f no longer follows tidwall's tail file, or
		// its name may not survive a crash (truncateFront): every commit
		// fails with it, as fdatasyncing f would make no record durable.
		lost error
	}

	ring   ring         // recent committed records
	readMu sync.Mutex   // serialises tidwall reads: tidwall mutates its segment cache under its read lock
	scans  scanCache    // damaged segments parsed by the wal itself (damage.go)
	files  tidseg.Files // segment files kept open for Readers (cursor.go)

	first  atomic.Uint64 // first retained offset
	next   atomic.Uint64 // one past the last committed offset; stored under watch's lock
	closed atomic.Bool

	// watch hands out the channel closed by the next commit; ch is created
	// only when someone watches, so an unwatched commit allocates nothing.
	watch struct {
		sync.Mutex
		ch     chan struct{}
		closed bool
	}

	stats struct {
		fsyncs, records, bytes, parked atomic.Uint64
		lastBatch, maxBatch            atomic.Int64
	}

	// size is the bytes of the segment files: listed when the log opens
	// and after a retention pass, grown by each commit (both under
	// l.tail's lock, so they do not interleave).
	size atomic.Int64

	// retention serialises retention passes with each other and with Close.
	retention struct {
		sync.Mutex
		closed bool
	}
	quit chan struct{} // closed by Close to stop the retention goroutine
	wg   sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
}

// Stats are totals since Open.
type Stats struct {
	Fsyncs    uint64 // batches written and fsynced
	Records   uint64 // records committed
	Bytes     uint64 // stored bytes committed
	LastBatch int    // records in the last fsync
	MaxBatch  int    // most records seen in one fsync
	// Parked counts the commits whose fdatasync was parked rather than
	// blocking (Options.ParkedSync or SyncGroup; where the kernel offers
	// no AIO context it blocks all the same).
	Parked uint64
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Open opens the log in dir, creating dir if needed. It cuts a torn tail
// off the last segment (logging what it cut), checks that the log still
// reaches its committed high-water mark (a *LostRecordsError if not, unless
// opts.AcceptLoss), then, if retention is configured, runs a retention
// pass (so that what expired while the log was closed is never served),
// and starts the committer and the retention goroutine. A failed pass is
// logged, as in the background, and does not fail Open.
func Open(dir string, opts Options) (*Log, error) {
	opts = opts.withDefaults(dir)
	l := &Log{
		dir:           dir,
		name:          opts.Name,
		opts:          opts,
		logger:        opts.Logger,
		fs:            opts.FS,
		wake:          make(chan struct{}, 1),
		committerDone: make(chan struct{}),
		quit:          make(chan struct{}),
	}
	l.files.Init(dir, l.openSegment)
	if err := atomicfile.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("wal: create dir %q: %w", dir, err)
	}
	hwm, mark, state, err := openHWM(l.fs, dir)
	if err != nil {
		return nil, fmt.Errorf("wal: shard %q: high-water mark: %w", l.name, err)
	}
	l.hwm = hwm
	if err := l.open(mark, state); err != nil {
		_ = hwm.f.Close()
		return nil, err
	}
	go l.runCommitter()
	if opts.RetentionBytes > 0 || opts.RetentionAge > 0 {
		l.enforceRetention(time.Now())
		l.wg.Add(1)
		go l.runRetention()
	}
	return l, nil
}

// open repairs and loads the log, checks it against the committed
// high-water mark and first offset of mark (found in the given state) and
// writes the mark anew.
func (l *Log) open(mark hwmMark, state hwmState) error {
	floor := uint64(0) // repair must not cut below it
	switch state {
	case hwmValid:
		floor = mark.next
	case hwmDamaged:
		l.logger.Warn("wal: high-water-mark file is damaged; opening without checking for lost records",
			"shard", l.name, "file", l.hwm.path)
	}
	if err := repairTail(l.dir, &l.opts, floor); err != nil {
		return err
	}
	tw, err := tidwall.Open(l.dir, tidwallOptions(&l.opts))
	if err != nil {
		return fmt.Errorf("wal: shard %q: open log %q: %w", l.name, l.dir, err)
	}
	l.tw = tw
	fail := func(err error) error {
		if l.tail.f != nil {
			_ = l.tail.f.Close()
		}
		_ = tw.Close()
		return err
	}
	if err := l.load(); err != nil {
		return fail(err)
	}
	if first := l.first.Load(); state == hwmValid && mark.hasFirst && first > mark.first {
		// Retention writes the first offset before it drops anything:
		// the segments below this one were lost otherwise.
		lost := &LostRecordsError{Shard: l.name, Dir: l.dir, From: mark.first, To: first, Front: true,
			Reason: fmt.Sprintf("the segments start at offset %d, and retention had kept everything from offset %d", first, mark.first)}
		if !l.opts.AcceptLoss {
			return fail(lost)
		}
		l.logger.Error("wal: accepted the loss of acknowledged records at the log's front; reads below its first offset are out of range",
			"shard", l.name, "from", lost.From, "to", lost.To-1, "records", lost.To-lost.From, "dir", l.dir)
	}
	if next := l.next.Load(); next < floor {
		lost := &LostRecordsError{Shard: l.name, Dir: l.dir, From: next, To: floor,
			Reason: fmt.Sprintf("the segments end at offset %d", next)}
		if !l.opts.AcceptLoss {
			return fail(lost)
		}
		if err := l.fillLost(next, floor); err != nil {
			return fail(err)
		}
		l.logger.Error("wal: accepted the loss of acknowledged records; their offsets are marked lost and not reused",
			"shard", l.name, "from", lost.From, "to", lost.To-1, "records", lost.To-lost.From, "dir", l.dir)
	}
	if l.next.Load() > floor {
		// Records past the mark were never acknowledged and may be only
		// in the page cache (a crash between a batch's write and its
		// fdatasync): made durable before they are served or the mark
		// covers them, or a power loss could take back what subscribers
		// read and leave the segments ending below the mark. Segments
		// before the tail were fsynced by tidwall when it rolled.
		if err := l.tail.f.Sync(); err != nil {
			return fail(fmt.Errorf("wal: shard %q: fdatasync %s: %w", l.name, segmentName(l.tail.index), err))
		}
	}
	if err := l.measure(); err != nil {
		return fail(err)
	}
	// The mark is durable before the first append: from here on it only
	// grows with the commits, and the first offset with retention.
	l.hwm.first = l.first.Load()
	if err := l.hwm.write(l.next.Load()); err != nil {
		return fail(fmt.Errorf("wal: shard %q: %w", l.name, err))
	}
	if err := l.hwm.sync(); err != nil {
		return fail(fmt.Errorf("wal: shard %q: %w", l.name, err))
	}
	return nil
}

// load reads the state of a freshly opened tidwall log.
func (l *Log) load() error {
	firstIndex, err := l.tw.FirstIndex()
	if err != nil {
		return fmt.Errorf("wal: shard %q: first index: %w", l.name, err)
	}
	lastIndex, err := l.tw.LastIndex()
	if err != nil {
		return fmt.Errorf("wal: shard %q: last index: %w", l.name, err)
	}
	l.first.Store(firstIndex - 1)
	l.next.Store(lastIndex)
	l.c.next = lastIndex
	l.ring.reset(l.opts.TailRecords, int64(l.opts.TailBytes), lastIndex)
	l.seedCommitClock(firstIndex, lastIndex)
	segs, _, err := listSegments(l.dir)
	if err != nil {
		return err
	}
	if len(segs) == 0 {
		return fmt.Errorf("wal: shard %q: no segment file in %q after open", l.name, l.dir)
	}
	if err := l.openTail(segs[len(segs)-1].Index); err != nil {
		return err
	}
	return l.syncDir() // tidwall may have created or renamed files
}

// seedCommitClock seeds the commit clock (commit.go) from the newest
// record that verifies: a damaged header's timestamp (one far in the
// future would stamp every later record with it) is not trusted, nor one
// more than clockStep ahead of the clock: it was stamped while the clock
// was ahead (or the clock has since stepped back), and holding later
// stamps at it would stop retention by age until the clock got there.
func (l *Log) seedCommitClock(firstIndex, lastIndex uint64) {
	ts, ok := l.newestTimestamp(firstIndex, lastIndex)
	if !ok {
		return
	}
	if now := l.opts.Now(); time.Duration(ts-now.UnixNano()) > clockStep {
		l.logger.Warn("wal: the newest record's timestamp is ahead of the clock (stamped while the clock was ahead, or the clock stepped back); commits are stamped by the clock",
			"shard", l.name, "newest", time.Unix(0, ts).UTC(), "clock", now.UTC())
		ts = now.UnixNano()
	}
	l.c.lastTS = ts
}

// newestTimestamp returns the timestamp of the newest record that
// verifies among the 64 newest of tidwall indexes from..to; ok is false
// if none does (or to < from).
func (l *Log) newestTimestamp(from, to uint64) (ts int64, ok bool) {
	for i := to; i >= from && i > 0 && i+64 > to; i-- {
		data, err := l.twRead(i)
		if err != nil {
			return 0, false
		}
		if rec, err := decodeRecord(l.name, data, i-1); err == nil {
			return rec.Timestamp, true
		}
	}
	return 0, false
}

// measure sets l.size from the segment files. Callers hold l.tail's lock
// or own l exclusively.
func (l *Log) measure() error {
	segs, err := l.dataSegments()
	if err != nil {
		return err
	}
	var total int64
	for _, s := range segs {
		total += s.Size
	}
	l.size.Store(total)
	return nil
}

// dataSegments lists the segment files with the size of the data each
// holds: the tail's without the zeros preallocated after its data
// (prealloc.go). Callers hold l.tail's lock or own l exclusively.
func (l *Log) dataSegments() ([]segmentFile, error) {
	segs, _, err := listSegments(l.dir)
	if err != nil {
		return nil, err
	}
	return l.tail.pad.Unpad(segs, l.tail.index, l.tail.size), nil
}

// syncDir fsyncs the log's directory through l.fs.
func (l *Log) syncDir() error {
	d, err := l.fs.OpenDir(l.dir)
	if err != nil {
		return fmt.Errorf("wal: open dir %q for sync: %w", l.dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("wal: sync dir %q: %w", l.dir, err)
	}
	return nil
}

// openTail makes the segment starting at index the file the committer
// syncs. Callers hold l.tail's lock or own l exclusively.
func (l *Log) openTail(index uint64) error {
	path := l.dir + string(os.PathSeparator) + segmentName(index)
	f, err := l.fs.OpenFile(path, os.O_RDWR, 0) // written to only to preallocate it
	if err != nil {
		return fmt.Errorf("wal: shard %q: open tail segment %q: %w", l.name, path, err)
	}
	size, err := f.Size()
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("wal: shard %q: stat tail segment %q: %w", l.name, path, err)
	}
	if l.tail.f != nil {
		_ = l.tail.f.Close()
	}
	l.tail.f, l.tail.index, l.tail.size, l.tail.pad = f, index, size, tidseg.Padding{}
	return nil
}

// FirstOffset returns the first retained offset. It equals NextOffset when
// the log holds no records.
func (l *Log) FirstOffset() uint64 { return l.first.Load() }

// NextOffset returns one past the last committed offset: the offset the
// next commit will get.
func (l *Log) NextOffset() uint64 { return l.next.Load() }

// Size returns the bytes of the log's segment files on disk, as of the
// last commit or retention pass. It does no I/O.
func (l *Log) Size() int64 { return l.size.Load() }

// Stats returns commit totals since Open.
func (l *Log) Stats() Stats {
	return Stats{
		Fsyncs:    l.stats.fsyncs.Load(),
		Records:   l.stats.records.Load(),
		Bytes:     l.stats.bytes.Load(),
		LastBatch: int(l.stats.lastBatch.Load()),
		MaxBatch:  int(l.stats.maxBatch.Load()),
		Parked:    l.stats.parked.Load(),
	}
}

// Watch returns the offset the next commit will get and a channel that is
// closed when a later commit makes records at or after next readable, or
// when the log closes.
func (l *Log) Watch() (next uint64, changed <-chan struct{}) {
	l.watch.Lock()
	defer l.watch.Unlock()
	if l.watch.closed {
		return l.next.Load(), closedChan
	}
	if l.watch.ch == nil {
		l.watch.ch = make(chan struct{})
	}
	return l.next.Load(), l.watch.ch
}

// publish makes offsets below next visible and wakes watchers.
func (l *Log) publish(next uint64) {
	l.watch.Lock()
	l.next.Store(next)
	if l.watch.ch != nil {
		close(l.watch.ch)
		l.watch.ch = nil
	}
	l.watch.Unlock()
}

// Err returns the error that failed the log (matching ErrFailed), or nil
// while it takes appends. A failed log stays failed until reopened.
func (l *Log) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.failed
}

// Close stops accepting appends (they get ErrClosed), commits everything
// already queued (running its callbacks), stops the Log's goroutines and
// closes the files. It is idempotent; later calls return the first result.
func (l *Log) Close() error {
	l.closeOnce.Do(func() { l.closeErr = l.close() })
	return l.closeErr
}

func (l *Log) close() error {
	l.mu.Lock()
	l.mu.closed = true
	l.mu.Unlock()
	l.signal()
	<-l.committerDone

	close(l.quit)
	l.wg.Wait()

	l.retention.Lock()
	defer l.retention.Unlock()
	l.retention.closed = true
	l.closed.Store(true)

	l.watch.Lock()
	l.watch.closed = true
	if l.watch.ch != nil {
		close(l.watch.ch)
		l.watch.ch = nil
	}
	l.watch.Unlock()

	var errs []error
	l.tail.Lock()
	if err := l.unpad(l.tail.size); err != nil {
		errs = append(errs, fmt.Errorf("wal: shard %q: %w", l.name, err))
	}
	if err := l.tail.f.Close(); err != nil {
		errs = append(errs, fmt.Errorf("wal: shard %q: close tail segment: %w", l.name, err))
	}
	l.tail.Unlock()
	// Every commit has written the mark; make it durable.
	if err := l.hwm.sync(); err != nil {
		errs = append(errs, fmt.Errorf("wal: shard %q: %w", l.name, err))
	}
	if err := l.hwm.f.Close(); err != nil {
		errs = append(errs, fmt.Errorf("wal: shard %q: close %s: %w", l.name, hwmName, err))
	}
	l.files.Drop(true)
	l.readMu.Lock()
	if err := l.tw.Close(); err != nil && !errors.Is(err, tidwall.ErrCorrupt) {
		errs = append(errs, fmt.Errorf("wal: shard %q: close log: %w", l.name, err))
	}
	l.readMu.Unlock()
	return errors.Join(errs...)
}
