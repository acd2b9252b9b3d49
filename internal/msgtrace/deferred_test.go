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
	deadline := time.Now().Add(5 * time.Second)
	for {
		d.mu.Lock()
		parked := d.parked
		d.mu.Unlock()
		if parked {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the runner did not park")
		}
		time.Sleep(DeferDelay)
	}
	d.Add(func() { ran <- struct{}{} })
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("Add did not wake the parked runner")
	}
	d.Close()
	d.Close() // idempotent
}
