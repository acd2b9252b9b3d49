package broker

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestRaftPairSharesOneConnection: a pair of brokers sends its raft
// messages both ways on the stream the one whose node id sorts first
// opened, so one QUIC connection per pair carries them and each side's
// answers carry its acknowledgements: a replicated record, one at a time,
// costs the peer connections fewer packets than with one stream (and one
// connection) per direction, where each receiver acknowledges every
// other packet in a packet of its own.
func TestRaftPairSharesOneConnection(t *testing.T) {
	// The default tick: heartbeats and keep-alives, which depend on time,
	// not on records, are few beside the records' packets.
	ip := startInprocWith(t, nil, 3, shardmap.StreamConfig{Name: "r", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "r", Shard: 0}
	l := waitOwnerLeads(t, ip, ip.brokers, id)
	if !isAck(publishVia(t, ip, l, "r", 0, 1, "warm")) {
		t.Fatal("first publish not acked")
	}
	// Every broker writes to each peer whose id sorts first on the
	// stream that peer opened (adopted), once the peer has opened it.
	waitRaftStreams(t, ip, func(b, peer string) bool { return peer < b })

	// packets counts the packets on every peer connection, both ways:
	// each is dialed by one broker, and counted there.
	packets := func() (n uint64) {
		for _, b := range ip.brokers {
			b.peers.mu.Lock()
			for _, pc := range b.peers.mu.conns {
				select {
				case <-pc.ready:
					if pc.err == nil {
						st := pc.conn.ConnectionStats()
						n += st.PacketsSent + st.PacketsReceived
					}
				default:
				}
			}
			b.peers.mu.Unlock()
		}
		return n
	}
	const records = 200
	ws := openStream(t, ip.dial(l))
	defer ws.s.Close()
	before := packets()
	for i := range records {
		ws.send(&transport.Publish{Seq: uint64(i + 2), Stream: "r", Value: []byte("v")})
		if f := ws.recv(); !isAck(f) {
			t.Fatalf("record %d: %+v, want an ack", i, f)
		}
	}
	// A record takes a round of appends and answers (4 packets) and a
	// round carrying the new commit index (4 more); with a stream per
	// direction, about 3.4 acknowledgements of their own were added.
	per := float64(packets()-before) / records
	t.Logf("%.2f packets on the peer connections per replicated record", per)
	if per > 9.5 {
		t.Errorf("%.2f packets on the peer connections per replicated record, want at most 9.5 (8 raft messages, and heartbeats)", per)
	}
}

// TestRaftPairWithEarlierPeer: a broker of an earlier version, whose raft
// streams are one-way (Knobs.RaftSimplex), among current ones during a
// rolling upgrade: its peers send to it on streams of their own, the
// current pair shares one stream, and replicated records published
// through every broker are committed and acknowledged.
func TestRaftPairWithEarlierPeer(t *testing.T) {
	old := cluster.BrokerID(0)
	ip := startInprocWith(t, func(c *Config) {
		fastRaft(c)
		c.Knobs.RaftSimplex = c.NodeID == old
	}, 3, shardmap.StreamConfig{Name: "r", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "r", Shard: 0}
	waitOwnerLeads(t, ip, ip.brokers, id)
	for i, b := range ip.brokers {
		if f := publishVia(t, ip, b, "r", 0, uint64(i+1), "v"); !isAck(f) {
			t.Fatalf("publish through %s: %+v, want an ack", b.NodeID(), f)
		}
	}
	waitRaftStreams(t, ip, func(b, peer string) bool { return peer < b && peer != old && b != old })
	l := leaderOf(t, ip.brokers, id)
	for i := range 20 {
		if f := publishVia(t, ip, l, "r", 0, uint64(10+i), "w"); !isAck(f) {
			t.Fatalf("publish %d through the leader %s: %+v, want an ack", i, l.NodeID(), f)
		}
	}
}

// waitRaftStreams waits until every broker of ip has a raft stream open
// to each of its peers, written on the stream the peer opened (adopted)
// exactly where adopted(broker, peer) says.
func waitRaftStreams(t *testing.T, ip *inproc, adopted func(b, peer string) bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		var wrong []string
		for _, b := range ip.brokers {
			b.raft.mu.RLock()
			for node, p := range b.raft.mu.peers {
				p.mu.Lock()
				open, adopt := p.mu.w != nil, p.mu.adopted
				p.mu.Unlock()
				if !open || adopt != adopted(b.NodeID(), node) {
					wrong = append(wrong, fmt.Sprintf("%s->%s open %v adopted %v", b.NodeID(), node, open, adopt))
				}
			}
			if len(b.raft.mu.peers) != len(ip.brokers)-1 {
				wrong = append(wrong, fmt.Sprintf("%s has %d raft peers", b.NodeID(), len(b.raft.mu.peers)))
			}
			b.raft.mu.RUnlock()
		}
		if len(wrong) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("raft streams after %v: %v", waitFor, wrong)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

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

// TestFrameWriterLimitCountsTheWrite: a writer's limit bounds the frames
// waiting and those its flusher is writing together. While the flusher
// writes a full backlog to a peer that reads slowly, new frames are
// dropped rather than filling a second backlog as large.
func TestFrameWriterLimitCountsTheWrite(t *testing.T) {
	s, r := streamPair(t)
	var wg sync.WaitGroup
	w := newAckWriter(s, &wg, nil)
	const limit = 2 << 20
	w.limit = limit
	frame := &transport.Raft{From: "broker-0", Msgs: []transport.RaftMsg{{Stream: "s", Data: make([]byte, 64<<10)}}}
	read := make(chan struct{})
	go func() { // 64 KiB every 2 ms, until the stream is reset
		defer close(read)
		for {
			if _, err := r.Read(); err != nil {
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	peak := 0
	for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); {
		if err := w.send(frame); err != nil {
			t.Fatal(err)
		}
		peak = max(peak, w.backlogged())
	}
	s.CancelWrite(0)
	wg.Wait()
	<-read
	if peak > limit {
		t.Fatalf("%d KiB waiting or being written, over the limit of %d KiB", peak>>10, limit>>10)
	}
	if peak < limit/2 {
		t.Fatalf("at most %d KiB waiting or being written: the reader kept up, and the test tests nothing", peak>>10)
	}
}

// TestRaftPeerOfNodeGoneEnds: a raft peer's sender (its goroutine, its
// queue, its stream) ends once the node is no longer a member of any
// group this broker hosts nor in the map: a broker that outlives many
// peers (nodes retired and replaced under new ids) must not keep one
// goroutine per node it ever sent to.
func TestRaftPeerOfNodeGoneEnds(t *testing.T) {
	const tick, electionTicks = 10 * time.Millisecond, 10
	m := &shardmap.Map{Epoch: 1, Nodes: []shardmap.Node{{ID: "a", Addr: "127.0.0.1:1", Live: true}}}
	n := newRaftNet("a", tick, electionTicks, 1<<20, false, time.Second, nil, func() *shardmap.Map { return m }, quiet())
	defer n.close()
	// A group's last messages to a node the map has just dropped (a
	// replica moved away from a retired broker, say).
	n.send("gone", []transport.RaftMsg{{Stream: "s", Shard: 0, Data: []byte{1}}})
	time.Sleep(5 * electionTicks * tick)
	n.mu.RLock()
	_, kept := n.mu.peers["gone"]
	n.mu.RUnlock()
	if kept {
		t.Fatalf("the raft sender of node %q, in no map and no group, still runs after %v", "gone", 5*electionTicks*tick)
	}
}

// TestRaftStreamDoesNotDecodeOtherFrames: a raft stream carries raft
// frames only, and takes frames of up to raftFrameLimit (128 MiB): a
// frame of another type is refused without being decoded, as ReadIf
// does on the publish and subscribe paths ("a body of many small
// elements decodes to many times its size"). Decoded, a Records frame of
// empty records allocates 12 times its size (96 bytes per 8-byte
// record): a 128 MiB frame, 1.5 GiB.
func TestRaftStreamDoesNotDecodeOtherFrames(t *testing.T) {
	const records = 1 << 20
	b, err := transport.AppendFrame(nil, &transport.Records{Stream: "s", Records: make([]transport.Record, records)})
	if err != nil {
		t.Fatal(err)
	}
	n := newRaftNet("b", time.Hour, 10, 1<<20, false, time.Second, nil, func() *shardmap.Map { return nil }, quiet())
	defer n.close()
	r := transport.NewReader(bytes.NewReader(b), raftFrameLimit)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	err = n.receive("a", r, nil)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("a Records frame on a raft stream was taken")
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 3*uint64(len(b)) {
		t.Fatalf("a %d-byte Records frame on a raft stream allocated %d bytes (%.1f times its size) before it was refused", len(b), alloc, float64(alloc)/float64(len(b)))
	}
}
