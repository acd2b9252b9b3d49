package broker

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"

	"github.com/felix-broker/felix/internal/procio"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
	"github.com/felix-broker/felix/wal"
)

// behindValue is the value of the record at offset off in
// TestSubscribersFarBehindAtCreditOne's log: 128 bytes naming off.
func behindValue(off uint64) []byte {
	v := bytes.Repeat([]byte{byte('a' + off%26)}, 128)
	binary.LittleEndian.PutUint64(v, off)
	return v
}

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
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	for off := range uint64(records) {
		wg.Add(1)
		e.log.AppendAsync(&wal.Record{Key: []byte("k"), Value: behindValue(off)}, func(got uint64, _ int64, err error) {
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
		t.Fatalf("the broker read %d bytes per record it sent to %d subscribers at credit 1 (a record is 163 in its segment), want under 64 KiB", perRecord, subscribers)
	}
}
