package broker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
	"github.com/felix-broker/felix/wal"
)

// steppedClocks gives each broker of a test cluster a wall clock
// (Config.Knobs.Now) that runs ahead of time.Now by what the test sets
// for its node.
type steppedClocks map[string]*atomic.Int64

// tweak installs node c.NodeID's clock in c.
func (sc steppedClocks) tweak(c *Config) {
	off := new(atomic.Int64)
	sc[c.NodeID] = off
	c.Knobs.Now = func() time.Time { return time.Now().Add(time.Duration(off.Load())) }
}

// set puts every clock but those of except d ahead of time.Now.
func (sc steppedClocks) set(d time.Duration, except ...*Broker) {
	for node, off := range sc {
		skip := false
		for _, b := range except {
			skip = skip || b.NodeID() == node
		}
		if !skip {
			off.Store(int64(d))
		}
	}
}

// TestUnavailableBoundAcrossClockStepBack:
// TestForwarderFailsUnavailableWhenNoReplicaKnowsALeader with the outside
// broker's wall clock (Config.Knobs.Now) an hour ahead when the publish
// arrives and is routed, and stepped back just after (NTP). The publish
// still fails unavailable about ForwardTimeout (1s) after it arrived: its
// deadline is on the monotonic clock. As wall-clock unix nanoseconds, it
// waited for the wall clock to pass it: an hour more.
func TestUnavailableBoundAcrossClockStepBack(t *testing.T) {
	clocks := steppedClocks{}
	ip, outside := startLeaderless(t, clocks.tweak)
	clock := clocks[outside.NodeID()]
	clock.Store(int64(time.Hour)) // the clock before the step
	ws := openStream(t, ip.dial(outside))
	defer ws.s.Close()
	ws.s.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	ws.send(&transport.Publish{Seq: 3, Stream: "r3", Shard: 0, Value: []byte("via the outside broker")})
	time.Sleep(300 * time.Millisecond)
	clock.Store(0) // NTP steps the clock back an hour
	fr, err := ws.r.Read()
	if err != nil {
		t.Fatalf("no answer %v after the publish (ForwardTimeout 1s): %v", time.Since(start).Round(time.Millisecond), err)
	}
	e := wantError(t, fr, transport.ErrUnavailable)
	t.Logf("answered after %v: %v", time.Since(start).Round(time.Millisecond), e)
}

// TestReplicatedIdempotentFailoverWithSkew: TestReplicatedIdempotentFailover
// where the new leader's clock is 20 minutes ahead of the old leader's (a
// skew beyond ProducerExpiry, 15 minutes by default). The new leader
// learnt the producer as a follower, and judges its expiry by how long
// ago it applied the producer's records here, not by the old leader's
// stamps against its own clock: the retry of a record whose ack was lost,
// seconds after it committed, is answered as a duplicate. Judged by the
// stamps, the producer was forgotten and the retry refused
// unknown_producer, on which the SDK sends the record again under a fresh
// producer id: written twice.
func TestReplicatedIdempotentFailoverWithSkew(t *testing.T) {
	clocks := steppedClocks{}
	ip := startInprocWith(t, func(c *Config) { fastRaft(c); clocks.tweak(c) }, 3, shardmap.StreamConfig{Name: "r3", Shards: 1, Replicas: 3})
	id := shardmap.ShardID{Stream: "r3", Shard: 0}
	old := waitOwnerLeads(t, ip, ip.brokers, id)
	clocks.set(20*time.Minute, old) // the other brokers' clocks run 20 minutes ahead of old's
	ws := openStream(t, ip.dial(old))
	for i, v := range []string{"one", "two", "three"} {
		wantAck(t, ws.roundTrip(idem(uint64(i+1), "r3", "p", uint64(i+1), v)), uint64(i+1))
	}
	waitReplicas(t, ip.brokers, id, 3)
	ws.s.Close()
	rest := ip.closeBroker(t, old)
	leader := leaderOf(t, rest, id)
	retry := openStream(t, ip.dial(leader))
	f := retry.roundTrip(idem(13, "r3", "p", 3, "again"))
	if a, ok := f.(*transport.Ack); !ok || !a.Duplicate {
		t.Fatalf("retry of sequence 3 (its ack lost) seconds after it committed, on the new leader whose clock is 20 minutes ahead: %T %+v, want the original ack marked duplicate (the SDK sends the record again under a new producer id on unknown_producer: written twice)", f, f)
	}
}

// TestProducerForgottenByClockStepForward: on a shard's owner (R=1) the
// wall clock steps 20 minutes forward between a producer's commit and its
// retry a moment later. The producer was last used well within
// ProducerExpiry (15 minutes), and its retry is answered as a duplicate:
// judged by the wall clock, it was forgotten, its retry refused
// unknown_producer, and the SDK sent the in-doubt record again under a
// fresh id.
func TestProducerForgottenByClockStepForward(t *testing.T) {
	var ahead atomic.Int64
	tab := newProducerTable("s/0", producerLimits{max: 100, expiry: DefaultProducerExpiry, window: 8},
		func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) })
	a := tab.admit("p", 1)
	tab.enqueued(a.p)
	tab.committed(a.p, 1, 0, time.Now().UnixNano(), nil)
	ahead.Store(int64(20 * time.Minute)) // the step
	if r := tab.admit("p", 1); r.kind != admitDuplicate {
		t.Fatalf("retry of sequence 1 a moment after its commit, across a 20-minute forward clock step: admit kind %d (0 = admitAppend: written again), want admitDuplicate (%d)", r.kind, admitDuplicate)
	}
}

// TestIdempotentRetryAfterRestartClockStepped: the brokers restart with
// their wall clocks stepped 20 minutes forward, seconds after a
// producer's last record. The tables rebuilt from the log (R=1) and
// replayed from it (R=3) date the producer by its records against the
// newest record of the log, not against the stepped clock, so the retry
// of its last record is a duplicate; against the clock every producer
// expired at once on open.
func TestIdempotentRetryAfterRestartClockStepped(t *testing.T) {
	for _, replicas := range []int{1, 3} {
		t.Run(map[int]string{1: "R1", 3: "R3"}[replicas], func(t *testing.T) {
			clocks := steppedClocks{}
			ip := startInprocWith(t, func(c *Config) { fastRaft(c); clocks.tweak(c) }, replicas, shardmap.StreamConfig{Name: "s", Shards: 1, Replicas: replicas})
			id := shardmap.ShardID{Stream: "s", Shard: 0}
			b := ip.brokers[0]
			if replicas > 1 {
				b = waitOwnerLeads(t, ip, ip.brokers, id)
			}
			ws := openStream(t, ip.dial(b))
			for i := uint64(1); i <= 3; i++ {
				wantAck(t, ws.roundTrip(idem(i, "s", "p", i, "r")), i)
			}
			ws.s.Close()
			if replicas > 1 {
				waitReplicas(t, ip.brokers, id, 3)
			}
			for i, b := range ip.brokers {
				if err := b.Close(); err != nil {
					t.Fatal(err)
				}
				ip.brokers[i] = nil
			}
			clear(clocks) // the restarted brokers' clocks
			for i := range ip.brokers {
				ip.brokers[i] = ip.newBroker(i)
			}
			clocks.set(20 * time.Minute)
			for _, b := range ip.brokers {
				ctx, cancel := context.WithTimeout(context.Background(), waitFor)
				err := b.Start(ctx)
				cancel()
				if err != nil {
					t.Fatal(err)
				}
			}
			b = ip.brokers[0]
			if replicas > 1 {
				b = leaderOf(t, ip.brokers, id)
			}
			retry := openStream(t, ip.dial(b))
			f := retry.roundTrip(idem(4, "s", "p", 3, "r"))
			if a, ok := f.(*transport.Ack); !ok || !a.Duplicate {
				t.Fatalf("retry of sequence 3 after a restart with the clock 20 minutes on: %T %+v, want the original ack marked duplicate", f, f)
			}
		})
	}
}

// TestProducerRebuiltFromFutureStampsExpires: a shard log (R=1) whose
// records were stamped a year ahead (its broker's clock was wrong, then
// put right) does not make its producers immortal when the table is
// rebuilt from it: unused for ProducerExpiry, the producer is forgotten.
// Dated by the stamp, it was remembered for a year.
func TestProducerRebuiltFromFutureStampsExpires(t *testing.T) {
	const expiry = 100 * time.Millisecond
	l, err := wal.Open(t.TempDir(), wal.Options{Name: "s/0", Now: func() time.Time { return time.Now().AddDate(1, 0, 0) }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := uint64(1); i <= 3; i++ {
		if _, err := l.Append(context.Background(), &wal.Record{Value: []byte("r"), ProducerID: "p", ProducerSeq: i}); err != nil {
			t.Fatal(err)
		}
	}
	tab := newProducerTable("s/0", producerLimits{max: 100, expiry: expiry, window: 8, rebuildBytes: 1 << 20}, nil)
	if _, err := tab.rebuild(l); err != nil || tab.size() != 1 {
		t.Fatalf("rebuild: %v, %d producers; want 1", err, tab.size())
	}
	time.Sleep(2 * expiry)
	if a := tab.admit("p", 4); a.kind != admitUnknown {
		t.Fatalf("the producer's next record %v after its last, ProducerExpiry %v, its records stamped a year ahead: admit kind %d, want admitUnknown (%d): it never expires", 2*expiry, expiry, a.kind, admitUnknown)
	}
}

// TestProducerStateAcrossSkew: a snapshot's producer table, taken on a
// leader whose clock is 20 minutes behind, installed on a replica whose
// clock is 20 minutes ahead: producers used a moment ago on the leader
// are not expired on the replica when it leads. The state carries last
// use by the leader's clock; the replica dates it relative to the
// state's most recent producer, not against its own clock.
func TestProducerStateAcrossSkew(t *testing.T) {
	lim := producerLimits{max: 10, expiry: DefaultProducerExpiry, window: 4}
	at := func(d time.Duration) func() time.Time { return func() time.Time { return time.Now().Add(d) } }
	leader := newProducerTable("s/0", lim, at(-20*time.Minute))
	for s := uint64(1); s <= 3; s++ {
		leader.applied([]byte("p"), s, s, time.Now().Add(-20*time.Minute).UnixNano())
	}
	follower := newProducerTable("s/0", lim, at(20*time.Minute))
	if err := follower.restoreState(leader.snapshotState(1 << 20)); err != nil {
		t.Fatal(err)
	}
	if a := follower.admit("p", 3); a.kind != admitDuplicate {
		t.Fatalf("retry of sequence 3 on the replica that installed the leader's table, clocks 40 minutes apart: admit kind %d, want admitDuplicate (%d)", a.kind, admitDuplicate)
	}
}

// TestProducerReplayDatesByStamps: a replica replaying its log at open
// dates the producers it learns by their newest records' stamps against
// the newest stamp replayed (or its wall clock, if earlier), not by when
// the replay applied them: a producer whose last record is an hour
// before the others' is forgotten (ProducerExpiry 100ms), and one stamped
// a year ahead is remembered, but not for a year: unused, it expires
// ProducerExpiry after the replay.
func TestProducerReplayDatesByStamps(t *testing.T) {
	const expiry = 100 * time.Millisecond
	tab := newProducerTable("s/0", producerLimits{max: 100, expiry: expiry, window: 8}, nil)
	tab.replaying()
	now := time.Now()
	tab.applied([]byte("old"), 1, 0, now.Add(-time.Hour).UnixNano())
	for s := uint64(1); s <= 3; s++ {
		tab.applied([]byte("ahead"), s, s, now.AddDate(1, 0, 0).UnixNano())
	}
	tab.replayed()
	if a := tab.admit("old", 2); a.kind != admitUnknown {
		t.Fatalf("a producer whose last record is an hour before the newest replayed: admit kind %d, want admitUnknown (%d)", a.kind, admitUnknown)
	}
	time.Sleep(2 * expiry)
	if a := tab.admit("ahead", 4); a.kind != admitUnknown {
		t.Fatalf("a producer stamped a year ahead, unused %v after the replay (ProducerExpiry %v): admit kind %d, want admitUnknown (%d)", 2*expiry, expiry, a.kind, admitUnknown)
	}
	// Applied live, after the replay: a use now, whatever the stamp.
	tab.applied([]byte("live"), 1, 10, now.Add(-time.Hour).UnixNano())
	if a := tab.admit("live", 1); a.kind != admitDuplicate {
		t.Fatalf("a producer applied live with an hour-old stamp: admit kind %d, want admitDuplicate (%d)", a.kind, admitDuplicate)
	}
}
