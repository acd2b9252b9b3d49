package broker

// # Free disk space
//
// A broker takes no new record into a log while the filesystem of its data
// directory has less than Config.MinFreeBytes free: a publish to a shard
// this broker writes (it owns the shard, or leads its raft group) is
// answered limit_exceeded (limit "min_free_bytes", counted in
// felix_limit_hits_total), with nothing written; subscribers and the
// shards other brokers write go on (this broker's replicas of those fall
// behind, below, and a subscriber waiting at the end of one is sent to
// read from another replica: subscribe.go's leaderWatch). Once retention
// or an operator frees space, the next check takes publishes again;
// nothing restarts.
//
// Why refuse before the disk is full: a shard log whose commit meets
// ENOSPC fails and refuses every append until the broker restarts (package
// wal is fail-stop: after a failed write or fdatasync it cannot tell what
// the kernel kept), and a replica whose append fails is set aside and
// replaced (raft.go), which on a full disk cannot succeed. Refusing at the
// edge keeps the logs healthy and gives the publisher an error it can act
// on, as Redpanda's storage_min_free_bytes and NATS's "insufficient
// resources" do.
//
// The check is a statfs of the data directory every diskCheckEvery, by
// one goroutine of the broker's (watchDisk); the publish path reads one
// atomic. So the margin must cover what the broker can write between two
// checks, plus what is already queued: at 500 MB/s, 125 MB in 250 ms.
// Records already taken in when the disk crosses the line are still
// committed. A follower replica does not write what its leader sends
// while the line is crossed: raftNet.deliver drops those messages as if
// they were lost, the group commits with its other replicas, and the
// leader's heartbeats find this one behind and catch it up once the disk
// has room (an append that met ENOSPC would fail the replica instead,
// and on a full disk its replacement too).

import (
	"sync/atomic"
	"time"

	"github.com/felix-broker/felix/transport"
)

// DefaultMinFreeBytes is Config.MinFreeBytes's default: 256 MiB.
const DefaultMinFreeBytes = 256 << 20

// diskCheckEvery is how often watchDisk reads the free space.
const diskCheckEvery = 250 * time.Millisecond

// limitMinFree names the free-space limit in logs and metrics.
const limitMinFree = "min_free_bytes"

// diskSpace is what watchDisk last read of the data directory's
// filesystem. Its fields are written by watchDisk alone and read anywhere.
type diskSpace struct {
	free atomic.Int64 // bytes free to this process (statfs f_bavail), -1 before the first read
	low  atomic.Bool  // free < Config.MinFreeBytes: refuse new records
}

// checkDisk reads the free space once, sets b.disk and logs a crossing of
// the line either way. A failed read keeps the last state.
func (b *Broker) checkDisk() {
	read := b.cfg.Knobs.FreeBytes
	if read == nil {
		read = freeBytes
	}
	free, err := read(b.cfg.DataDir)
	if err != nil {
		if b.diskErr.First("statfs") {
			b.log.Warn("cannot read the data directory's free space (logged once); publishes are taken as before", "err", err)
		}
		return
	}
	b.disk.free.Store(free)
	line := b.cfg.MinFreeBytes
	low := line > 0 && free < line
	if b.disk.low.Swap(low) == low {
		return
	}
	if low {
		b.log.Warn("data directory's filesystem nearly full: refusing new records (limit_exceeded) until space is freed",
			"free_bytes", free, "min_free_bytes", line, "dir", b.cfg.DataDir)
	} else {
		b.log.Info("data directory's filesystem has room again: taking new records", "free_bytes", free, "min_free_bytes", line)
	}
}

// watchDisk checks the free space every diskCheckEvery until the broker
// closes. Start runs it.
func (b *Broker) watchDisk() {
	defer b.wg.Done()
	t := time.NewTicker(diskCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
			b.checkDisk()
		}
	}
}

// diskFull returns the refusal of a record a publisher sent while the disk
// is below the line, or nil. The publish path calls it before it hands a
// record to a log this broker writes.
func (p *pubSession) diskFull() *transport.Error {
	b := p.b
	if !b.disk.low.Load() {
		return nil
	}
	return b.limits.exceeded(limitMinFree, p.from.principal+p.peerID,
		"%s's data directory has %d bytes free, under its --min-free-bytes of %d: it takes no new record until space is freed (retention, or an operator)",
		b.cfg.NodeID, b.disk.free.Load(), b.cfg.MinFreeBytes)
}
