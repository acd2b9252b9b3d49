package wal

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestSyncGroupParksWhileLogsAreBusy: logs of one SyncGroup block their
// fdatasyncs while fewer than its threshold have records to commit, and
// park them while at least that many have. Log A's committer is held in
// its fdatasync (a FaultFS hook), so A stays busy; a commit of log B then
// parks, while B's commits alone, and A's own (taken while B was idle),
// block. Once both are idle the group counts none busy.
func TestSyncGroupParksWhileLogsAreBusy(t *testing.T) {
	g := NewSyncGroup(2)
	dirA, dirB := t.TempDir(), t.TempDir()
	var hold atomic.Bool
	held, release := make(chan struct{}, 1), make(chan struct{})
	fsA := &FaultFS{Inject: func(op Op, path string) bool {
		if op == OpSync && hold.Load() && strings.HasPrefix(path, dirA+string(filepath.Separator)) &&
			!strings.HasSuffix(path, hwmName) {
			select {
			case held <- struct{}{}:
			default:
			}
			<-release
		}
		return false
	}}
	released := false
	free := func() {
		if !released {
			released = true
			close(release)
		}
	}
	a, _ := testLog(t, dirA, Options{Name: "a/0", SyncGroup: g, FS: fsA})
	t.Cleanup(free) // before A's close (cleanups run last first): a failed check must not leave A's committer held
	b, _ := testLog(t, dirB, Options{Name: "b/0", SyncGroup: g})

	appendAsync := func(l *Log, i int) <-chan error {
		done := make(chan error, 1)
		l.AppendAsync(rec(i), func(_ uint64, _ int64, err error) { done <- err })
		return done
	}
	wait := func(what string, done <-chan error) {
		t.Helper()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: not committed after 10s", what)
		}
	}

	// B alone: busy logs 1 < 2, its commits block.
	for i := range 5 {
		wait("B alone", appendAsync(b, i))
	}
	if _, err := b.Append(context.Background(), rec(5)); err != nil { // inline on an idle log: never parked
		t.Fatal(err)
	}
	if st := b.Stats(); st.Parked != 0 {
		t.Fatalf("B committed alone and parked %d of its %d fsyncs; want none", st.Parked, st.Fsyncs)
	}

	// A busy (held in its fdatasync), then B: two busy logs, B parks.
	waitIdle(t, g) // B's committer has gone back to sleep
	hold.Store(true)
	doneA := appendAsync(a, 0)
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("A's committer never reached its fdatasync")
	}
	if n := g.Busy(); n != 1 {
		t.Fatalf("A held in its fdatasync: the group counts %d busy logs, want 1", n)
	}
	before := b.Stats().Parked
	wait("B while A is busy", appendAsync(b, 6))
	if st := b.Stats(); st.Parked != before+1 {
		t.Fatalf("B committed while A was busy: parked %d fsyncs, want %d", st.Parked, before+1)
	}
	free()
	wait("A", doneA)
	if st := a.Stats(); st.Parked != 0 {
		t.Fatalf("A's commit, taken while B was idle, parked (%d); want it blocking", st.Parked)
	}
	if got, want := g.Parked(), a.Stats().Parked+b.Stats().Parked; got != want {
		t.Fatalf("the group counts %d parked fdatasyncs, its logs %d", got, want)
	}

	waitIdle(t, g)
}

// waitIdle waits until no log of g has records to commit: a committer
// marks itself idle when it next finds none, a moment after its last
// commit completed.
func waitIdle(t *testing.T, g *SyncGroup) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for g.Busy() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("every log idle, the group still counts %d busy", g.Busy())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSyncWayOfEachCommit checks how each commit's fdatasync waits
// (tailSync): the committer's batch hands its P on below holdFrom records
// and keeps it from there, and parks whenever it is told to; an inline
// commit keeps its P while no log of its sync group is busy (a lone
// record on an idle broker) and hands it on while one is, and a log
// without a group keeps it.
func TestSyncWayOfEachCommit(t *testing.T) {
	for _, c := range []struct {
		n    int
		park bool
		want tailSync
	}{
		{1, false, syncHandOff},
		{holdFrom - 1, false, syncHandOff},
		{holdFrom, false, syncHold},
		{1000, false, syncHold},
		{1, true, syncPark},
		{holdFrom, true, syncPark},
	} {
		if got := committerSync(c.n, c.park); got != c.want {
			t.Errorf("batch of %d, park %v: way %d, want %d", c.n, c.park, got, c.want)
		}
	}

	g := NewSyncGroup(4)
	l := &Log{opts: Options{SyncGroup: g}}
	if got := l.inlineSync(); got != syncHold {
		t.Errorf("inline commit, no log busy: way %d, want syncHold", got)
	}
	other := g.Member()
	other.SetBusy(true)
	if got := l.inlineSync(); got != syncHandOff {
		t.Errorf("inline commit, another log busy: way %d, want syncHandOff", got)
	}
	other.SetBusy(false)
	if got := l.inlineSync(); got != syncHold {
		t.Errorf("inline commit, the other log idle again: way %d, want syncHold", got)
	}
	if got := (&Log{}).inlineSync(); got != syncHold {
		t.Errorf("inline commit, no sync group: way %d, want syncHold", got)
	}
}
