package broker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/felix-broker/felix/internal/tidseg"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestReplicatedRetention: a stream of replication factor 3 with a size
// limit keeps, on every replica, at least the limit and less than the
// limit plus its oldest segment (Kafka's rule, whole segments); the
// records kept are the latest ones at their acked offsets;
// a subscriber from the earliest offset starts at the first one kept, and
// one from an offset retention dropped is told out_of_range. The
// per-shard gauges report each replica's log.
func TestReplicatedRetention(t *testing.T) {
	const segment, limit = 4 << 10, 16 << 10
	readers := map[string]*sdkmetric.ManualReader{}
	ip := startInprocWith(t, func(c *Config) {
		fastRaft(c)
		c.SegmentSize, c.RetentionCheck = segment, 20*time.Millisecond
		readers[c.NodeID] = sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(readers[c.NodeID]))
		t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
		c.MeterProvider = mp
	}, 3, shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3, RetentionBytes: limit})
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	lead := leaderOf(t, ip.brokers, id)
	value := func(i uint64) string { return fmt.Sprintf("%0200d", i) }
	const n = 300
	pub := openStream(t, ip.dial(lead))
	for round := uint64(0); round < n; round += 30 { // entries of up to 30 records: several segments
		for i := round + 1; i <= round+30; i++ {
			pub.send(&transport.Publish{Seq: i, Stream: "r3", Value: []byte(value(i - 1))})
		}
		for i := round + 1; i <= round+30; i++ {
			wantAck(t, pub.recv(), i)
		}
	}

	for _, b := range ip.brokers {
		e := groupOf(b, id)
		dir, err := b.shards.shardDir(id)
		if err != nil {
			t.Fatal(err)
		}
		// Retention passes run every 20 ms: wait for one after the last
		// record, and for its end (tidwall renames files, then the
		// replica measures them).
		var size int64
		var segs []tidseg.Segment
		var pending bool
		deadline := time.Now().Add(waitFor)
		for {
			// A pass may remove a segment while it is listed or read:
			// look again.
			segs, pending, err = tidseg.List(dir)
			if err == nil {
				size, err = tidseg.DataSize(segs)
			}
			if err == nil && !pending && e.sl.NextOffset() == n && size-segs[0].Size < limit && e.group.Size() == size {
				break
			}
			if time.Now().After(deadline) {
				if err != nil {
					t.Fatal(err)
				}
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		first := e.sl.FirstOffset()
		if first == 0 || first == n || e.sl.NextOffset() != n || size < limit || size-segs[0].Size >= limit {
			t.Fatalf("%s: replica holds offsets [%d, %d) in %d bytes, the oldest segment %d: want %d records, some dropped, at least %d bytes kept and no segment more",
				b.NodeID(), first, e.sl.NextOffset(), size, segs[0].Size, n, limit)
		}
		// The per-shard gauges report the replica's log.
		r := readers[b.NodeID()]
		next, records, bytes := gaugeValues(t, r, "felix.shard.next.offset"), gaugeValues(t, r, "felix.shard.records"), gaugeValues(t, r, "felix.shard.log.size")
		if next["r3/0"] != n || records["r3/0"] != int64(n-first) || bytes["r3/0"] != size {
			t.Fatalf("%s: gauges next %d, records %d, size %d; want %d, %d, %d", b.NodeID(), next["r3/0"], records["r3/0"], bytes["r3/0"], n, n-first, size)
		}
		recs := readReplica(t, e)
		for k, r := range recs {
			if r.Offset != first+uint64(k) || string(r.Value) != value(r.Offset) {
				t.Fatalf("%s: record %d of the replica has offset %d, value %q", b.NodeID(), k, r.Offset, r.Value)
			}
		}
	}

	first := groupOf(lead, id).sl.FirstOffset()
	sub := openStream(t, ip.dial(lead))
	sub.send(&transport.Subscribe{Stream: "r3", Start: transport.StartEarliest, Credit: 1000})
	recs, ok := sub.recv().(*transport.Records)
	if !ok || len(recs.Records) == 0 || recs.Records[0].Offset < first {
		t.Fatalf("subscription from the earliest offset got %+v, want records from %d", recs, first)
	}
	old := openStream(t, ip.dial(lead))
	old.send(&transport.Subscribe{Stream: "r3", Start: transport.StartOffset, Offset: 0, Credit: 1000})
	wantError(t, old.recv(), transport.ErrOutOfRange)
}

// TestReplicatedRetentionFollowerRestart: a broker stopped while the
// others' retention drops the entries it lacks comes back, gets the
// leader's snapshot (its replica's log goes on after the leader's
// compaction point, with the records at their acked offsets), serves
// subscribers from there, and takes part in the next election.
func TestReplicatedRetentionFollowerRestart(t *testing.T) {
	ip := startInprocWith(t, func(c *Config) {
		fastRaft(c)
		c.SegmentSize, c.RetentionCheck = 4<<10, 20*time.Millisecond
	}, 3, shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3, RetentionBytes: 16 << 10})
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	lead := waitOwnerLeads(t, ip, ip.brokers, id)
	value := func(i uint64) string { return fmt.Sprintf("%0200d", i) }
	pub := openStream(t, ip.dial(lead))
	seq := uint64(0)
	// publish sends n records in rounds of 30 (entries of up to 30
	// records, several segments), as producer "p" with sequences from 1
	// if idempotent.
	publish := func(n uint64, idempotent bool) {
		for round := uint64(0); round < n; round += 30 {
			for i := range uint64(30) {
				p := &transport.Publish{Seq: seq + i + 1, Stream: "r3", Value: []byte(value(seq + i))}
				if idempotent {
					p.ProducerID, p.ProducerSeq = "p", seq+i+1
				}
				pub.send(p)
			}
			for i := range uint64(30) {
				wantAck(t, pub.recv(), seq+i+1)
			}
			seq += 30
		}
	}
	publish(30, true)
	k := slices.IndexFunc(ip.brokers, func(b *Broker) bool { return b != lead })
	victim := ip.brokers[k]
	if err := victim.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(15 * 20 * time.Millisecond) // past an election timeout: the leader no longer waits for it
	publish(300, false)
	// Every replica but the victim's past offset 30, not the leader's
	// alone: on a loaded machine the leadership may move to the third
	// replica meanwhile, which would send the victim its log.
	deadline := time.Now().Add(waitFor)
	for _, b := range ip.brokers {
		for b != victim && groupOf(b, id).sl.FirstOffset() <= 30 {
			if time.Now().After(deadline) {
				t.Fatalf("%s's retention did not pass offset 30 within %v", b.NodeID(), waitFor)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	ip.brokers[k] = ip.startBroker(k)
	b := ip.brokers[k]
	var e *shardEntry
	for deadline = time.Now().Add(waitFor); ; time.Sleep(10 * time.Millisecond) {
		if e = groupOf(b, id); e != nil && e.sl.NextOffset() == seq {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's replica did not catch up to %d records within %v", b.NodeID(), seq, waitFor)
		}
	}
	first := e.sl.FirstOffset()
	if first <= 30 {
		t.Fatalf("%s's replica starts at offset %d: it held [0, 30) and the leader had dropped up to past 30, so only a snapshot could catch it up", b.NodeID(), first)
	}
	for k, r := range readReplica(t, e) {
		if r.Offset != first+uint64(k) || string(r.Value) != value(r.Offset) {
			t.Fatalf("%s: record %d of the replica has offset %d, value %q", b.NodeID(), k, r.Offset, r.Value)
		}
	}
	// It never applied producer p's records, but knows p from the table
	// the snapshot carried: a retry of p's sequence 5 is the record at
	// offset 4, not a new one.
	if a := e.producers.admit(scopeProducer(transport.DevAdminName, "p"), 5); a.kind != admitDuplicate || a.ack.offset != 4 {
		t.Fatalf("%s's producer table after the snapshot: p/5 is %+v, want a duplicate of offset 4", b.NodeID(), a)
	}
	sub := openStream(t, ip.dial(b))
	sub.send(&transport.Subscribe{Stream: "r3", Start: transport.StartEarliest, Credit: 1000})
	if recs, ok := sub.recv().(*transport.Records); !ok || len(recs.Records) == 0 || recs.Records[0].Offset != first {
		t.Fatalf("subscription at %s from the earliest offset got %+v, want records from %d", b.NodeID(), recs, first)
	}

	// With the old leader gone, the restarted replica and the third elect
	// a leader that takes publishes.
	rest := ip.closeBroker(t, lead)
	next := leaderOf(t, rest, id)
	if f := publishVia(t, ip, next, "r3", 0, 1, "after"); f.Type() != transport.FrameAck {
		t.Fatalf("publish after the failover: %T %+v", f, f)
	}
	retry := openStream(t, ip.dial(next))
	if a := wantAck(t, retry.roundTrip(idem(1, "r3", "p", 5, value(4))), 1); !a.Duplicate || a.Offset != 4 {
		t.Fatalf("retry of p/5 after the failover (leader %s): %+v, want the duplicate of offset 4", next.NodeID(), a)
	}
}

// shardBytes returns the bytes of records the segment files of b's log of
// stream/shard hold (b may be closed), or an error while a retention pass
// rewrites them.
func shardBytes(b *Broker, stream string, shard int) (int64, error) {
	segs, _, err := tidseg.List(filepath.Join(b.cfg.DataDir, "streams", stream, strconv.Itoa(shard)))
	if err != nil {
		return 0, err
	}
	return tidseg.DataSize(segs)
}

// liveLogs counts b's logs open or opening, not those being closed to
// make room for them (acquire closes those before it opens the new one,
// but they count in openLogs until they are closed).
func liveLogs(b *Broker) int {
	b.shards.mu.RLock()
	defer b.shards.mu.RUnlock()
	n := 0
	for _, e := range b.shards.mu.entries {
		if e.gone == nil {
			n++
		}
	}
	return n
}

// waitExpired waits until no shard of stream holds a record on b, and
// fails if that takes past waitFor or b ever has more than budget logs
// open meanwhile.
func waitExpired(t *testing.T, b *Broker, stream string, shards, budget int) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		if n := liveLogs(b); n > budget {
			t.Fatalf("%d logs open, MaxOpenShards %d", n, budget)
		}
		held := 0
		var last error
		for shard := range shards {
			n, err := shardBytes(b, stream, shard)
			if err != nil || n > 0 {
				held++
				last = fmt.Errorf("%s/%d holds %d bytes (%v)", stream, shard, n, err)
			}
		}
		if held == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d shards still hold expired records %v on (MaxOpenShards %d: %d logs open); last: %v",
				held, shards, waitFor, budget, b.shards.openLogs(), last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAgeRetentionOfClosedLogs: with twice as many shards as the broker
// may keep logs open, every shard's records go once older than the
// stream's RetentionAge, those of the logs closed for the budget too
// (their retention stopped with them, and nothing used them again), and
// the sweep that opens them keeps within the budget. A deleted stream's
// closed logs are not opened again.
func TestAgeRetentionOfClosedLogs(t *testing.T) {
	const budget, shards = 4, 8
	const age = 200 * time.Millisecond
	ip := startInprocWith(t, func(c *Config) {
		c.MaxOpenShards = budget
		c.RetentionCheck = 20 * time.Millisecond
	}, 1, shardmap.StreamConfig{Name: "aged", Shards: shards, RetentionAge: age})
	b := ip.brokers[0]
	ws := openStream(t, ip.dial(b))
	for shard := range shards {
		wantAck(t, publishShard(ws, uint64(shard), "aged", shard, "old"), uint64(shard))
	}
	closed := 0
	for shard := range shards {
		if n, err := shardBytes(b, "aged", shard); err != nil || n == 0 {
			t.Fatalf("aged/%d holds %d bytes (%v) right after its publish", shard, n, err)
		}
		b.shards.mu.RLock()
		if _, open := b.shards.mu.entries[shardmap.ShardID{Stream: "aged", Shard: shard}]; !open {
			closed++
		}
		b.shards.mu.RUnlock()
	}
	if closed < shards-budget {
		t.Fatalf("%d logs closed for the budget, want at least %d", closed, shards-budget)
	}
	waitExpired(t, b, "aged", shards, budget)

	// Records again, due in RetentionAge, and the stream deleted before
	// that: its data goes and nothing opens its logs again.
	for shard := range shards {
		wantAck(t, publishShard(ws, uint64(shards+shard), "aged", shard, "new"), uint64(shards+shard))
	}
	if err := ip.ctl.DeleteStream("aged"); err != nil {
		t.Fatal(err)
	}
	ip.waitEpoch(ip.ctl.Map().Epoch)
	time.Sleep(age + 10*20*time.Millisecond) // past the due time, ten sweeps
	if _, err := os.Stat(filepath.Join(b.cfg.DataDir, "streams", "aged")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the deleted stream's directory: %v; want it gone", err)
	}
}

// TestByteRetentionOfClosedLogs: a log closed for the budget is brought
// within the stream's RetentionBytes as it closes, though its own passes
// (every RetentionCheck, an hour here) never ran: a closed log cannot
// grow, so nothing else is needed until it opens again.
func TestByteRetentionOfClosedLogs(t *testing.T) {
	const budget, shards, limit = 4, 8, 2 << 10
	ip := startInprocWith(t, func(c *Config) {
		c.MaxOpenShards = budget
		c.RetentionCheck = time.Hour
	}, 1, shardmap.StreamConfig{Name: "sized", Shards: shards, RetentionBytes: limit})
	b := ip.brokers[0]
	ws := openStream(t, ip.dial(b))
	seq := uint64(0)
	for shard := range shards {
		for range 20 { // about four times the limit
			wantAck(t, publishShard(ws, seq, "sized", shard, fmt.Sprintf("%0200d", seq)), seq)
			seq++
		}
	}
	closed := 0
	for shard := range shards {
		b.shards.mu.RLock()
		_, open := b.shards.mu.entries[shardmap.ShardID{Stream: "sized", Shard: shard}]
		b.shards.mu.RUnlock()
		n, err := shardBytes(b, "sized", shard)
		if err != nil {
			t.Fatal(err)
		}
		if open {
			continue
		}
		closed++
		if n > limit || n == 0 {
			t.Errorf("sized/%d, closed for the budget, holds %d bytes; want within RetentionBytes %d, and some", shard, n, limit)
		}
	}
	if closed < shards-budget {
		t.Fatalf("%d logs closed for the budget, want at least %d", closed, shards-budget)
	}
}

// TestRetentionOfLogsClosedSinceRestart: after a restart the broker opens
// only as many logs as its budget allows; the shards it left closed, and
// nothing used since, still lose their records past RetentionAge (what it
// knew of them went with the restart: each is opened once to find out),
// within the budget.
func TestRetentionOfLogsClosedSinceRestart(t *testing.T) {
	const budget, shards = 4, 8
	const age = 300 * time.Millisecond
	check := time.Hour // no retention pass before the restart
	ip := startInprocWith(t, func(c *Config) {
		c.MaxOpenShards = budget
		c.RetentionCheck = check
	}, 1, shardmap.StreamConfig{Name: "aged", Shards: shards, RetentionAge: age})
	b := ip.brokers[0]
	ws := openStream(t, ip.dial(b))
	for shard := range shards {
		wantAck(t, publishShard(ws, uint64(shard), "aged", shard, "old"), uint64(shard))
	}
	published := time.Now()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for shard := range shards {
		if n, err := shardBytes(b, "aged", shard); err != nil || n == 0 {
			t.Fatalf("aged/%d holds %d bytes (%v) before the restart", shard, n, err)
		}
	}
	time.Sleep(time.Until(published.Add(age)))
	check = 20 * time.Millisecond
	b = ip.startBroker(0)
	ip.brokers[0] = b
	if n := liveLogs(b); n > budget {
		t.Fatalf("%d logs open after the restart, budget %d", n, budget)
	}
	waitExpired(t, b, "aged", shards, budget)
}
