package broker

import (
	"sync"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestRaftStreamReopens: when a broker's raft streams to its peers fail
// while every broker runs, the groups stop writing on them and the peers'
// goroutines open new ones; what is published next is committed and
// acknowledged.
func TestRaftStreamReopens(t *testing.T) {
	ip := startInprocWith(t, fastRaft, 3, shardmap.StreamConfig{Name: "r", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "r", Shard: 0}
	l := waitOwnerLeads(t, ip, ip.brokers, id)
	if f, ok := publishVia(t, ip, l, "r", 0, 1, "before").(*transport.Ack); !ok || f.Offset != 0 {
		t.Fatalf("publish: %+v, want an ack at offset 0", f)
	}

	writers := func() map[string]*frameWriter {
		l.raft.mu.RLock()
		defer l.raft.mu.RUnlock()
		out := map[string]*frameWriter{}
		for node, p := range l.raft.mu.peers {
			p.mu.Lock()
			out[node] = p.mu.w
			p.mu.Unlock()
		}
		return out
	}
	old := writers()
	if len(old) != 2 {
		t.Fatalf("%s writes raft streams to %d peers, want 2", l.NodeID(), len(old))
	}
	for node, w := range old {
		if w == nil {
			t.Fatalf("no raft stream open to %s", node)
		}
		w.mu.Lock()
		s := w.mu.s
		w.mu.Unlock()
		s.CancelWrite(0) // the next write on it fails
	}

	deadline := time.Now().Add(waitFor)
	for {
		reopened := 0
		for node, w := range writers() {
			if w != nil && w != old[node] {
				reopened++
			}
		}
		if reopened == len(old) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d raft streams opened again after %v", reopened, len(old), waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if f, ok := publishVia(t, ip, l, "r", 0, 2, "after").(*transport.Ack); !ok || f.Offset != 1 {
		t.Fatalf("publish after the streams were opened again: %+v, want an ack at offset 1", f)
	}
}

// TestFrameWriterBacklogLimit: a writer with a limit drops the frames
// that would take its backlog past it, and keeps the ones before.
func TestFrameWriterBacklogLimit(t *testing.T) {
	var wg sync.WaitGroup
	w := newDetachedWriter(&wg, nil)
	w.limit = 200
	frame := &transport.Raft{From: "broker-0", Msgs: []transport.RaftMsg{{Stream: "s", Data: make([]byte, 60)}}}
	one, err := transport.AppendFrame(nil, frame)
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if err := w.send(frame); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := w.backlogged(), 200/len(one)*len(one); got != want {
		t.Fatalf("backlog %d bytes, want %d (whole frames of %d bytes within the limit)", got, want, len(one))
	}
	w.abort(nil)
	if w.backlogged() != 0 {
		t.Fatal("abort left a backlog")
	}
}
