package broker

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// filledTable returns a table that applied, per producer, the sequences
// given: producer k's sequence s at offset 1000*k+s.
func filledTable(lim producerLimits, seqs map[string][2]uint64) *producerTable {
	tab := newProducerTable("s/0", lim, nil)
	now := time.Now().UnixNano()
	for id, r := range seqs {
		for s := r[0]; s <= r[1]; s++ {
			tab.applied([]byte(id), s, offsetOf(id, s), now+int64(s))
		}
	}
	return tab
}

func offsetOf(id string, seq uint64) uint64 { return uint64(id[0])*1000 + seq }

// A table carried in a snapshot answers, on the replica that installs
// it, as it did on the leader: a remembered sequence is a duplicate with
// its original ack, an older one duplicate_sequence, the next one is
// appended, a gap is out of order; and applying entries it already
// reflects changes nothing.
func TestProducerStateRoundTrip(t *testing.T) {
	lim := producerLimits{max: 10, expiry: time.Minute, window: 4}
	leader := filledTable(lim, map[string][2]uint64{"a": {1, 9}, "b": {5, 6}, "c": {1, 1}})
	state := leader.snapshotState(1 << 20)

	tab := newProducerTable("s/0", lim, nil)
	tab.applied([]byte("stale"), 1, 1, time.Now().UnixNano()) // replaced by the restore
	if err := tab.restoreState(state); err != nil {
		t.Fatal(err)
	}
	if n := tab.size(); n != 3 {
		t.Fatalf("%d producers restored, want 3", n)
	}
	// Entries between the snapshot's index and the leader's applied one
	// apply again: no change.
	tab.applied([]byte("a"), 8, 12345, 0)
	check := func(id string, seq uint64, want admitKind) {
		t.Helper()
		a := tab.admit(id, seq)
		if a.kind != want {
			t.Fatalf("%s/%d: %v, want %v", id, seq, a.kind, want)
		}
		if want == admitDuplicate && a.ack.offset != offsetOf(id, seq) {
			t.Fatalf("%s/%d: duplicate of offset %d, want %d", id, seq, a.ack.offset, offsetOf(id, seq))
		}
		if want == admitAppend {
			tab.enqueued(a.p)
		}
	}
	check("a", 9, admitDuplicate)
	check("a", 8, admitDuplicate)
	check("a", 6, admitDuplicate)
	check("a", 5, admitTooOld) // window 4: 6..9 remembered
	check("a", 12, admitOutOfOrder)
	check("a", 10, admitAppend)
	check("b", 5, admitDuplicate)
	check("b", 4, admitOutOfOrder) // before anything known of b
	check("c", 1, admitDuplicate)
	check("stale", 2, admitUnknown) // forgotten
	check("stale", 1, admitAppend)  // a new producer
}

// The state fits its budget: the most recently used producers first,
// each with its most recent acks as far as the budget goes.
func TestProducerStateBudget(t *testing.T) {
	lim := producerLimits{max: 1000, expiry: time.Minute, window: 256}
	seqs := map[string][2]uint64{}
	for k := range 200 {
		seqs[fmt.Sprintf("%c-producer-%03d", 'a'+k%26, k)] = [2]uint64{1, 256}
	}
	leader := filledTable(lim, seqs)
	leader.applied([]byte("z-latest"), 7, offsetOf("z", 7), time.Now().UnixNano())
	for _, budget := range []int{1, 128, 4 << 10, 64 << 10, 1 << 20} {
		state := leader.snapshotState(budget)
		if len(state) > budget {
			t.Fatalf("budget %d: state of %d bytes", budget, len(state))
		}
		tab := newProducerTable("s/0", lim, nil)
		if err := tab.restoreState(state); err != nil {
			t.Fatalf("budget %d: %v", budget, err)
		}
		n := tab.size()
		t.Logf("budget %d: %d bytes, %d producers", budget, len(state), n)
		if budget >= 128 {
			if a := tab.admit("z-latest", 7); a.kind != admitDuplicate || a.ack.offset != offsetOf("z", 7) {
				t.Fatalf("budget %d: the most recent producer's last sequence: %+v", budget, a)
			}
		}
		if budget == 1<<20 && n != 201 {
			t.Fatalf("budget 1 MiB: %d producers carried, want all 201", n)
		}
	}
}

// A state from a peer that does not decode leaves the table empty, with
// a typed error, and never panics: every cut of a good state, and bytes
// that claim more than they hold.
func TestProducerStateBadInput(t *testing.T) {
	lim := producerLimits{max: 10, expiry: time.Minute, window: 4}
	good := filledTable(lim, map[string][2]uint64{"a": {1, 9}, "b": {5, 6}}).snapshotState(1 << 20)
	bad := [][]byte{
		{9},                     // another version
		{1, 200, 1},             // id longer than the state
		{1, 1, 'a', 5, 3, 0, 0}, // committed below floor
		{1, 1, 'a', 0, 3, 0, 4}, // more acks than sequences committed
		{1, 1, 'a', 0, 9, 0, 7}, // acks the bytes cannot hold
		append(append([]byte{}, good...), good[1:]...), // a producer twice
	}
	for cut := 1; cut < len(good); cut++ {
		if c := good[:cut]; !decodesWhole(c) {
			bad = append(bad, c)
		}
	}
	for _, b := range bad {
		tab := newProducerTable("s/0", lim, nil)
		tab.applied([]byte("known"), 1, 1, 0)
		err := tab.restoreState(b)
		if !errors.Is(err, errProducerState) {
			t.Fatalf("state % x: %v, want errProducerState", b, err)
		}
		if n := tab.size(); n != 0 {
			t.Fatalf("state % x: %d producers left after the error", b, n)
		}
	}
}

// decodesWhole reports whether cut happens to end on a producer's
// boundary (a shorter state that is still well formed).
func decodesWhole(cut []byte) bool {
	return newProducerTable("s/0", producerLimits{max: 10, window: 4}, nil).restoreState(cut) == nil
}

func FuzzProducerState(f *testing.F) {
	lim := producerLimits{max: 10, expiry: time.Minute, window: 4}
	f.Add(filledTable(lim, map[string][2]uint64{"a": {1, 9}, "b": {5, 6}}).snapshotState(1 << 20))
	f.Add([]byte{1, 1, 'a', 0, 3, 0, 2, 1, 1, 2, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		tab := newProducerTable("s/0", lim, nil)
		if err := tab.restoreState(b); err != nil {
			if tab.size() != 0 {
				t.Fatalf("%d producers after %v", tab.size(), err)
			}
			return
		}
		if tab.size() > lim.max {
			t.Fatalf("%d producers, bound %d", tab.size(), lim.max)
		}
		// What was restored encodes and restores to the same.
		again := newProducerTable("s/0", lim, nil)
		if err := again.restoreState(tab.snapshotState(1 << 20)); err != nil || again.size() != tab.size() {
			t.Fatalf("re-encoding: %v, %d producers, want %d", err, again.size(), tab.size())
		}
	})
}
