package ctlclient

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
)

// TestRefreshAsksAtItsPollInterval: Refresh takes a map that ctl answers
// map.get with if it is new enough, at once; while ctl holds none that
// new, it asks again every LeaseTTL/3, not in a loop.
func TestRefreshAsksAtItsPollInterval(t *testing.T) {
	f := startFakeCtl(t)
	m := f.join(t)
	f.mp.Store(&shardmap.Map{Epoch: 5}) // not pushed: only map.get has it
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if mp, err := m.Refresh(ctx, 5); err != nil || mp.Epoch != 5 {
		t.Fatalf("Refresh(5) with ctl at epoch 5 = %v, %v", mp, err)
	}
	if n := f.mapGets.Load(); n != 1 {
		t.Errorf("Refresh(5) asked map.get %d times, want once", n)
	}

	const wait = time.Second // LeaseTTL/3 is 100ms
	short, cancel2 := context.WithTimeout(ctx, wait)
	defer cancel2()
	start := f.mapGets.Load()
	if _, err := m.Refresh(short, 9); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Refresh(9) with ctl at epoch 5: %v, want DeadlineExceeded", err)
	}
	if n := f.mapGets.Load() - start; n > 15 {
		t.Errorf("Refresh(9) asked map.get %d times in %v, want one every 100ms", n, wait)
	}
}
