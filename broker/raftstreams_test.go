package broker

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestRaftStreamsOfAPeerDoNotAddUp: each raft stream a peer opens may
// hold a partial frame of up to raftFrameLimit (about 128 MiB) as its
// bytes arrive; a peer's new raft stream ends the one before, so what it
// makes the broker hold does not grow with the streams it opens (six
// streams with 20 MiB of a frame sent on each once grew the heap by
// 194 MiB). The cluster holds no replicated shard, so the real broker-1
// has no raft stream of its own to open, which would end this test's.
func TestRaftStreamsOfAPeerDoNotAddUp(t *testing.T) {
	ip := startInprocWith(t, fastRaft, 3, shardmap.StreamConfig{Name: "r1", Shards: 1})
	target := ip.brokers[0]
	conn := ip.dialAsPeer(t, target, "broker-1")
	before := heapInUse()
	const streams, sent = 6, 20 << 20
	chunk := make([]byte, 1<<20)
	for range streams {
		ws := openStream(t, conn)
		ws.send(&transport.Raft{From: "broker-1"})
		hdr := make([]byte, 5)
		binary.BigEndian.PutUint32(hdr, uint32(raftFrameLimit-1))
		hdr[4] = byte(transport.FrameRaft)
		ws.s.SetWriteDeadline(time.Now().Add(waitFor))
		if _, err := ws.s.Write(hdr); err != nil {
			t.Fatal(err)
		}
		for range sent / len(chunk) {
			if _, err := ws.s.Write(chunk); err != nil {
				t.Fatal(err)
			}
		}
	}
	time.Sleep(2 * time.Second) // let the broker read what was sent
	// One stream's partial frame: 20 MiB in a buffer grown by doubling.
	if grew := int64(heapInUse()) - int64(before); grew > 64<<20 {
		t.Fatalf("%d raft streams from one peer, %d MiB of a frame sent on each: the broker's heap grew by %d MiB", streams, sent>>20, grew>>20)
	}
}
