package wal

import (
	"testing"
	"time"
)

// TestSize: Size follows the segment files through commits, segment
// rolls, a retention pass and a reopen, without listing them itself.
func TestSize(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentSize: 1024, RetentionBytes: 3000, RetentionCheck: time.Hour}
	l, _ := testLog(t, dir, opts)
	if got, want := l.Size(), filesSize(t, dir); got != want {
		t.Fatalf("empty log: Size %d, files %d", got, want)
	}
	appendN(t, l, 0, 200)
	if got, want := l.Size(), filesSize(t, dir); got != want || got == 0 {
		t.Fatalf("after 200 records: Size %d, files %d", got, want)
	}
	if _, err := l.EnforceRetention(time.Now()); err != nil {
		t.Fatal(err)
	}
	if got, want := l.Size(), filesSize(t, dir); got != want || got > 3000 {
		t.Fatalf("after retention: Size %d, files %d", got, want)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2, _ := testLog(t, dir, opts)
	if got, want := l2.Size(), filesSize(t, dir); got != want {
		t.Fatalf("reopened: Size %d, files %d", got, want)
	}
}
