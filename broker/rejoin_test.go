package broker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestLostReplicaStaysLostAcrossAFailedOpen: a broker whose data
// directory was lost, and that cannot write its replica marks, knows its
// replicas lost by a flag in memory alone (shardSet.mu.lost). An open of
// one that fails must leave the flag for the next: the flag once went
// with the first attempt, and the retry opened the replica under its old
// raft id with an empty log, as a voter, which elected a replica lacking
// five acked records and acked a new one at the first of their offsets.
func TestLostReplicaStaysLostAcrossAFailedOpen(t *testing.T) {
	ip := startInprocWith(t, fastRaft, 3, shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	leader := waitOwnerLeads(t, ip, ip.brokers, id)
	li := slices.Index(ip.brokers, leader)
	bi, vi := (li+1)%3, (li+2)%3
	seq := uint64(0)
	pub := func(via *Broker, v string) *transport.Ack {
		t.Helper()
		seq++
		return wantAck(t, publishVia(t, ip, via, "r3", 0, seq, v), seq)
	}
	for i := range 3 {
		pub(leader, fmt.Sprint("all-", i))
	}
	for _, b := range ip.brokers {
		for deadline := time.Now().Add(waitFor); groupOf(b, id).sl.NextOffset() < 3; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("not replicated")
			}
		}
	}
	victim := ip.brokers[vi]
	oldID := groupOf(victim, id).group.ID()
	// B goes down; 5 records are committed by the leader and the victim.
	if err := ip.brokers[bi].Close(); err != nil {
		t.Fatal(err)
	}
	var acked []uint64
	for i := range 5 {
		acked = append(acked, pub(leader, fmt.Sprint("leader+victim-", i)).Offset)
	}
	leader.Close()
	victim.Close()
	// The victim's disk is lost.
	vdir := filepath.Join(ip.dir, victim.NodeID())
	if err := os.RemoveAll(filepath.Join(vdir, "streams")); err != nil {
		t.Fatal(err)
	}
	ip.brokers[bi] = ip.startBroker(bi)
	// The victim restarts fresh; its replica marks cannot be written for a
	// while (here: a directory in the way; in production: ENOSPC, EIO...).
	v := ip.newBroker(vi)
	block := filepath.Join(vdir, "streams", ".replicas")
	if err := os.MkdirAll(filepath.Join(block, "x"), 0o750); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := v.Start(ctx); err != nil {
		t.Fatal(err)
	}
	ip.brokers[vi] = v
	if groupOf(v, id) != nil {
		t.Fatal("expected the first open to fail while the marks cannot be written")
	}
	// The cause goes away; the next map retries the open.
	if err := os.RemoveAll(block); err != nil {
		t.Fatal(err)
	}
	if err := ip.ctl.CreateStream(shardmap.StreamConfig{Name: "other", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	var e *shardEntry
	for deadline := time.Now().Add(waitFor); e == nil; e = groupOf(v, id) {
		if time.Now().After(deadline) {
			t.Fatal("victim's replica never opened")
		}
		time.Sleep(10 * time.Millisecond)
	}
	voters, _ := e.group.Members()
	if e.group.ID() == oldID {
		t.Errorf("the replica whose log was lost reopened under its old raft id %d (%s, voters %v, next offset %d)",
			oldID, membershipName(e.group), voters, e.sl.NextOffset())
	}
	// With the old leader down, B (which lacks the last five records) and
	// the victim elect B, and B acks new records at the offsets acked before.
	b := ip.brokers[bi]
	deadline := time.Now().Add(10 * time.Second)
	for {
		f := publishVia(t, ip, b, "r3", 0, 1000, "after")
		if a, ok := f.(*transport.Ack); ok {
			if a.Offset <= acked[len(acked)-1] {
				t.Errorf("acked records at offsets %v lost: a new record was acked at offset %d by %s", acked, a.Offset, a.Owner)
			}
			break
		}
		if time.Now().After(deadline) {
			break // no quorum without the old leader: nothing acked, as it must be
		}
		time.Sleep(50 * time.Millisecond)
	}
}
