package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/felix-broker/felix/shardmap"
)

// catchUpMiss remembers the last catch-up to a map epoch that failed, for
// ForwardTimeout: the records that need a newer map than the broker holds
// meanwhile fail at once instead of each waiting ForwardTimeout in turn.
// A peer stream's reader takes its records one at a time, so a pipeline of
// forwards that all needed an epoch the control plane could not give was
// answered one ForwardTimeout after another (hours for a full window),
// holding the stream, and the flow-control window of the connection it
// shares, all along.
//
// A miss covers every epoch newer than the map the broker held when the
// wait gave up (held), not only those at or past the one asked for: the
// wait adopted whatever the control plane had, so it had nothing newer
// than held to give. Asking for a lower epoch next (a client's Created
// counting down) would otherwise have started a new wait, and a new round
// of map.get requests to the control plane, every time. A map newer than
// held arriving ends the miss.
type catchUpMiss struct {
	mu    sync.Mutex
	epoch uint64 // the epoch asked for
	held  uint64 // the epoch of the broker's map when the wait gave up
	until time.Time
	err   error

	// granting is set while a subscription refused by the broker's map
	// waits for the newer map its client named (grantCatchUp): one such
	// wait at a time per broker.
	granting atomic.Bool
}

// catchUp returns a map at least as new as epoch: the broker's own if it
// is, else one asked from the control plane within ForwardTimeout, or an
// error. While a wait that gave up less than ForwardTimeout ago is a miss
// (see catchUpMiss) and the broker's map has not moved past the one it
// held then, any epoch newer than that fails at once.
func (b *Broker) catchUp(ctx context.Context, epoch uint64) (*shardmap.Map, error) {
	if m := b.routingMap(); m.Epoch >= epoch {
		return m, nil
	}
	miss := &b.missed
	miss.mu.Lock()
	if miss.err != nil && epoch > miss.held && b.member.Map().Epoch <= miss.held && time.Now().Before(miss.until) {
		err := miss.err
		miss.mu.Unlock()
		return nil, fmt.Errorf("%w (an earlier wait for epoch %d failed less than %v ago, and the map is still at epoch %d)", err, miss.epoch, b.cfg.ForwardTimeout, miss.held)
	}
	miss.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, b.cfg.ForwardTimeout)
	defer cancel()
	m, err := b.member.Refresh(ctx, epoch)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// Only a wait that ran its whole course says the control plane
		// cannot give the epoch now; a caller that gave up says nothing.
		miss.mu.Lock()
		miss.epoch, miss.held, miss.until, miss.err = epoch, b.member.Map().Epoch, time.Now().Add(b.cfg.ForwardTimeout), err
		miss.mu.Unlock()
	}
	return m, err
}

// grantCatchUp catches up to epoch for a request its principal is refused
// by the broker's map m, in case the map that grants it is newer than m
// (the client read it from a broker ahead of this one): it returns the
// newer map to authorize against again, or m. Any client certificate can
// ask this, so it is bounded beyond catchUp's misses: one such wait at a
// time per broker; a request that finds one under way is judged by m.
func (b *Broker) grantCatchUp(m *shardmap.Map, epoch uint64) *shardmap.Map {
	if epoch <= m.Epoch || !b.missed.granting.CompareAndSwap(false, true) {
		return m
	}
	defer b.missed.granting.Store(false)
	if nm, err := b.catchUp(b.ctx, epoch); err == nil {
		return nm
	}
	return m
}
