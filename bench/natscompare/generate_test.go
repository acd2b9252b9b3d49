package main

import (
	"testing"
	"time"
)

// TestGenerateChargesABlockedPublish: a publish that blocks (the
// client's window full: Felix's 1024 in flight, NATS's 4096 pending with
// its 200 ms stall) holds up every record scheduled behind it. Their
// latency must run from when they were due, as the bench's open loop does
// (no coordinated omission), not from when the generator got round to
// them, and the system's block is not the generator's own lag (both once
// were).
func TestGenerateChargesABlockedPublish(t *testing.T) {
	*rate, *warm, *dur = 200, 0, time.Second // 200 records, 5 ms apart
	const block = 200 * time.Millisecond
	i := 0
	r := generate(func([]byte) (func() error, error) {
		if i == 20 {
			time.Sleep(block) // a full window: the system's wait
		}
		i++
		acked := time.Now().Add(time.Millisecond)
		return func() error { time.Sleep(time.Until(acked)); return nil }, nil
	})
	t.Logf("p50 %d p90 %d p99 %d µs, gen-lag p50 %d p99 %d µs", r.p50, r.p90, r.p99, r.lagP50, r.lagP99)
	// 40 of the 200 records were due during the 200 ms block: from their
	// due time they waited 5..200 ms, so p90 is well above 10 ms.
	if r.p90 < 10_000 {
		t.Errorf("p90 %d µs: the %v block hidden from the ~40 records due during it (coordinated omission)", r.p90, block)
	}
	if r.lagP99 > 10_000 {
		t.Errorf("gen-lag p99 %d µs: the system's block reported as the generator's timer overshoot", r.lagP99)
	}
}
