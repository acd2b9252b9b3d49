package broker

import "testing"

// A grant is judged against all the credit the subscriber has out: what
// is waiting and what the writer took and has not settled.
func TestCreditCountsWhatTheWriterHolds(t *testing.T) {
	c := newCredit(60, 100)
	if n, ok := c.take(1000, nil); !ok || n != 60 {
		t.Fatalf("take: %d %v, want 60", n, ok)
	}
	if c.add(41) || !c.exceeded() {
		t.Fatal("41 more while the writer holds 60 of 60 granted: 101 out, over the bound of 100, but accepted")
	}

	c = newCredit(60, 100)
	c.take(1000, nil)
	c.giveBack(0) // all 60 sent
	if !c.add(100) || c.exceeded() {
		t.Fatal("100 granted once the 60 were sent was refused")
	}
	c.take(1000, nil)
	c.giveBack(30) // 70 of the 100 sent
	if !c.add(70) || c.add(1) {
		t.Fatal("want 70 more accepted (100 out) and 1 more refused")
	}
}

// A subscriber that closed its side is still sent what it granted; once
// that is spent, take ends the subscription instead of waiting for a
// grant that cannot come.
func TestCreditAfterClose(t *testing.T) {
	c := newCredit(10, 100)
	c.close()
	if n, ok := c.take(4, nil); !ok || n != 4 {
		t.Fatalf("take after close: %d %v, want 4 of the 10 granted", n, ok)
	}
	c.giveBack(1) // 3 sent
	if n, ok := c.take(100, nil); !ok || n != 7 {
		t.Fatalf("take: %d %v, want the 7 left", n, ok)
	}
	c.giveBack(0)
	if n, ok := c.take(100, nil); ok {
		t.Fatalf("take with the credit spent after close: %d, want the end", n)
	}

	// A writer waiting for credit when the subscriber closes its side
	// ends.
	c = newCredit(0, 100)
	done := make(chan bool)
	go func() {
		_, ok := c.take(100, nil)
		done <- ok
	}()
	c.close()
	if <-done {
		t.Fatal("a take waiting with no credit went on after close")
	}
}
