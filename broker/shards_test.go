package broker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/ctl"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
	"github.com/felix-broker/felix/wal"
)

// publishShard publishes one record to shard of stream on ws and returns the
// answer.
func publishShard(ws *wireStream, seq uint64, stream string, shard int, value string) transport.Frame {
	ws.t.Helper()
	p := publish(seq, stream, value)
	p.Shard = int32(shard)
	ws.send(p)
	return ws.recv()
}

// untilNil waits until check returns nil, failing with its last error
// after waitFor.
func untilNil(t *testing.T, check func() error) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// dirNames lists dir, sorted.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// readAll reads every record of a shard's log.
func readAll(t *testing.T, b *Broker, stream string, shard int) []string {
	t.Helper()
	e, err := b.shards.acquire(b.Map(), shardmap.ShardID{Stream: stream, Shard: shard})
	if err != nil {
		t.Fatalf("%s/%d: %v", stream, shard, err)
	}
	defer e.release()
	var out []string
	for off := e.log.FirstOffset(); off < e.log.NextOffset(); {
		recs, err := e.log.Read(off, 100, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			out = append(out, string(r.Value))
		}
		off += uint64(len(recs))
	}
	return out
}

// TestTroublesomeStreamNames: next to stream "0" holding records, streams
// with every troublesome name are created, published to and deleted
// through ctl. Names unsafe as a directory are refused at creation with a
// typed error and reach neither ctl's state nor the disk; valid names that
// look alike ("00", prefixes of each other, the longest) get their own
// directories, and deleting them removes only theirs. "0"'s records
// survive all of it and a restart.
func TestTroublesomeStreamNames(t *testing.T) {
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "0", Shards: 2})
	b := ip.brokers[0]
	ws := openStream(t, ip.dial(b))
	want := map[int][]string{}
	seq := uint64(0)
	for i := range 10 {
		shard := i % 2
		v := fmt.Sprintf("zero-%d", i)
		wantAck(t, publishShard(ws, seq, "0", shard, v), seq)
		want[shard] = append(want[shard], v)
		seq++
	}
	streamsDir := filepath.Join(ip.dir, b.NodeID(), "streams")
	parentBefore := dirNames(t, filepath.Join(ip.dir, b.NodeID()))

	bad := []string{".", "..", "...", ".hidden", ".deleted-0-1", "a/b", "../x", "../0", "0/../1", `a\b`,
		"a\x00b", "a\nb", "ünïcode", "名前", "", strings.Repeat("x", shardmap.MaxStreamName+1)}
	for _, name := range bad {
		err := ip.ctl.CreateStream(shardmap.StreamConfig{Name: name, Shards: 1})
		if !errors.Is(err, ctl.ErrInvalid) || !errors.Is(err, transport.ErrInvalid) {
			t.Errorf("create %q: err=%v, want a typed invalid error", name, err)
		}
		if err := ip.ctl.DeleteStream(name); !errors.Is(err, transport.ErrUnknownStream) {
			t.Errorf("delete %q: err=%v, want unknown stream", name, err)
		}
		// A publish by that name is refused too, and opens nothing.
		f := publishShard(ws, seq, name, 0, "x")
		if _, ok := f.(*transport.Error); !ok {
			t.Errorf("publish to %q: got %T %+v, want an error", name, f, f)
		}
		seq++
	}

	good := []string{"00", "0.", "0..0", "0-", "0_", "o", "or", "order", "orders", "orders2", "Zero",
		strings.Repeat("x", shardmap.MaxStreamName)}
	for round := range 2 { // the second round recreates every name after its delete
		for _, name := range good {
			if err := ip.ctl.CreateStream(shardmap.StreamConfig{Name: name, Shards: 2}); err != nil {
				t.Fatalf("create %q: %v", name, err)
			}
		}
		ip.waitEpoch(ip.ctl.Map().Epoch)
		for _, name := range good {
			for shard := range 2 {
				a := wantAck(t, publishShard(ws, seq, name, shard, name), seq)
				if a.Offset != 0 {
					t.Fatalf("round %d: first record of %s/%d at offset %d: the data of another stream or incarnation leaked in", round, name, shard, a.Offset)
				}
				seq++
			}
		}
		got := dirNames(t, streamsDir)
		wantDirs := append([]string{"0"}, good...)
		slices.Sort(wantDirs)
		if !slices.Equal(got, wantDirs) {
			t.Fatalf("round %d: streams dir holds %q, want %q", round, got, wantDirs)
		}
		for _, name := range good {
			if err := ip.ctl.DeleteStream(name); err != nil {
				t.Fatalf("delete %q: %v", name, err)
			}
		}
		ip.waitEpoch(ip.ctl.Map().Epoch)
		untilNil(t, func() error {
			if got := dirNames(t, streamsDir); !slices.Equal(got, []string{"0"}) {
				return fmt.Errorf("round %d: after deleting, the streams dir holds %q, want only 0", round, got)
			}
			return nil
		})
	}
	if got := dirNames(t, filepath.Join(ip.dir, b.NodeID())); !slices.Equal(got, parentBefore) {
		t.Fatalf("the broker's data dir changed from %q to %q", parentBefore, got)
	}
	if got := dirNames(t, filepath.Join(streamsDir, "0")); !slices.Equal(got, []string{createdFile, "0", "1"}) {
		t.Fatalf("stream 0's dir holds %q, want its mark and its two shards", got)
	}

	// Restart: "0" holds exactly its records, and offsets continue.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = ip.startBroker(0)
	ip.brokers[0] = b
	for shard := range 2 {
		if got := readAll(t, b, "0", shard); !slices.Equal(got, want[shard]) {
			t.Fatalf("after restart 0/%d holds %q, want %q", shard, got, want[shard])
		}
	}
	ws = openStream(t, ip.dial(b))
	if a := wantAck(t, publishShard(ws, 0, "0", 0, "after"), 0); a.Offset != uint64(len(want[0])) {
		t.Fatalf("offset after restart %d, want %d", a.Offset, len(want[0]))
	}
}

// testShardSet is a shard set on its own, as the broker of node n1 would
// hold it, with maps made by hand: it shows what the broker does with a map
// that ctl would never push (names that are not valid).
func testShardSet(t *testing.T, dataDir string, tweak func(*Config)) *shardSet {
	t.Helper()
	cfg := Config{NodeID: "n1", DataDir: dataDir, MaxOpenShards: 64, MaxShards: 1024}
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := newShardSet(cfg, quiet(), &telemetry{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func handMap(epoch uint64, streams ...shardmap.StreamConfig) *shardmap.Map {
	return shardmap.Build(epoch, []shardmap.Node{{ID: "n1", Addr: "x:1", Live: true}}, streams)
}

// TestInvalidNamesInAMapNeverReachTheDisk: a map naming streams ".",
// "..", "a/b" or "../0" (which ctl refuses, but a hand-edited state or a
// bug could produce) makes the broker refuse those shards with an error;
// it creates, opens and removes nothing for them, also when they are
// deleted, and stream "0" keeps its records across a restart.
func TestInvalidNamesInAMapNeverReachTheDisk(t *testing.T) {
	dataDir := t.TempDir()
	s := testShardSet(t, dataDir, nil)
	bad := []string{".", "..", ".hidden", "a/b", "../0", "../../escape", "/abs"}
	streams := []shardmap.StreamConfig{{Name: "0", Shards: 2}}
	for _, name := range bad {
		streams = append(streams, shardmap.StreamConfig{Name: name, Shards: 2})
	}
	m1 := handMap(1, streams...)
	_, r := s.apply(m1)
	if r.failed != 2*len(bad) || r.opened != 2 {
		t.Fatalf("apply: opened %d, failed %d (first %v); want 2 opened, %d failed", r.opened, r.failed, r.failedErr, 2*len(bad))
	}
	for shard := range 2 {
		e, err := s.acquire(m1, shardmap.ShardID{Stream: "0", Shard: shard})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if _, err := e.log.Append(context.Background(), &wal.Record{Value: fmt.Appendf(nil, "%d", i)}); err != nil {
				t.Fatal(err)
			}
		}
		e.release()
	}
	for _, name := range bad {
		if _, err := s.acquire(m1, shardmap.ShardID{Stream: name, Shard: 0}); !errors.Is(err, shardmap.ErrInvalidStreamName) {
			t.Errorf("acquire %q: err=%v, want an invalid-name error", name, err)
		}
	}
	if got := dirNames(t, dataDir); !slices.Equal(got, []string{"streams"}) {
		t.Fatalf("data dir holds %q", got)
	}
	if got := dirNames(t, filepath.Join(dataDir, "streams")); !slices.Equal(got, []string{"0"}) {
		t.Fatalf("streams dir holds %q", got)
	}

	// The bad streams are deleted: nothing is removed for them.
	_, r = s.apply(handMap(2, shardmap.StreamConfig{Name: "0", Shards: 2}))
	if len(r.deleteErr) != 0 || len(r.deleted) != 0 {
		// They were never admitted or opened, so there is nothing to delete.
		t.Fatalf("apply without the bad streams: deleted %q, errors %v", r.deleted, r.deleteErr)
	}
	if err := s.removeStream(".", 3); err == nil {
		t.Fatal("removeStream(\".\") did not refuse")
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}

	s = testShardSet(t, dataDir, nil)
	defer s.close()
	m := handMap(3, shardmap.StreamConfig{Name: "0", Shards: 2})
	s.apply(m)
	for shard := range 2 {
		e, err := s.acquire(m, shardmap.ShardID{Stream: "0", Shard: shard})
		if err != nil {
			t.Fatal(err)
		}
		if n := e.log.NextOffset(); n != 3 {
			t.Fatalf("0/%d holds %d records after restart, want 3", shard, n)
		}
		e.release()
	}
}

// TestDeletedStreamTrashIsAtomic: a deletion interrupted after its rename
// leaves trash that the next start removes; a stream of the same name
// created meanwhile starts empty.
func TestDeletedStreamTrashIsAtomic(t *testing.T) {
	dataDir := t.TempDir()
	trash := filepath.Join(dataDir, "streams", trashPrefix+"orders-7", "0")
	if err := os.MkdirAll(trash, 0o750); err != nil {
		t.Fatal(err)
	}
	s := testShardSet(t, dataDir, nil)
	defer s.close()
	if got := dirNames(t, filepath.Join(dataDir, "streams")); len(got) != 0 {
		t.Fatalf("trash left after start: %q", got)
	}
}

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	return len(ents)
}

// TestOpenLogBudget: with MaxOpenShards 4 and a stream of 20 shards on one
// broker, publishing to every shard, round after round, works; no more
// than 4 logs are ever open and the process's file descriptors grow by no
// more than those logs hold; every record is there after a restart.
func TestOpenLogBudget(t *testing.T) {
	const budget, shards, rounds = 4, 20, 3
	ip := startInprocWith(t, func(c *Config) { c.MaxOpenShards = budget }, 1, shardmap.StreamConfig{Name: "many", Shards: shards})
	b := ip.brokers[0]
	ws := openStream(t, ip.dial(b))
	before := openFDs(t)
	if n := b.shards.openLogs(); n > budget {
		t.Fatalf("%d logs open after start, budget %d", n, budget)
	}
	seq := uint64(0)
	peakLogs, peakFDs := 0, 0
	for round := range rounds {
		for shard := range shards {
			a := wantAck(t, publishShard(ws, seq, "many", shard, fmt.Sprint(round)), seq)
			if a.Offset != uint64(round) {
				t.Fatalf("%d/%d: offset %d, want %d", round, shard, a.Offset, round)
			}
			seq++
			peakLogs = max(peakLogs, b.shards.openLogs())
			peakFDs = max(peakFDs, openFDs(t))
		}
	}
	if peakLogs > budget {
		t.Fatalf("%d logs open at the peak, budget %d", peakLogs, budget)
	}
	// The logs open before the first publish were already counted; a
	// little slack for QUIC and the runtime.
	if grew := peakFDs - before; grew > budget*fdsPerShard+8 {
		t.Fatalf("file descriptors grew by %d (from %d), budget %d logs", grew, before, budget)
	}
	t.Logf("peak: %d logs, %d fds (%d before publishing)", peakLogs, peakFDs, before)

	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = ip.startBroker(0)
	ip.brokers[0] = b
	for shard := range shards {
		if got := readAll(t, b, "many", shard); !slices.Equal(got, []string{"0", "1", "2"}) {
			t.Fatalf("many/%d holds %q after restart", shard, got)
		}
	}
	if n := b.shards.openLogs(); n > budget {
		t.Fatalf("%d logs open after reading them all, budget %d", n, budget)
	}
}

// TestOpenLogBudgetInUse: logs pinned by subscriptions are never closed
// for the budget: publishes to other shards cycle through the budget's
// rest, and the subscriptions keep working; a subscription ended gives
// its log back. With every log of the budget in use, an open gets a
// typed error naming the limit.
func TestOpenLogBudgetInUse(t *testing.T) {
	const budget = 4
	ip := startInprocWith(t, func(c *Config) { c.MaxOpenShards = budget }, 1, shardmap.StreamConfig{Name: "s", Shards: 8})
	if err := ip.ctl.Grant(auth.Grant{Principal: "bob", Action: auth.Subscribe, Pattern: "s"}); err != nil {
		t.Fatal(err)
	}
	ip.waitEpoch(ip.ctl.Map().Epoch)
	b := ip.brokers[0]
	conns := []*quic.Conn{ip.dial(b), ip.dialAs(b, "bob")}
	pinnable := b.shards.pinBudget().all
	var subs []*wireStream
	for shard := range pinnable {
		sub := openStream(t, conns[shard%2])
		sub.send(&transport.Subscribe{Stream: "s", Shard: int32(shard), Start: transport.StartEarliest, Credit: 10})
		subs = append(subs, sub)
	}
	pinned := func() int {
		b.shards.mu.RLock()
		defer b.shards.mu.RUnlock()
		n := 0
		for _, e := range b.shards.mu.entries {
			if e.refs.Load() > 0 {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(waitFor)
	for pinned() < pinnable {
		if time.Now().After(deadline) {
			t.Fatalf("%d subscriptions pinned, want %d", pinned(), pinnable)
		}
		time.Sleep(5 * time.Millisecond)
	}
	ws := openStream(t, ip.dial(b))
	seq := uint64(0)
	for shard := pinnable; shard < 8; shard++ {
		seq++
		wantAck(t, publishShard(ws, seq, "s", shard, "x"), seq)
	}
	// The subscriptions still work: a record published to shard 0 arrives.
	seq++
	wantAck(t, publishShard(ws, seq, "s", 0, "live"), seq)
	if recs, ok := subs[0].recv().(*transport.Records); !ok || string(recs.Records[0].Value) != "live" {
		t.Fatalf("subscription of s/0 got %+v", recs)
	}
	subs[1].s.CancelRead(0)
	subs[1].s.Close()
	deadline = time.Now().Add(waitFor)
	for pinned() >= pinnable {
		if time.Now().After(deadline) {
			t.Fatal("the ended subscription still pins its log")
		}
		time.Sleep(5 * time.Millisecond)
	}

	// Every log of the budget in use (held here as a publish holds one).
	var held []*shardEntry
	defer func() {
		for _, e := range held {
			e.release()
		}
	}()
	m := b.Map()
	for shard := 0; pinned() < budget; shard++ { // pinned counts these too
		id := shardmap.ShardID{Stream: "s", Shard: 4 + shard}
		e, err := b.shards.acquire(m, id)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, e)
	}
	_, err := b.shards.acquire(m, shardmap.ShardID{Stream: "s", Shard: 7})
	if !errors.Is(err, errOpenLimit) || !strings.Contains(err.Error(), "--max-open-shards") {
		t.Fatalf("open with every log in use: %v, want errOpenLimit naming the limit", err)
	}
}

// TestSubscribedLogsPerPrincipal: one principal's subscriptions keep at
// most half the open-log budget open; past it a subscription to another
// shard is refused limit_exceeded, while more subscriptions to a shard it
// already keeps open, another principal's subscriptions and publishes
// open theirs (one principal subscribed to every shard once left no log
// for any other to open); a subscription ended gives its share back.
func TestSubscribedLogsPerPrincipal(t *testing.T) {
	const budget = 4
	ip := startInprocWith(t, func(c *Config) { c.MaxOpenShards = budget; c.Logger = quiet() }, 1, shardmap.StreamConfig{Name: "s", Shards: 8})
	if err := ip.ctl.Grant(auth.Grant{Principal: "mallory", Action: auth.Subscribe, Pattern: "s"}); err != nil {
		t.Fatal(err)
	}
	ip.waitEpoch(ip.ctl.Map().Epoch)
	b := ip.brokers[0]
	mallory := ip.dialAs(b, "mallory")
	subscribe := func(conn *quic.Conn, shard int) *wireStream {
		t.Helper()
		sub := openStream(t, conn)
		sub.send(&transport.Subscribe{Stream: "s", Shard: int32(shard), Start: transport.StartEarliest, Credit: 10})
		return sub
	}
	var held []*wireStream
	for shard := range budget / 2 {
		held = append(held, subscribe(mallory, shard), subscribe(mallory, shard))
	}
	// Each stream is served on its own goroutine: the next subscription
	// must come after these four are counted.
	pins := func() (n int) {
		b.limits.mu.Lock()
		defer b.limits.mu.Unlock()
		if u := b.limits.mu.principals["mallory"]; u != nil {
			for _, c := range u.pins {
				n += c
			}
		}
		return n
	}
	for deadline := time.Now().Add(waitFor); pins() < len(held); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of mallory's %d subscriptions counted", pins(), len(held))
		}
	}
	refused := subscribe(mallory, budget/2)
	e := wantError(t, refused.recv(), transport.ErrLimitExceeded)
	if !strings.Contains(e.Message, "keep 2 shard logs open") {
		t.Fatalf("refusal says %q", e.Message)
	}
	// The admin subscribes and publishes to the rest of the budget.
	ws := openStream(t, ip.dial(b))
	other := subscribe(ip.dial(b), budget/2)
	wantAck(t, publishShard(ws, 1, "s", budget/2, "x"), 1)
	if recs, ok := other.recv().(*transport.Records); !ok || string(recs.Records[0].Value) != "x" {
		t.Fatalf("the admin's subscription got %+v", recs)
	}
	wantAck(t, publishShard(ws, 2, "s", budget/2+1, "y"), 2)
	// Mallory's subscriptions of shard 0 end: its share is free again.
	for _, sub := range held[:2] {
		sub.s.CancelRead(0)
		sub.s.Close()
	}
	for deadline := time.Now().Add(waitFor); ; time.Sleep(10 * time.Millisecond) {
		f := subscribe(mallory, budget/2).recv()
		if recs, ok := f.(*transport.Records); ok && string(recs.Records[0].Value) == "x" {
			break
		}
		wantError(t, f, transport.ErrLimitExceeded)
		if time.Now().After(deadline) {
			t.Fatal("the ended subscriptions' share was not given back")
		}
	}
}

// TestSubscribedLogsLeaveRoomForPublishes: subscriptions together keep at
// most three quarters of the open-log budget open, so two principals,
// each within its half, cannot pin every log: a publish to any other
// shard opens its log. They pinned all four of a budget of four, and
// publishes to the other shards failed unavailable ("all in use").
func TestSubscribedLogsLeaveRoomForPublishes(t *testing.T) {
	const budget = 4
	ip := startInprocWith(t, func(c *Config) { c.MaxOpenShards = budget; c.Logger = quiet() }, 1, shardmap.StreamConfig{Name: "wide", Shards: 8})
	for _, p := range []string{"alice", "bob"} {
		if err := ip.ctl.Grant(auth.Grant{Principal: p, Action: auth.Subscribe, Pattern: "wide"}); err != nil {
			t.Fatal(err)
		}
	}
	ip.waitEpoch(ip.ctl.Map().Epoch)
	b := ip.brokers[0]
	subscribe := func(conn *quic.Conn, shard int) *wireStream {
		t.Helper()
		sub := openStream(t, conn)
		sub.send(&transport.Subscribe{Stream: "wide", Shard: int32(shard), Start: transport.StartLatest, Credit: 0})
		return sub
	}
	pinned := func() int {
		b.limits.mu.Lock()
		defer b.limits.mu.Unlock()
		return len(b.limits.mu.pinned)
	}
	alice, bob := ip.dialAs(b, "alice"), ip.dialAs(b, "bob")
	var held []*wireStream
	for shard, conn := range []*quic.Conn{alice, alice, bob} {
		held = append(held, subscribe(conn, shard))
		for deadline := time.Now().Add(waitFor); pinned() <= shard; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the subscription to shard %d not counted: %d logs pinned", shard, pinned())
			}
		}
	}
	e := wantError(t, subscribe(bob, 3).recv(), transport.ErrLimitExceeded)
	if !strings.Contains(e.Message, "three quarters") {
		t.Fatalf("refusal says %q", e.Message)
	}
	ws := openStream(t, ip.dial(b))
	for shard := 3; shard < 8; shard++ {
		wantAck(t, publishShard(ws, uint64(shard), "wide", shard, "x"), uint64(shard))
	}
	_ = held
}

// TestApplyMapSurvivesAFailingShard: one shard whose directory cannot be
// created (a regular file stands in its place) fails alone: the other
// shards of its stream and other streams work, publishes to it get a
// typed unavailable error naming it, a deleted stream's logs are still
// closed and its data removed, and once the obstacle is gone the shard
// opens on a later use.
func TestApplyMapSurvivesAFailingShard(t *testing.T) {
	ip := startInproc(t, 1)
	b := ip.brokers[0]
	streamsDir := filepath.Join(ip.dir, b.NodeID(), "streams")
	if err := os.MkdirAll(filepath.Join(streamsDir, "bad"), 0o750); err != nil {
		t.Fatal(err)
	}
	obstacle := filepath.Join(streamsDir, "bad", "1")
	if err := os.WriteFile(obstacle, []byte("not a directory"), 0o640); err != nil {
		t.Fatal(err)
	}
	for _, c := range []shardmap.StreamConfig{{Name: "bad", Shards: 3}, {Name: "victim", Shards: 4}} {
		if err := ip.ctl.CreateStream(c); err != nil {
			t.Fatal(err)
		}
	}
	ip.waitEpoch(ip.ctl.Map().Epoch)
	ws := openStream(t, ip.dial(b))
	wantAck(t, publishShard(ws, 1, "bad", 0, "ok"), 1)
	wantAck(t, publishShard(ws, 2, "bad", 2, "ok"), 2)
	e := wantError(t, publishShard(ws, 3, "bad", 1, "x"), transport.ErrUnavailable)
	if !strings.Contains(e.Message, "bad/1") {
		t.Fatalf("error %q does not name the shard", e.Message)
	}
	for shard := range 4 {
		wantAck(t, publishShard(ws, uint64(10+shard), "victim", shard, "v"), uint64(10+shard))
	}

	if err := ip.ctl.DeleteStream("victim"); err != nil {
		t.Fatal(err)
	}
	ip.waitEpoch(ip.ctl.Map().Epoch)
	untilNil(t, func() error {
		if _, err := os.Stat(filepath.Join(streamsDir, "victim")); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("the deleted stream's data is still there (stat: %v)", err)
		}
		return nil
	})
	b.shards.mu.RLock()
	for id := range b.shards.mu.entries {
		if id.Stream == "victim" {
			t.Errorf("log of deleted shard %s still open", id)
		}
	}
	b.shards.mu.RUnlock()

	if err := os.Remove(obstacle); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(failRetry + waitFor)
	for seq := uint64(100); ; seq++ {
		f := publishShard(ws, seq, "bad", 1, "later")
		if _, ok := f.(*transport.Ack); ok {
			break
		}
		wantError(t, f, transport.ErrUnavailable)
		if time.Now().After(deadline) {
			t.Fatal("the shard never opened once its directory could be made")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestMaxShardsAdmitsWholeStreams: past MaxShards a stream is refused as a
// whole, with a typed error to its publishers, while admitted streams
// keep working; deleting one admits the refused stream.
func TestMaxShardsAdmitsWholeStreams(t *testing.T) {
	ip := startInprocWith(t, func(c *Config) { c.MaxShards = 4 }, 1,
		shardmap.StreamConfig{Name: "a", Shards: 3}, shardmap.StreamConfig{Name: "b", Shards: 2})
	b := ip.brokers[0]
	ws := openStream(t, ip.dial(b))
	for shard := range 3 {
		wantAck(t, publishShard(ws, uint64(shard), "a", shard, "a"), uint64(shard))
	}
	e := wantError(t, publishShard(ws, 10, "b", 0, "b"), transport.ErrUnavailable)
	if !strings.Contains(e.Message, "MaxShards") {
		t.Fatalf("error %q does not say which limit", e.Message)
	}
	if _, err := os.Stat(filepath.Join(ip.dir, b.NodeID(), "streams", "b")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused stream has a directory: %v", err)
	}
	if err := ip.ctl.DeleteStream("a"); err != nil {
		t.Fatal(err)
	}
	ip.waitEpoch(ip.ctl.Map().Epoch)
	untilNil(t, func() error { // once the deletion is applied
		if f, ok := publishShard(ws, 11, "b", 1, "b").(*transport.Error); ok {
			return f
		}
		return nil
	})
}

// appendRecords appends n records to shard id of s, as map m places it.
func appendRecords(t *testing.T, s *shardSet, m *shardmap.Map, id shardmap.ShardID, n int) {
	t.Helper()
	e, err := s.acquire(m, id)
	if err != nil {
		t.Fatal(err)
	}
	defer e.release()
	for i := range n {
		if _, err := e.log.Append(context.Background(), &wal.Record{Value: fmt.Appendf(nil, "%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
}

// createdMap is a hand map holding stream "orders" of one shard, created
// at epoch created (0: by a control plane older than Created).
func createdMap(epoch, created uint64) *shardmap.Map {
	m := handMap(epoch, shardmap.StreamConfig{Name: "orders", Shards: 1})
	m.Streams[0].Created = created
	return m
}

// TestStreamCreatedAgainIsNew: a stream deleted and created again under
// the same name in maps this broker never applied (the maps in between
// skipped while it ran, or all of them while it was down) is a new
// stream: the old one's records are removed, never served as the new
// one's, and the new one's offsets start at 0. The same incarnation
// keeps its records across a restart, and so does a stream from a
// control plane that does not record incarnations.
func TestStreamCreatedAgainIsNew(t *testing.T) {
	dataDir := t.TempDir()
	id := shardmap.ShardID{Stream: "orders", Shard: 0}
	appendN := func(s *shardSet, m *shardmap.Map, n int) { t.Helper(); appendRecords(t, s, m, id, n) }
	wantNext := func(s *shardSet, m *shardmap.Map, want uint64, when string) {
		t.Helper()
		e, err := s.acquire(m, id)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		defer e.release()
		if first, next := e.log.FirstOffset(), e.log.NextOffset(); first != 0 || next != want {
			t.Fatalf("%s: orders/0 holds [%d, %d), want [0, %d)", when, first, next, want)
		}
	}

	s := testShardSet(t, dataDir, nil)
	m := createdMap(1, 1)
	s.apply(m)
	appendN(s, m, 3)

	// Deleted at epoch 2 and created again at 3; map 2 never applied.
	m = createdMap(3, 3)
	if _, r := s.apply(m); !slices.Equal(r.deleted, []string{"orders"}) || len(r.deleteErr) > 0 {
		t.Fatalf("apply of the stream created again: deleted %q, errors %v", r.deleted, r.deleteErr)
	}
	wantNext(s, m, 0, "created again while running")
	appendN(s, m, 2)
	if err := s.close(); err != nil {
		t.Fatal(err)
	}

	// Deleted and created again while the broker was down.
	s = testShardSet(t, dataDir, nil)
	m = createdMap(9, 8)
	s.apply(m)
	wantNext(s, m, 0, "created again while down")
	appendN(s, m, 4)
	if err := s.close(); err != nil {
		t.Fatal(err)
	}

	// A restart whose first map is older than the data (from a control
	// plane behind the one that created the stream again): the data is
	// neither removed nor served, and the current map finds all of it.
	s = testShardSet(t, dataDir, nil)
	m = createdMap(7, 3)
	if _, r := s.apply(m); len(r.deleted) > 0 || len(r.deleteErr) > 0 {
		t.Fatalf("apply of a map older than the data: deleted %q, errors %v", r.deleted, r.deleteErr)
	}
	if _, err := s.acquire(m, id); !errors.Is(err, errShardGone) {
		t.Fatalf("orders/0 under a map older than its data: %v, want errShardGone", err)
	}
	m = createdMap(10, 8)
	s.apply(m)
	wantNext(s, m, 4, "the current map after an older one")
	if err := s.close(); err != nil {
		t.Fatal(err)
	}

	// The same stream after a restart, and from an older control plane.
	for _, created := range []uint64{8, 0} {
		s = testShardSet(t, dataDir, nil)
		m = createdMap(10, created)
		s.apply(m)
		wantNext(s, m, 4, fmt.Sprintf("restart, created %d", created))
		if err := s.close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStreamDeletedWhileDownIsRemoved: the first map a broker applies
// after a restart removes the data of a stream deleted while it was down
// (marked with a Created epoch older than the map's), and keeps data it
// cannot judge: a stream directory without a mark (written before marks
// existed), or one whose mark is at or past the map's epoch (a control
// plane that lost its state and counts epochs afresh).
func TestStreamDeletedWhileDownIsRemoved(t *testing.T) {
	dataDir := t.TempDir()
	s := testShardSet(t, dataDir, nil)
	m := handMap(4, shardmap.StreamConfig{Name: "gone", Shards: 1}, shardmap.StreamConfig{Name: "legacy", Shards: 1},
		shardmap.StreamConfig{Name: "young", Shards: 1})
	m.Streams[0].Created, m.Streams[2].Created = 3, 4 // "legacy" from a control plane without Created
	s.apply(m)
	for _, name := range []string{"gone", "legacy", "young"} {
		appendRecords(t, s, m, shardmap.ShardID{Stream: name, Shard: 0}, 1)
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	streams := filepath.Join(dataDir, "streams")

	// A control plane that lost its state: epoch 4 is not past "young"'s.
	s = testShardSet(t, dataDir, nil)
	if _, r := s.apply(handMap(4)); len(r.deleted) != 1 || r.deleted[0] != "gone" {
		t.Fatalf("first map of epoch 4 deleted %q, want only gone", r.deleted)
	}
	if got := dirNames(t, streams); slices.Contains(got, "gone") || !slices.Contains(got, "legacy") || !slices.Contains(got, "young") {
		t.Fatalf("streams dir holds %q, want gone removed, legacy and young kept", got)
	}
	// Only the first map of a run sweeps.
	if _, r := s.apply(handMap(9)); len(r.deleted) != 0 {
		t.Fatalf("a later map deleted %q", r.deleted)
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	s = testShardSet(t, dataDir, nil)
	defer s.close()
	if _, r := s.apply(handMap(9)); !slices.Equal(r.deleted, []string{"young"}) {
		t.Fatalf("first map of epoch 9 deleted %q, want young", r.deleted)
	}
	if got := dirNames(t, streams); !slices.Contains(got, "legacy") || slices.Contains(got, "young") {
		t.Fatalf("streams dir holds %q, want legacy kept and young removed", got)
	}
}

// TestDamagedStreamMarkRefuses: a stream directory whose mark does not
// parse is neither removed nor opened: its shards fail to open with an
// error naming the mark, and its records stay.
func TestDamagedStreamMarkRefuses(t *testing.T) {
	dataDir := t.TempDir()
	s := testShardSet(t, dataDir, nil)
	m := createdMap(1, 1)
	s.apply(m)
	appendRecords(t, s, m, shardmap.ShardID{Stream: "orders", Shard: 0}, 1)
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	mark := filepath.Join(dataDir, "streams", "orders", createdFile)
	if err := os.WriteFile(mark, []byte("1x\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	s = testShardSet(t, dataDir, nil)
	defer s.close()
	m = createdMap(5, 1)
	s.apply(m)
	if _, err := s.acquire(m, shardmap.ShardID{Stream: "orders", Shard: 0}); err == nil || !strings.Contains(err.Error(), createdFile) {
		t.Fatalf("open with a damaged mark: %v, want an error naming %s", err, createdFile)
	}
	if got := dirNames(t, filepath.Join(dataDir, "streams", "orders")); !slices.Contains(got, "0") {
		t.Fatalf("the stream's data went: %q", got)
	}
}

// TestStreamDeletedWhileItsNameIsGated: a map that deletes a stream while
// another holder has its name's gate (a first use claiming the directory,
// a failed replica being set aside) waits for that holder, then removes
// the stream's data: it is never left behind until the next restart.
func TestStreamDeletedWhileItsNameIsGated(t *testing.T) {
	dataDir := t.TempDir()
	s := testShardSet(t, dataDir, nil)
	defer s.close()
	m := createdMap(1, 1)
	s.apply(m)
	appendRecords(t, s, m, shardmap.ShardID{Stream: "orders", Shard: 0}, 3)

	held := make(chan struct{})
	s.mu.Lock()
	s.mu.removing["orders"] = held
	s.mu.Unlock()
	go func() {
		time.Sleep(100 * time.Millisecond) // the apply below meets the gate held
		s.mu.Lock()
		delete(s.mu.removing, "orders")
		s.mu.Unlock()
		close(held)
	}()
	if _, r := s.apply(handMap(2)); !slices.Equal(r.deleted, []string{"orders"}) || len(r.deleteErr) > 0 {
		t.Fatalf("apply without the stream: deleted %q, errors %v", r.deleted, r.deleteErr)
	}
	if got := dirNames(t, filepath.Join(dataDir, "streams")); slices.Contains(got, "orders") {
		t.Fatalf("the deleted stream's data is still there: %q", got)
	}
}

// TestAcquireRefusesAnEarlierIncarnationStillOpen: between a map that
// holds a stream deleted and created again and its apply (the member has
// the map before the apply loop runs), a use of the stream by that map
// must not get the log of the earlier stream still open: a record acked
// there was removed with the earlier stream's data by the apply. It is
// refused as gone, and once applied the new stream's log opens empty.
func TestAcquireRefusesAnEarlierIncarnationStillOpen(t *testing.T) {
	s := testShardSet(t, t.TempDir(), nil)
	defer s.close()
	id := shardmap.ShardID{Stream: "orders", Shard: 0}
	m1 := handMap(1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	m1.Streams[0].Created = 1
	s.apply(m1)
	e, err := s.acquire(m1, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.log.Append(context.Background(), &wal.Record{Value: []byte("old")}); err != nil {
		t.Fatal(err)
	}
	e.release()

	m2 := handMap(3, shardmap.StreamConfig{Name: "orders", Shards: 1})
	m2.Streams[0].Created = 3 // deleted at epoch 2, created again at 3
	if e, err := s.acquire(m2, id); !errors.Is(err, errShardGone) {
		if err == nil {
			e.release()
		}
		t.Fatalf("acquire by the map of the stream created again, before its apply: err=%v, want errShardGone", err)
	}
	s.apply(m2)
	e, err = s.acquire(m2, id)
	if err != nil {
		t.Fatal(err)
	}
	defer e.release()
	if n := e.sl.NextOffset(); n != 0 {
		t.Fatalf("the stream created again opened with %d records", n)
	}
}

// TestAcquireByAnOlderMapOfAnotherIncarnation: a use by a map older than
// the newest seen, holding an earlier stream of the name, is refused
// rather than given the newer stream's log (a keyed record routed by the
// earlier stream's shard count would land in the wrong shard of it).
func TestAcquireByAnOlderMapOfAnotherIncarnation(t *testing.T) {
	s := testShardSet(t, t.TempDir(), nil)
	defer s.close()
	m1 := handMap(1, shardmap.StreamConfig{Name: "orders", Shards: 2})
	m1.Streams[0].Created = 1
	m3 := handMap(3, shardmap.StreamConfig{Name: "orders", Shards: 2})
	m3.Streams[0].Created = 3
	// Shard 0 opens by the newer map; shard 1 is not open (nothing was
	// applied), and the newer map is the newest seen.
	for _, shard := range []int{0, 1} {
		id := shardmap.ShardID{Stream: "orders", Shard: shard}
		if shard == 0 {
			e, err := s.acquire(m3, id)
			if err != nil {
				t.Fatal(err)
			}
			e.release()
		}
		if e, err := s.acquire(m1, id); !errors.Is(err, errShardGone) {
			if err == nil {
				e.release()
			}
			t.Fatalf("acquire shard %d by the earlier stream's map: err=%v, want errShardGone", shard, err)
		}
	}
}

// TestPinBudget: subscriptions together leave at least one log of the
// open-log budget to publishes (a budget under 4 left none), and one
// principal's never pin more than all of them may.
func TestPinBudget(t *testing.T) {
	for open := 1; open <= 64; open++ {
		b := (&shardSet{maxOpen: open}).pinBudget()
		if b.all < 1 || b.principal < 1 || b.principal > b.all {
			t.Errorf("budget %d: %+v", open, b)
		}
		if open >= 2 && b.all >= open {
			t.Errorf("budget %d: subscriptions may pin %d, every log", open, b.all)
		}
	}
}

// TestSmallOpenBudgetLeavesRoomForPublishes: with an open-log budget of
// 3, three principals each subscribed to a shard leave a log for
// publishes to other shards (they pinned all three, and a publish failed
// unavailable, "all in use").
func TestSmallOpenBudgetLeavesRoomForPublishes(t *testing.T) {
	const budget = 3
	ip := startInprocWith(t, func(c *Config) { c.MaxOpenShards = budget; c.Logger = quiet() }, 1, shardmap.StreamConfig{Name: "wide", Shards: 8})
	principals := []string{"alice", "bob", "carol"}
	for _, p := range principals {
		if err := ip.ctl.Grant(auth.Grant{Principal: p, Action: auth.Subscribe, Pattern: "wide"}); err != nil {
			t.Fatal(err)
		}
	}
	ip.waitEpoch(ip.ctl.Map().Epoch)
	b := ip.brokers[0]
	pinned := func() int {
		b.limits.mu.Lock()
		defer b.limits.mu.Unlock()
		return len(b.limits.mu.pinned)
	}
	var held []*wireStream
	for shard, p := range principals {
		sub := openStream(t, ip.dialAs(b, p))
		sub.send(&transport.Subscribe{Stream: "wide", Shard: int32(shard), Start: transport.StartLatest, Credit: 0})
		held = append(held, sub)
		if shard == 2 {
			break
		}
		for deadline := time.Now().Add(waitFor); pinned() <= shard; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the subscription to shard %d not counted: %d logs pinned", shard, pinned())
			}
		}
	}
	// The first two pin their logs; the third is refused.
	wantError(t, held[2].recv(), transport.ErrLimitExceeded)
	ws := openStream(t, ip.dial(b))
	for shard := 3; shard < 8; shard++ {
		wantAck(t, publishShard(ws, uint64(shard), "wide", shard, "x"), uint64(shard))
	}
}
