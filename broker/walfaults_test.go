package broker

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
	"github.com/felix-broker/felix/wal"
)

// TestFsyncFailureFailsPublish injects an fsync failure under a shard's
// log (Config.Knobs.WALFS): the publisher whose record was in the failed
// batch gets a typed error, never an ack, and later publishes to the shard
// fail at once instead of hanging, while other shards keep working. The
// failed log stays open, refusing, when other shards' logs need its room
// (MaxOpenShards): the broker closed it as idle and reopened it for the
// next publish, which it acked after the failed batch.
func TestFsyncFailureFailsPublish(t *testing.T) {
	var armed atomic.Bool
	fs := &wal.FaultFS{Inject: func(op wal.Op, path string) bool {
		return op == wal.OpSync && armed.Load() &&
			strings.Contains(path, string(filepath.Separator)+"doomed"+string(filepath.Separator)) &&
			len(filepath.Base(path)) == 20 // a segment file
	}}
	const open = 16 // the fewest MaxOpenShards allows
	ip := startInprocWith(t, func(c *Config) { c.Knobs.WALFS = fs; c.MaxOpenShards = open }, 1,
		shardmap.StreamConfig{Name: "doomed", Shards: 1}, shardmap.StreamConfig{Name: "fine", Shards: 2 * open})
	b := ip.brokers[0]
	ws := openStream(t, ip.dial(b))
	wantAck(t, publishShard(ws, 1, "doomed", 0, "before"), 1)

	armed.Store(true)
	f := publishShard(ws, 2, "doomed", 0, "lost")
	e, ok := f.(*transport.Error)
	if !ok {
		t.Fatalf("publish whose fsync failed: got %T %+v, want an error", f, f)
	}
	if !strings.Contains(e.Message, "doomed/0") || !strings.Contains(e.Message, "injected") {
		t.Fatalf("error %q does not name the shard and the failure", e.Message)
	}
	// Its bytes may reach the disk all the same (and be read after a
	// restart): the outcome is unknown, not "not written".
	if e.Code != transport.CodeUnavailable || !strings.Contains(e.Message, "may or may not have been written") {
		t.Fatalf("error %v does not say the record's outcome is unknown", e)
	}
	t.Logf("failed batch: %v", e)
	armed.Store(false) // the disk is fine again; the log stays failed until reopened

	start := time.Now()
	for seq := uint64(3); seq < 6; seq++ {
		f := publishShard(ws, seq, "doomed", 0, "after")
		if _, ok := f.(*transport.Error); !ok {
			t.Fatalf("publish after the failure: got %T %+v, want an error", f, f)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("publishes to the failed shard took %v to fail", d)
	}
	wantAck(t, publishShard(ws, 6, "fine", 0, "other shard"), 6)

	// Every other shard's log opens, more than MaxOpenShards in all.
	for shard := range 2 * open {
		seq := uint64(100 + shard)
		wantAck(t, publishShard(ws, seq, "fine", shard, "other shard"), seq)
	}
	if f := publishShard(ws, 200, "doomed", 0, "after eviction"); !isError(f) {
		t.Fatalf("publish to the failed shard after other logs needed its room: got %T %+v, want an error until the broker restarts", f, f)
	}
}

func isError(f transport.Frame) bool {
	_, ok := f.(*transport.Error)
	return ok
}

// TestLostRecordsMakeShardUnavailable truncates a shard's log inside
// acknowledged records while its broker is down: after the restart the
// shard is unavailable with an error naming the lost offsets (its offsets
// are never reused), until the broker is started with AcceptLoss for it,
// which continues after the old high-water mark.
func TestLostRecordsMakeShardUnavailable(t *testing.T) {
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "trunc", Shards: 1})
	b := ip.brokers[0]
	ws := openStream(t, ip.dial(b))
	const n = 10
	for seq := uint64(0); seq < n; seq++ {
		if a := wantAck(t, publishShard(ws, seq, "trunc", 0, "acked"), seq); a.Offset != seq {
			t.Fatalf("offset %d, want %d", a.Offset, seq)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	seg := filepath.Join(ip.dir, b.NodeID(), "streams", "trunc", "0", "00000000000000000001")
	data, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(seg, data[:len(data)/2], 0o640); err != nil {
		t.Fatal(err)
	}

	b = ip.startBroker(0)
	ip.brokers[0] = b
	ws = openStream(t, ip.dial(b))
	e := wantError(t, publishShard(ws, 100, "trunc", 0, "reuse?"), transport.ErrUnavailable)
	if !strings.Contains(e.Message, "trunc/0") || !strings.Contains(e.Message, "acknowledged records") {
		t.Fatalf("error %q does not say the shard lost acknowledged records", e.Message)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	ip.tweak = func(c *Config) { c.AcceptLoss = []string{"trunc/0"} }
	b = ip.startBroker(0)
	ip.brokers[0] = b
	ws = openStream(t, ip.dial(b))
	if a := wantAck(t, publishShard(ws, 101, "trunc", 0, "after"), 101); a.Offset != n {
		t.Fatalf("first offset after accepting the loss = %d, want %d", a.Offset, n)
	}
}
