// Package wal is Felix's per-shard durable log.
//
// It owns, for one shard: appending records with group commit (one
// committer goroutine per Log writes everything that queued up during the
// previous fsync as one batch and fsyncs once), the stored record format
// with its CRC-32C checksum, repair of a torn tail after a crash, reads for
// subscribers (recent records from an in-memory tail, older ones from disk),
// and retention by size and age. Files on disk are managed by
// github.com/tidwall/wal; this package adds the record format, the commit
// protocol and the recovery rules on top of it.
//
// It must never know about networking, QUIC, shard maps or brokers: it is
// handed bytes and returns offsets.
//
// # Offsets
//
// Offsets are dense and start at 0 for each shard. Offset o is stored at
// tidwall index o+1. Retention moves FirstOffset forward; NextOffset never
// goes backwards, also across restarts.
//
// # Durability
//
// Append returns, and AppendAsync's callback runs, only after the record's
// bytes are fsynced (fdatasync on Linux). If a write or fsync fails, every
// record of that batch gets the error and the Log fails for good: an fsync
// failure cannot be retried safely, so the shard must be reopened, which
// re-reads what actually reached the disk.
//
// On Open, the last segment is checked record by record and cut at the first
// record that is incomplete or fails its checksum (a torn write), so a crash
// never leaves garbage at the end of the log. Records in earlier segments
// are never cut: a damaged one is reported as a *CorruptError when read.
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
