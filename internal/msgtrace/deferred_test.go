package msgtrace

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestDeferredRunsLaterInOrder(t *testing.T) {
	var d Deferred
	var mu sync.Mutex
	var got []int
	for i := range 5 {
		d.Add(func() {
			mu.Lock()
			got = append(got, i)
			mu.Unlock()
		})
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n == 5 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, v := range got {
		if v != i {
			t.Fatalf("ran %v, want 0..4 in order", got)
		}
	}
	if len(got) != 5 {
		t.Fatalf("ran %v, want 0..4", got)
	}
	d.Close()
}

func TestDeferredCloseRunsQueuedAndLaterInline(t *testing.T) {
	var d Deferred
	var n atomic.Int32
	for range 3 {
		d.Add(func() { n.Add(1) })
	}
	d.Close()
	if got := n.Load(); got != 3 {
		t.Fatalf("after Close %d ran, want 3", got)
	}
	d.Add(func() { n.Add(1) })
	if got := n.Load(); got != 4 {
		t.Fatalf("Add after Close did not run inline: %d ran", got)
	}
}

// TestDeferredConcurrent adds from many goroutines across several timer
// runs; run with -race.
func TestDeferredConcurrent(t *testing.T) {
	var d Deferred
	var n atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				d.Add(func() { n.Add(1) })
				if n.Load()%50 == 0 {
					time.Sleep(DeferDelay)
				}
			}
		})
	}
	wg.Wait()
	d.Close()
	if got := n.Load(); got != 1600 {
		t.Fatalf("%d ran, want 1600", got)
	}
}

// TestDeferredParksAndWakes lets the runner park for want of work, then
// checks that the next Add wakes it.
func TestDeferredParksAndWakes(t *testing.T) {
	defer func(n int) { parkAfter = n }(parkAfter)
	parkAfter = 2
	var d Deferred
	defer d.Close()
	ran := make(chan struct{}, 1)
	d.Add(func() { ran <- struct{}{} })
	<-ran
	waitParked(t, &d, "the runner did not park")
	d.Add(func() { ran <- struct{}{} })
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("Add did not wake the parked runner")
	}
	d.Close()
	d.Close() // idempotent
}

// TestDeferredSoon: with ticks an hour apart, only Soon can run what is
// queued; after that run the runner parks, and the next Add and Soon
// run again. Soon before the first Add and after Close does nothing.
func TestDeferredSoon(t *testing.T) {
	defer func(d time.Duration) { tick = d }(tick)
	tick = time.Hour
	var d Deferred
	d.Soon() // nothing queued, no runner: a no-op
	ran := make(chan int, 2)
	wait := func(want int) {
		t.Helper()
		select {
		case got := <-ran:
			if got != want {
				t.Fatalf("ran %d, want %d", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%d did not run within 5s of Soon", want)
		}
	}
	d.Add(func() { ran <- 1 })
	d.Soon()
	wait(1)
	waitParked(t, &d, "the runner did not park after a run Soon asked for")
	d.Add(func() { ran <- 2 })
	d.Soon()
	wait(2)
	d.Close()
	d.Soon() // after Close: a no-op
	d.Add(func() { ran <- 3 })
	wait(3) // inline after Close
}

// waitParked waits up to 5s for d's runner to park, failing with msg.
func waitParked(t *testing.T, d *Deferred, msg string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		d.mu.Lock()
		parked := d.parked
		d.mu.Unlock()
		if parked {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
	}
}
