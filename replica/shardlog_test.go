package replica

import "github.com/felix-broker/felix/wal"

// shardLog is the interface a broker's shard would hold, so that a shard
// of replication factor 1 keeps its *wal.Log and one of factor 3 holds a
// *Group. Both must keep satisfying it.
type shardLog interface {
	AppendAsync(r *wal.Record, done func(offset uint64, ts int64, err error))
	AppendNow(r *wal.Record, done func(offset uint64, ts int64, err error))
	Read(from uint64, max, maxBytes int) ([]wal.Record, error)
	FirstOffset() uint64
	NextOffset() uint64
	Watch() (next uint64, changed <-chan struct{})
	Close() error
}

var (
	_ shardLog = (*wal.Log)(nil)
	_ shardLog = (*Group)(nil)
)
