package replica

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
)

// TestStepQueueIsBounded: while a follower's goroutine is held in a slow
// fdatasync, what a peer sends waits for it. A peer that ignores the
// in-flight bound (here the test, in the leader's name) must not make it
// hold more than four times MaxInflightBytes: Step drops the rest, as a
// lost message. (Before the bound, all 128 MiB waited.)
func TestStepQueueIsBounded(t *testing.T) {
	var armed atomic.Uint64 // the replica whose next fdatasync blocks
	gate := make(chan struct{})
	c := newCluster(t, 3, 41, func(cfg *Config) {
		id := cfg.ID
		cfg.Knobs.BeforeSync = func(uint64) error {
			if armed.Load() == id {
				<-gate
			}
			return nil
		}
	})
	defer close(gate)
	lead := c.waitLeader()
	victim := lead.ID()%3 + 1
	f := c.group(victim)
	c.commit([]byte("settled"))
	time.Sleep(100 * time.Millisecond)
	armed.Store(victim)
	c.net.Isolate(victim, 1, 2, 3) // only the test's messages reach it from here on
	_, term := lead.Leader()
	// One real append that blocks the follower's goroutine in its sync.
	last := c.net.Appended(victim)
	ent := func(i uint64, data []byte) *pb.Entry {
		return &pb.Entry{Type: pb.EntryNormal.Enum(), Term: new(term), Index: new(i), Data: data}
	}
	data := make([]byte, 64<<10)
	msg := func() *pb.Message {
		return &pb.Message{Type: pb.MsgApp.Enum(), To: new(uint64(victim)), From: new(lead.ID()), Term: new(term),
			Index: new(last), LogTerm: new(term), Commit: new(uint64(0)), Entries: []*pb.Entry{ent(last+1, data)}}
	}
	if err := f.Step(msg()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the goroutine takes it and blocks in BeforeSync
	for i := 0; i < 2048; i++ {        // 2048 × 64 KiB = 128 MiB
		if err := f.Step(msg()); err != nil {
			t.Fatalf("Step %d: %v (a message over the bound is dropped, not refused)", i, err)
		}
	}
	f.in.Lock()
	n, held := len(f.in.msgs), 0
	for _, m := range f.in.msgs {
		for _, e := range m.GetEntries() {
			held += len(e.GetData())
		}
	}
	f.in.Unlock()
	limit := 4 * 4 * (1 << 20) // four times MaxInflightBytes, 4 × the default MaxEntryBytes
	if held > limit || held < limit/2 {
		t.Fatalf("a follower whose goroutine is in a slow fdatasync holds %d KiB of a peer's messages (%d messages), want at most %d KiB and near it",
			held>>10, n, limit>>10)
	}
	if got, want := f.overflows.Load(), uint64(2048-n); got != want {
		t.Fatalf("%d messages dropped, want %d", got, want)
	}
}

// TestFollowerCatchesUpAfterStepDrops: a follower whose fdatasync is held
// up while its leader sends more than its Step bound (a leader allowed
// more in flight than the follower takes) drops the excess; once the
// fdatasync returns it catches up from the leader, and every replica
// holds every acknowledged record at its offset.
func TestFollowerCatchesUpAfterStepDrops(t *testing.T) {
	const victim = 3
	var armed atomic.Bool
	gate := make(chan struct{})
	c := newCluster(t, 3, 43, func(cfg *Config) {
		// Small entries, and elections slow enough for a loaded machine:
		// a leader's goroutine busy writing must not miss its quorum.
		cfg.MaxEntryBytes, cfg.MaxInflightBytes, cfg.ElectionTicks = 64<<10, 16<<20, 50
		if cfg.ID != victim {
			return
		}
		cfg.MaxInflightBytes = 64 << 10 // takes 256 KiB waiting, of a leader's 16 MiB
		cfg.ElectionTicks = 500         // never the leader here
		cfg.Knobs.BeforeSync = func(uint64) error {
			if armed.Load() {
				<-gate
			}
			return nil
		}
	})
	released := false
	release := func() {
		if !released {
			released = true
			close(gate)
		}
	}
	defer release()
	lead := c.waitLeader()
	if lead.ID() == victim {
		t.Fatalf("replica %d leads", victim)
	}
	c.commit([]byte("settled"))
	c.waitConverged(1)
	f := c.group(victim)
	armed.Store(true)

	// 1.5 MiB while the victim's goroutine is held in its first
	// fdatasync: the leader and the other follower commit them.
	acked := map[uint64][]byte{}
	var pending []<-chan result
	var values [][]byte
	for i := range 384 {
		v := bytes.Repeat([]byte{byte(i)}, 4<<10)
		copy(v, fmt.Sprintf("record %d", i))
		values = append(values, v)
		pending = append(pending, appendTo(lead, v))
	}
	for i, ch := range pending {
		select {
		case r := <-ch:
			if r.err != nil {
				t.Fatalf("record %d: %v", i, r.err)
			}
			acked[r.offset] = values[i]
		case <-time.After(30 * time.Second):
			t.Fatalf("record %d not acknowledged within 30s", i)
		}
	}
	if f.overflows.Load() == 0 {
		t.Fatal("the held-up follower dropped nothing: the test does not test what it says")
	}
	f.in.Lock()
	held := f.in.msgBytes
	f.in.Unlock()
	if held > 256<<10 {
		t.Fatalf("the held-up follower holds %d KiB waiting, over its 256 KiB", held>>10)
	}

	armed.Store(false)
	release()
	c.commit([]byte("after"))
	next := c.waitConverged(uint64(len(acked)) + 2)
	recs := c.checkSame(next)
	for off, v := range acked {
		if !bytes.Equal(recs[off].Value, v) {
			t.Fatalf("acknowledged record at offset %d: %q..., want %q...", off, recs[off].Value[:16], v[:16])
		}
	}
}

// TestFollowerTakesAnAppendOverItsBound: followers configured for
// smaller entries than their leader's (brokers whose record limits are
// changed one at a time) take an append larger than their whole Step
// bound, when nothing else waits: the record is committed and every
// replica holds it. Step dropped such an append every time the leader
// sent it again, so it was never committed.
func TestFollowerTakesAnAppendOverItsBound(t *testing.T) {
	const leader = 1
	c := newCluster(t, 3, 47, func(cfg *Config) {
		cfg.MaxEntryBytes, cfg.ElectionTicks = 2<<20, 20
		if cfg.ID != leader {
			// Step takes 256 KiB waiting, and one message alone; never
			// the leader here.
			cfg.MaxEntryBytes, cfg.MaxInflightBytes, cfg.ElectionTicks = 64<<10, 64<<10, 500
		}
	})
	lead := c.waitLeader()
	if lead.ID() != leader {
		t.Fatalf("replica %d leads, want %d", lead.ID(), leader)
	}
	big := bytes.Repeat([]byte("x"), 1<<20)
	select {
	case r := <-appendTo(lead, big):
		if r.err != nil {
			t.Fatalf("the %d-byte record: %v", len(big), r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the %d-byte record was not committed within 20s", len(big))
	}
	next := c.waitConverged(1)
	if recs := c.checkSame(next); !bytes.Equal(recs[next-1].Value, big) {
		t.Fatalf("the last record holds %d bytes, want the %d-byte one", len(recs[next-1].Value), len(big))
	}
}
