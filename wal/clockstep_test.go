package wal

import (
	"log/slog"
	"sync/atomic"
	"testing"
	"time"
)

// TestClockStepForwardPoisonsTimestamps: the broker's wall clock steps
// forward by a year for a moment (a bad RTC at boot, an operator's typo),
// one record is committed, then NTP steps it back. Every later record,
// also after a restart, is stamped with the real time again, and age
// retention drops records that are really two hours old: the one record
// of the step neither stamps every later record (the commit clock held
// at the newest stamp, and seeded from it at open) nor holds its
// segment, or the segments after it, for a year.
func TestClockStepForwardPoisonsTimestamps(t *testing.T) {
	const year = 365 * 24 * time.Hour
	var ahead atomic.Int64 // how far the log's wall clock is off
	now := func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	dir := t.TempDir()
	opts := Options{SegmentSize: 1024, RetentionAge: time.Hour, RetentionCheck: time.Hour, Now: now}
	l, _ := testLog(t, dir, opts)
	appendN(t, l, 0, 50)

	ahead.Store(int64(year)) // the step forward
	appendN(t, l, 50, 1)
	ahead.Store(0) // NTP steps the clock back
	appendN(t, l, 51, 100)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, _ = testLog(t, dir, opts) // a restart
	appendN(t, l, 151, 100)

	for _, off := range []uint64{51, 250} {
		recs, err := l.Read(off, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := time.Unix(0, recs[0].Timestamp); time.Until(got) > time.Minute {
			t.Errorf("offset %d, committed after the clock stepped back, is stamped %v (%v in the future): the one record of the clock step stamps every later record", off, got.Format(time.RFC3339), time.Until(got).Round(time.Hour))
		}
	}
	// Two hours on, every record is past the hour's age limit by the
	// real clock.
	dropped, err := l.EnforceRetention(time.Now().Add(2 * time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if dropped < 200 {
		t.Errorf("a retention pass two hours on dropped %d of 251 records (first offset now %d); want all but the tail segment's: age retention is stopped until the clock reaches the stamp of the step, a year on", dropped, l.FirstOffset())
	}
	// What the broker's sweep of closed logs (broker/shards_retention.go)
	// is told: when to open this log again for its retention.
	if at, ok, err := l.Expiry(); err == nil && ok && time.Until(at) > 2*time.Hour {
		t.Errorf("Expiry after the pass: %v away (a closed log of this shard is not swept again until then)", time.Until(at).Round(time.Hour))
	}
}

// TestCommitClockAcrossSteps: a clock stepped back by less than clockStep
// (an NTP correction) holds the stamps at the last one; one stepped back
// further is followed, with one warning; and a log closed while its
// clock was far ahead is not seeded from its newest stamp when it opens
// with the clock put right (one warning), so what it commits next is
// stamped now.
func TestCommitClockAcrossSteps(t *testing.T) {
	var ahead atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	dir := t.TempDir()
	opts := Options{Now: now}
	stamp := func(l *Log, off uint64) time.Time {
		t.Helper()
		recs, err := l.Read(off, 1, 0)
		if err != nil || len(recs) != 1 {
			t.Fatalf("Read(%d) = %d records, %v", off, len(recs), err)
		}
		return time.Unix(0, recs[0].Timestamp)
	}
	l, sink := testLog(t, dir, opts)
	ahead.Store(int64(30 * time.Second))
	appendN(t, l, 0, 1)
	ahead.Store(0) // back by 30s: held
	appendN(t, l, 1, 1)
	if a, b := stamp(l, 0), stamp(l, 1); b.Before(a) {
		t.Errorf("after a step back of 30s the stamp went from %v to %v; want it held", a, b)
	}
	ahead.Store(int64(time.Hour))
	appendN(t, l, 2, 1)
	ahead.Store(0) // back by an hour: followed
	appendN(t, l, 3, 1)
	if d := time.Until(stamp(l, 3)); d > time.Minute || d < -time.Minute {
		t.Errorf("after a step back of an hour offset 3 is stamped %v from now; want now", d)
	}
	if n := sink.count(slog.LevelWarn); n != 1 {
		t.Errorf("%d warnings after one step back past clockStep, want 1: %q", n, sink.msgs)
	}

	ahead.Store(int64(24 * time.Hour))
	appendN(t, l, 4, 1)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	ahead.Store(0)
	l, sink = testLog(t, dir, opts)
	appendN(t, l, 5, 1)
	if d := time.Until(stamp(l, 5)); d > time.Minute {
		t.Errorf("a log closed with its clock a day ahead stamps its next record %v ahead after opening with the clock put right", d.Round(time.Hour))
	}
	if n := sink.count(slog.LevelWarn); n != 1 {
		t.Errorf("%d warnings opening a log whose newest stamp is a day ahead, want 1: %q", n, sink.msgs)
	}
}

// TestRetentionAgeAcrossAClockStep: the clock runs a year ahead for a few
// dozen commits, whole segments of them, then steps back: the stamps go
// down at the step. Two hours on, every segment but the tail is past the
// hour's limit by its file, the year-ahead ones too; Expiry of what
// remains is within the limit, not a year on.
func TestRetentionAgeAcrossAClockStep(t *testing.T) {
	var ahead atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	opts := Options{SegmentSize: 1024, RetentionAge: time.Hour, RetentionCheck: time.Hour, Now: now}
	for _, before := range []int{10, 60, 120} { // where the step falls among the segments
		l, _ := testLog(t, t.TempDir(), opts)
		appendN(t, l, 0, before)
		ahead.Store(int64(365 * 24 * time.Hour))
		appendN(t, l, before, 30)
		ahead.Store(0)
		appendN(t, l, before+30, 150-before)
		dropped, err := l.EnforceRetention(time.Now().Add(2 * time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if dropped < 150 {
			t.Errorf("step after %d records: a pass two hours on dropped %d of 180 (first offset now %d); want all but the tail segment's", before, dropped, l.FirstOffset())
		}
		if at, ok, err := l.Expiry(); err != nil || ok && time.Until(at) > 2*time.Hour {
			t.Errorf("step after %d records: Expiry after the pass %v away, %v", before, time.Until(at).Round(time.Hour), err)
		}
	}
}
