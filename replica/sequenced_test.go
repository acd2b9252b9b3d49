package replica

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/felix-broker/felix/wal"
)

// sequencedRec is one call of Config.OnSequenced.
type sequencedRec struct {
	id          string
	seq, offset uint64
	ts          int64
}

// sequencedLog keeps what OnSequenced told each replica, since it last
// opened.
type sequencedLog struct {
	mu   sync.Mutex
	byID map[uint64][]sequencedRec
}

func (l *sequencedLog) hook(cfg *Config) {
	id := cfg.ID
	l.mu.Lock()
	delete(l.byID, id) // opened again: it hears everything again
	l.mu.Unlock()
	cfg.OnSequenced = func(pid []byte, seq, offset uint64, ts int64) {
		l.mu.Lock()
		l.byID[id] = append(l.byID[id], sequencedRec{string(pid), seq, offset, ts})
		l.mu.Unlock()
	}
}

func (l *sequencedLog) of(id uint64) []sequencedRec {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.byID[id])
}

// OnSequenced tells every replica of every committed record with a
// producer sequence (and of no other), in log order, with the offset and
// timestamp the record has there; a replica opened again hears them all
// again, as raft applies its committed log again.
func TestOnSequenced(t *testing.T) {
	sl := &sequencedLog{byID: map[uint64][]sequencedRec{}}
	c := newCluster(t, 3, 21, sl.hook)
	c.waitLeader()
	recs := []*wal.Record{
		{Value: []byte("plain")},
		{ProducerID: "p1", ProducerSeq: 1, Value: []byte("a")},
		{ProducerID: "p1", ProducerSeq: 0, Value: []byte("metadata only")},
		{ProducerID: "p2", ProducerSeq: 7, Headers: map[string]string{"h": "v"}, Key: []byte("k"), Value: []byte("b")},
		{ProducerSeq: 3, Value: []byte("no id")},
		{ProducerID: "p1", ProducerSeq: 2, Value: []byte("c")},
	}
	for _, r := range recs {
		c.commitRecord(r)
	}
	stored := c.checkSame(c.waitConverged(uint64(len(recs))))
	var want []sequencedRec
	for _, r := range stored {
		if r.ProducerSeq > 0 && r.ProducerID != "" {
			want = append(want, sequencedRec{r.ProducerID, r.ProducerSeq, r.Offset, r.Timestamp})
		}
	}
	if len(want) != 3 {
		t.Fatalf("the log holds %d records with a producer sequence, want 3: %+v", len(want), stored)
	}
	check := func() {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for _, id := range c.ids {
			for !slices.Equal(sl.of(id), want) && time.Now().Before(deadline) {
				time.Sleep(tickEvery)
			}
			if got := sl.of(id); !slices.Equal(got, want) {
				t.Fatalf("replica %d heard %+v, want %+v", id, got, want)
			}
		}
	}
	check()
	lead := c.waitLeader()
	c.kill(lead.ID())
	c.start(lead.ID())
	check()
}

// LeaderTerm is 0 on a new leader until it has applied an entry of its
// own term (so everything committed before it); AppendInTerm refuses a
// record decided in another term, and proposes one of the leader's term.
func TestLeaderTerm(t *testing.T) {
	var stallAfter atomic.Uint64 // appends past this index wait for release, except on replica next
	var next atomic.Uint64
	release := make(chan struct{})
	var once sync.Once
	unstall := func() { once.Do(func() { close(release) }) }
	c := newCluster(t, 3, 22, func(cfg *Config) {
		id := cfg.ID
		cfg.Knobs.BeforeSync = func(last uint64) error {
			if a := stallAfter.Load(); a != 0 && last > a && id != next.Load() {
				<-release
			}
			return nil
		}
	})
	t.Cleanup(unstall) // before the cluster closes

	old := c.waitLeader()
	c.commit([]byte("first"))
	_, oldTerm := old.Leader()
	if got := old.LeaderTerm(); got != oldTerm {
		t.Fatalf("leader with a committed entry of its term %d: LeaderTerm %d", oldTerm, got)
	}
	for _, g := range c.running() {
		if g != old && g.LeaderTerm() != 0 {
			t.Fatalf("follower %d: LeaderTerm %d, want 0", g.ID(), g.LeaderTerm())
		}
	}
	c.waitConverged(1)

	// Hand the leadership to another replica while the others cannot
	// write its term's first entry: it leads, but has not applied it.
	var to *Group
	for _, g := range c.running() {
		if g != old {
			to = g
			break
		}
	}
	stallAfter.Store(c.net.Appended(to.ID()))
	next.Store(to.ID())
	deadline := time.Now().Add(10 * time.Second)
	for !to.IsLeader() && time.Now().Before(deadline) {
		old.TransferLeadership(to.ID())
		time.Sleep(5 * tickEvery)
	}
	if !to.IsLeader() {
		t.Fatal("the leadership was not handed over")
	}
	_, term := to.Leader()
	if term <= oldTerm {
		t.Fatalf("new leader's term %d, old %d", term, oldTerm)
	}
	if got := to.LeaderTerm(); got != 0 {
		t.Fatalf("new leader that has not applied its term's first entry: LeaderTerm %d, want 0", got)
	}
	stale := make(chan result, 1)
	to.AppendInTerm(oldTerm, &wal.Record{Value: []byte("decided in the old term")}, func(o uint64, ts int64, err error) { stale <- result{o, ts, err} })
	if r := <-stale; !errors.Is(r.err, ErrNotLeader) {
		t.Fatalf("AppendInTerm of an earlier term: offset %d err %v, want ErrNotLeader", r.offset, r.err)
	}

	unstall()
	deadline = time.Now().Add(10 * time.Second)
	for to.LeaderTerm() != term && time.Now().Before(deadline) {
		time.Sleep(tickEvery)
	}
	if got := to.LeaderTerm(); got != term {
		t.Fatalf("new leader after its term's first entry committed: LeaderTerm %d, want %d", got, term)
	}
	if got := old.LeaderTerm(); got != 0 {
		t.Fatalf("old leader: LeaderTerm %d, want 0", got)
	}
	ok := make(chan result, 1)
	to.AppendInTerm(term, &wal.Record{Value: []byte("decided in the new term")}, func(o uint64, ts int64, err error) { ok <- result{o, ts, err} })
	if r := <-ok; r.err != nil || r.offset != 1 {
		t.Fatalf("AppendInTerm of the leader's term: offset %d err %v, want offset 1", r.offset, r.err)
	}
	c.checkSame(c.waitConverged(2))
}
