package broker

import (
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
	"github.com/felix-broker/felix/wal"
)

// TestClosingOwnerIsNotHandedLeadershipBack: a broker that owns (is the
// preferred leader of) a replicated shard is closed while a publish it
// took in takes a few seconds to drain. Close resigns first, then drains
// while still live in the map. The new leader's preferOwners handed the
// leadership back to the closing broker, which handed it on again, and
// refused as shutting_down what it was forwarded as leader meanwhile:
// publishes through a live broker failed during a graceful restart (3 of
// 3 runs, from the review of 21bcd6e). A replica no longer hands the
// leadership back to the one that handed it over, for a while.
func TestClosingOwnerIsNotHandedLeadershipBack(t *testing.T) {
	var slow atomic.Bool
	fs := &wal.FaultFS{Inject: func(op wal.Op, path string) bool {
		if op == wal.OpSync && slow.Load() && strings.Contains(path, string(filepath.Separator)+"r1"+string(filepath.Separator)) {
			time.Sleep(4 * time.Second)
		}
		return false
	}}
	ip := startInprocWith(t, func(c *Config) {
		fastRaft(c)
		c.Knobs.WALFS = fs
	}, 3,
		shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3}, shardmap.StreamConfig{Name: "r1", Shards: 1})
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	o := waitOwnerLeads(t, ip, ip.brokers, id)
	var other *Broker
	for _, b := range ip.brokers {
		if b != o {
			other = b
			break
		}
	}
	if _, ok := publishVia(t, ip, other, "r3", 0, 1, "warm").(*transport.Ack); !ok {
		t.Fatal("warm-up not acked")
	}
	g := groupOf(o, id).group
	conn := ip.dial(other)

	// A publish o took in, whose commit takes 4 s: Close drains it.
	ws := openStream(t, ip.dial(o))
	slow.Store(true)
	ws.send(&transport.Publish{Seq: 1, Stream: "r1", Shard: 0, Value: []byte("slow")})
	time.Sleep(100 * time.Millisecond)

	closed := make(chan struct{})
	go func() { _ = o.Close(); close(closed) }()
	var resigned, ledAgain time.Duration
	start := time.Now()
	var fails, acks int
	var firstFail string
	seq := uint64(10)
loop:
	for {
		select {
		case <-closed:
			break loop
		default:
		}
		l := g.IsLeader()
		if !l && resigned == 0 {
			resigned = time.Since(start)
		}
		if l && resigned != 0 && ledAgain == 0 {
			ledAgain = time.Since(start)
		}
		if resigned != 0 {
			seq++
			ps := openStream(t, conn)
			ps.send(&transport.Publish{Seq: seq, Stream: "r3", Shard: 0, Value: []byte("during close")})
			f := ps.recv()
			ps.s.Close()
			if e, ok := f.(*transport.Error); ok {
				fails++
				if firstFail == "" {
					firstFail = e.Error() + " at " + time.Since(start).String()
				}
			} else {
				acks++
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("close took %v; resigned at %v; led again at %v; publishes to r3 through %s during close: %d acked, %d failed (first: %s)",
		time.Since(start), resigned, ledAgain, other.NodeID(), acks, fails, firstFail)
	if ledAgain != 0 {
		t.Errorf("the closing broker %s led %s again %v after Close began (resigned at %v)", o.NodeID(), id, ledAgain, resigned)
	}
	if fails > 0 {
		t.Errorf("%d publishes to r3 through a live broker failed during the close: %s", fails, firstFail)
	}
}
