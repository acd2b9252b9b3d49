package broker

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/catchuptest"
	"github.com/felix-broker/felix/internal/procio"
	"github.com/felix-broker/felix/replica"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
	"github.com/felix-broker/felix/wal"
)

// behindValue is the value of the record at offset off in
// TestSubscribersFarBehindAtCreditOne's log: 128 bytes naming off, as
// in the wal's and replicas' catch-up tests.
var behindValue = catchuptest.Value

// TestSubscribersFarBehindAtCreditOne: four subscribers catching up from
// different old segments of one shard, each granting one record at a
// time, served round-robin, each receive every record from their offset
// on, in order, once, with its content; and the broker reads about what
// it sends from the segment files, not a segment (1 MiB) per record, as
// it did when the subscriptions evicted each other's segment from the
// log's cache of two (a client opening such subscriptions could make a
// broker read ~8,000 times what it sent).
func TestSubscribersFarBehindAtCreditOne(t *testing.T) {
	ip := startInprocWith(t, func(c *Config) { c.TailBytes = 64 << 10 }, 1,
		shardmap.StreamConfig{Name: "history", Shards: 1})
	b := ip.brokers[0]
	e, err := b.shards.acquire(b.Map(), shardmap.ShardID{Stream: "history", Shard: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer e.release()
	// About 9 segments of 1 MiB, appended to the log directly.
	const records = 9 << 20 / 163
	appendBehind(t, e.log.AppendAsync, 0, records)
	subscribeBehind(t, ip, b, records)
}

// appendBehind appends the records of offsets [from, to), whose values
// name them (behindValue), through app at once, and waits for them.
func appendBehind(t *testing.T, app func(*wal.Record, func(uint64, int64, error)), from, to uint64) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	for off := from; off < to; off++ {
		wg.Add(1)
		app(&wal.Record{Key: []byte("k"), Value: behindValue(off)}, func(got uint64, _ int64, err error) {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			if err == nil && got != off {
				err = fmt.Errorf("record %d appended at offset %d", off, got)
			}
			if err != nil && failed == nil {
				failed = err
			}
		})
	}
	wg.Wait()
	if failed != nil {
		t.Fatal(failed)
	}
}

// TestReplicatedSubscribersFarBehindAtCreditOne is
// TestSubscribersFarBehindAtCreditOne on a stream of replication factor
// 3: four subscribers of the leader's replica, catching up from different
// old segments of its raft log at credit 1, round-robin, each receive
// every record from their offset on, in order, once, with its content,
// and the broker reads about what it sends, not a segment (1 MiB) per
// record, as it did when they read through tidwall's cache of two
// segments.
func TestReplicatedSubscribersFarBehindAtCreditOne(t *testing.T) {
	ip := startInprocWith(t, func(c *Config) { fastRaft(c); c.TailBytes = 64 << 10 }, 3,
		shardmap.StreamConfig{Name: "history", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "history", Shard: 0}
	// The first record is appended again until the owner leads and takes
	// it (a new group hands its leadership over to the owner).
	st, _ := ip.brokers[0].Map().Stream("history")
	var b *Broker
	for {
		if b = leaderOf(t, ip.brokers, id); b.NodeID() != st.Placement.Owner(0) {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		done := make(chan error, 1)
		groupOf(b, id).group.AppendAsync(&wal.Record{Key: []byte("k"), Value: behindValue(0)}, func(got uint64, _ int64, err error) {
			if err == nil && got != 0 {
				err = fmt.Errorf("the first record appended at offset %d", got)
			}
			done <- err
		})
		err := <-done
		if err == nil {
			break
		}
		if !errors.Is(err, replica.ErrNotLeader) && !errors.Is(err, replica.ErrDropped) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	e := groupOf(b, id)
	// About 9 segments of 1 MiB, in entries of 64 records (a busy shard's
	// group-commit batches), appended to the group directly.
	const records = 9 << 20 / 163
	for off := uint64(1); off < records; off += 64 {
		appendBehind(t, e.group.AppendAsync, off, min(off+64, records))
	}
	subscribeBehind(t, ip, b, records)
}

// subscribeBehind has four subscribers of b catch up from segments 1, 3,
// 5 and 7 of shard 0 of stream history, whose records (about 9 segments
// of them) hold behindValue, at credit 1, round-robin, checks every
// record, and fails if b read 64 KiB or more from files per record sent.
func subscribeBehind(t *testing.T, ip *inproc, b *Broker, records uint64) {
	t.Helper()
	const subscribers, each = 4, 150
	conn := ip.dial(b)
	subs := make([]*wireStream, subscribers)
	next := make([]uint64, subscribers)
	for k := range subs {
		next[k] = uint64(1+2*k)*(records/9) + 17 // in segments 1, 3, 5 and 7
		subs[k] = openStream(t, conn)
		subs[k].send(&transport.Subscribe{Stream: "history", Start: transport.StartOffset, Offset: next[k], Credit: 1})
	}
	recv := func(k int) {
		t.Helper()
		f := subs[k].recv()
		recs, ok := f.(*transport.Records)
		if !ok {
			t.Fatalf("subscriber %d: got %T %+v, want records", k, f, f)
		}
		if len(recs.Records) != 1 {
			t.Fatalf("subscriber %d at credit 1: a frame of %d records", k, len(recs.Records))
		}
		r := recs.Records[0]
		if r.Offset != next[k] || !bytes.Equal(r.Value, behindValue(next[k])) {
			t.Fatalf("subscriber %d: record at offset %d (value naming %d), want %d",
				k, r.Offset, binary.LittleEndian.Uint64(r.Value), next[k])
		}
		next[k]++ // so a record sent twice or skipped fails the next check
		subs[k].send(&transport.Credit{Records: 1})
	}
	for k := range subs { // each finds its place
		recv(k)
	}
	before, counted := procio.Read()
	for range each - 1 {
		for k := range subs {
			recv(k)
		}
	}
	after, _ := procio.Read()
	perRecord := (after - before) / (subscribers * (each - 1))
	t.Logf("%d bytes read per record sent", perRecord)
	if counted && perRecord > 64<<10 {
		t.Fatalf("the broker read %d bytes per record it sent to %d subscribers at credit 1 (a record takes under 170 bytes on disk), want under 64 KiB", perRecord, subscribers)
	}
}
