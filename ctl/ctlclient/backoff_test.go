package ctlclient

import (
	"testing"
	"time"
)

// TestShortRegistrationsBackOff: a registration that ctl ends as soon as
// it is made (here saying nothing, as a ctl of an earlier version ends
// one another registration of the node replaced) is made again only
// after the backoff, which keeps doubling (to MaxBackoff, 100ms here)
// until a registration lasts a lease; not again at once, in a loop.
func TestShortRegistrationsBackOff(t *testing.T) {
	f := startFakeCtl(t)
	f.endRegistrations.Store(true)
	f.join(t)
	const wait = time.Second
	start := f.registrations.Load()
	time.Sleep(wait)
	// 50ms, then 100ms each (jittered down to half): about fifteen.
	if n := f.registrations.Load() - start; n > 25 {
		t.Errorf("%d registrations in %v of a member whose registrations ctl ends at once, want one per backoff", n, wait)
	}
}
