package replica

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/felix-broker/felix/wal"
)

func TestElectAndCommit(t *testing.T) {
	c := newCluster(t, 3, 1, nil)
	c.waitLeader()
	const n = 300
	offsets := make([]uint64, n)
	var wg sync.WaitGroup
	for w := range 6 { // concurrent appenders, so batches hold several records
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 6 {
				offsets[i] = c.commit(fmt.Appendf(nil, "r%d", i))
			}
		}()
	}
	wg.Wait()
	recs := c.checkSame(c.waitConverged(n))
	if len(recs) != n {
		t.Fatalf("replicas hold %d records, want %d", len(recs), n)
	}
	for i, off := range offsets {
		if got, want := string(recs[off].Value), fmt.Sprintf("r%d", i); got != want {
			t.Fatalf("offset %d acked for %q holds %q", off, want, got)
		}
	}
}

func TestFollowerRefusesAppend(t *testing.T) {
	c := newCluster(t, 3, 2, nil)
	lead := c.waitLeader()
	c.commit([]byte("x"))
	for _, g := range c.running() {
		if g == lead {
			continue
		}
		r := <-appendTo(g, []byte("y"))
		var nl *NotLeaderError
		if !errors.As(r.err, &nl) || nl.Replaced {
			t.Fatalf("append to follower %d: %v, want a *NotLeaderError", g.ID(), r.err)
		}
		if nl.Leader != lead.ID() && nl.Leader != 0 {
			t.Fatalf("follower %d names leader %d, the leader is %d", g.ID(), nl.Leader, lead.ID())
		}
	}
}

func TestLeaderFailoverAndRestart(t *testing.T) {
	c := newCluster(t, 3, 3, nil)
	old := c.waitLeader().ID()
	for i := range 50 {
		c.commit(fmt.Appendf(nil, "a%d", i))
	}
	c.kill(old)
	nl := c.waitLeader(old)
	if nl.ID() == old {
		t.Fatalf("the stopped replica leads")
	}
	for i := range 50 {
		c.commit(fmt.Appendf(nil, "b%d", i))
	}
	c.start(old)
	recs := c.checkSame(c.waitConverged(100))
	if len(recs) != 100 || string(recs[0].Value) != "a0" || string(recs[99].Value) != "b49" {
		t.Fatalf("after restart: %d records, first %q, last %q", len(recs), recs[0].Value, recs[len(recs)-1].Value)
	}
	// A restarted replica rebuilt its offsets from the committed entries.
	c.kill(nl.ID())
	c.start(nl.ID())
	c.commit([]byte("c"))
	c.checkSame(c.waitConverged(101))
}

func TestIsolatedLeaderNeverAcks(t *testing.T) {
	c := newCluster(t, 3, 4, nil)
	old := c.waitLeader()
	for i := range 10 {
		c.commit(fmt.Appendf(nil, "a%d", i))
	}
	c.net.Isolate(old.ID(), c.ids...)
	var stale []<-chan result
	for i := range 20 {
		stale = append(stale, appendTo(old, fmt.Appendf(nil, "stale%d", i)))
	}
	nl := c.waitLeader(old.ID())
	for i := range 30 {
		select {
		case r := <-appendTo(nl, fmt.Appendf(nil, "b%d", i)):
			if r.err != nil {
				t.Fatalf("append to the new leader: %v", r.err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the new leader did not commit within 20s")
		}
	}
	for i, ch := range stale {
		select {
		case r := <-ch:
			if r.err == nil {
				t.Fatalf("stale record %d acked at offset %d while its leader was cut off", i, r.offset)
			}
			if !errors.Is(r.err, ErrNotLeader) {
				t.Fatalf("stale record %d: %v, want ErrNotLeader", i, r.err)
			}
		default: // still pending: its fate is not known to the old leader
		}
	}
	c.net.Heal()
	replaced := 0
	for i, ch := range stale {
		select {
		case r := <-ch:
			var nle *NotLeaderError
			if !errors.As(r.err, &nle) {
				t.Fatalf("stale record %d after rejoining: offset %d err %v, want a *NotLeaderError", i, r.offset, r.err)
			}
			if nle.Replaced {
				replaced++
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("stale record %d: no outcome 20s after the old leader rejoined", i)
		}
	}
	if replaced == 0 {
		t.Fatal("no stale record was in the old leader's log: the test did not test replacement")
	}
	recs := c.checkSame(c.waitConverged(40))
	for _, r := range recs {
		if len(r.Value) > 5 && string(r.Value[:5]) == "stale" {
			t.Fatalf("offset %d holds %q, never committed by a majority", r.Offset, r.Value)
		}
	}
}

func TestRestartRebuildsOffsets(t *testing.T) {
	c := newCluster(t, 3, 5, nil)
	c.waitLeader()
	for i := range 40 {
		c.commit(fmt.Appendf(nil, "a%d", i))
	}
	before := c.checkSame(c.waitConverged(40))
	for _, id := range c.ids {
		c.kill(id)
	}
	// Alone, a replica serves what its persisted commit index covers.
	c.start(1)
	g := c.group(1)
	deadline := time.Now().Add(10 * time.Second)
	for g.NextOffset() == 0 && time.Now().Before(deadline) {
		time.Sleep(tickEvery)
	}
	if n := g.NextOffset(); n == 0 || n > 40 {
		t.Fatalf("replica 1 alone serves %d records, want 1..40", n)
	}
	c.start(2)
	c.start(3)
	c.waitLeader()
	c.commit([]byte("b"))
	after := c.checkSame(c.waitConverged(41))
	for i := range before {
		if string(after[i].Value) != string(before[i].Value) || after[i].Timestamp != before[i].Timestamp {
			t.Fatalf("offset %d changed across the restart: %q, was %q", i, after[i].Value, before[i].Value)
		}
	}
}

func TestCloseSettlesEveryAppend(t *testing.T) {
	c := newCluster(t, 3, 6, nil)
	old := c.waitLeader()
	c.commit([]byte("a"))
	c.net.Isolate(old.ID(), c.ids...)
	var pending []<-chan result
	for i := range 10 {
		pending = append(pending, appendTo(old, fmt.Appendf(nil, "p%d", i)))
	}
	c.kill(old.ID())
	for i, ch := range pending {
		select {
		case r := <-ch:
			if !errors.Is(r.err, ErrUnknownOutcome) && !errors.Is(r.err, ErrNotLeader) && !errors.Is(r.err, ErrClosed) {
				t.Fatalf("append %d pending at Close: %v, want ErrUnknownOutcome, ErrNotLeader or ErrClosed", i, r.err)
			}
		default:
			t.Fatalf("append %d pending at Close got no outcome from Close", i)
		}
	}
	if r := <-appendTo(old, []byte("late")); !errors.Is(r.err, ErrClosed) {
		t.Fatalf("append after Close: %v, want ErrClosed", r.err)
	}
	peer := old.ID()%3 + 1 // a voter: Step checks the message before the group's state
	if err := old.Step(&pb.Message{Type: pb.MsgHeartbeat.Enum(), To: new(old.ID()), From: new(peer), Term: new(uint64(1))}); !errors.Is(err, ErrClosed) {
		t.Fatalf("step after Close: %v, want ErrClosed", err)
	}
}

func TestStepRefusesBadMessages(t *testing.T) {
	c := newCluster(t, 3, 7, nil)
	g := c.group(1)
	for _, m := range []*pb.Message{
		{Type: pb.MsgHeartbeat.Enum(), To: new(uint64(2)), From: new(uint64(3))}, // not for this replica
		{Type: pb.MsgHeartbeat.Enum(), To: new(uint64(1)), From: new(uint64(1))}, // from itself
		{Type: pb.MsgHeartbeat.Enum(), To: new(uint64(1))},                       // from nobody
		{Type: pb.MsgHup.Enum(), To: new(uint64(1)), From: new(uint64(2))},       // local
		{Type: pb.MsgProp.Enum(), To: new(uint64(1)), From: new(uint64(2))},      // forwarded proposal
		{Type: pb.MsgSnap.Enum(), To: new(uint64(1)), From: new(uint64(2))},      // snapshot message without one
	} {
		if err := g.Step(m); !errors.Is(err, ErrBadMessage) {
			t.Errorf("step %v: %v, want ErrBadMessage", m, err)
		}
	}
}

func TestEntriesSplitAtMaxEntryBytes(t *testing.T) {
	c := newCluster(t, 3, 10, func(cfg *Config) { cfg.MaxEntryBytes = 1024 })
	lead := c.waitLeader()
	if r := <-appendTo(lead, make([]byte, 1024)); !errors.Is(r.err, ErrTooLarge) {
		t.Fatalf("a record over MaxEntryBytes: %v, want ErrTooLarge", r.err)
	}
	var chans []<-chan result
	for i := range 60 {
		chans = append(chans, appendTo(lead, fmt.Appendf(nil, "%03d%0300d", i, 0)))
	}
	for i, ch := range chans {
		if r := <-ch; r.err != nil {
			t.Fatalf("append %d: %v", i, r.err)
		}
	}
	recs := c.checkSame(c.waitConverged(60))
	for i, r := range recs {
		if want := fmt.Sprintf("%03d", i); string(r.Value[:3]) != want {
			t.Fatalf("offset %d holds record %s: the order of appends to one leader was not kept", i, r.Value[:3])
		}
	}
	lead.offs.mu.RLock()
	defer lead.offs.mu.RUnlock()
	for k := 1; k < len(lead.offs.bases); k++ {
		if n := lead.offs.bases[k] - lead.offs.bases[k-1]; n > 3 {
			t.Fatalf("entry %d holds %d records of 300 bytes, over MaxEntryBytes 1024", lead.offs.firstIndex+uint64(k-1), n)
		}
	}
}

// TestCommitTimeoutThenFate: with Config.CommitTimeout, a record whose
// entry cannot be committed (its leader is cut off from the others) is
// told ErrCommitTimeout, and told its fate once more when the leader
// rejoins; a record committed in time is told once.
func TestCommitTimeoutThenFate(t *testing.T) {
	c := newCluster(t, 3, 9, func(cfg *Config) { cfg.CommitTimeout = 200 * time.Millisecond })
	old := c.waitLeader()
	told := func(g *Group, value string) <-chan result {
		ch := make(chan result, 2) // a second call must never block the group
		g.AppendAsync(&wal.Record{Value: []byte(value)}, func(o uint64, ts int64, err error) { ch <- result{o, ts, err} })
		return ch
	}
	inTime := told(old, "in time")
	select {
	case r := <-inTime:
		if r.err != nil {
			t.Fatalf("a record appended to a healthy group: %v", r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a record appended to a healthy group: no answer within 20s")
	}

	c.net.Isolate(old.ID(), c.ids...)
	stuck := told(old, "stuck")
	select {
	case r := <-stuck:
		if !errors.Is(r.err, ErrCommitTimeout) {
			t.Fatalf("first answer for a record its cut-off leader cannot commit: offset %d err %v, want ErrCommitTimeout", r.offset, r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no answer 20s after appending a record its cut-off leader cannot commit (CommitTimeout 200ms)")
	}
	c.waitLeader(old.ID())
	c.net.Heal()
	select {
	case r := <-stuck:
		var nle *NotLeaderError
		if r.err != nil && !errors.As(r.err, &nle) {
			t.Fatalf("second answer: offset %d err %v, want its fate (an offset, or replaced: a *NotLeaderError)", r.offset, r.err)
		}
		t.Logf("the stuck record's fate: offset %d err %v", r.offset, r.err)
	case <-time.After(20 * time.Second):
		t.Fatal("the stuck record's fate was not told within 20s of its leader rejoining")
	}
	select {
	case r := <-inTime:
		t.Fatalf("a record committed in time was told twice: again offset %d err %v", r.offset, r.err)
	case r := <-stuck:
		t.Fatalf("the stuck record was told a third time: offset %d err %v", r.offset, r.err)
	case <-time.After(300 * time.Millisecond):
	}
}
