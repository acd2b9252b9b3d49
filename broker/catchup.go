package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/felix-broker/felix/shardmap"
)

// catchUpMiss remembers the last catch-up to a map epoch that failed, for
// ForwardTimeout: the records that need as new a map meanwhile fail at
// once instead of each waiting ForwardTimeout in turn. A peer stream's
// reader takes its records one at a time, so a pipeline of forwards that
// all needed an epoch the control plane could not give was answered one
// ForwardTimeout after another (hours for a full window), holding the
// stream, and the flow-control window of the connection it shares, all
// along.
type catchUpMiss struct {
	mu    sync.Mutex
	epoch uint64 // the epoch asked for
	until time.Time
	err   error
}

// catchUp returns a map at least as new as epoch: the broker's own if it
// is, else one asked from the control plane within ForwardTimeout, or an
// error. An epoch at or past one that was missed less than ForwardTimeout
// ago fails at once, unless the map has arrived since.
func (b *Broker) catchUp(ctx context.Context, epoch uint64) (*shardmap.Map, error) {
	if m := b.routingMap(); m.Epoch >= epoch {
		return m, nil
	}
	miss := &b.missed
	miss.mu.Lock()
	if miss.err != nil && epoch >= miss.epoch && time.Now().Before(miss.until) {
		err := miss.err
		miss.mu.Unlock()
		return nil, fmt.Errorf("%w (an earlier wait for epoch %d failed less than %v ago)", err, miss.epoch, b.cfg.ForwardTimeout)
	}
	miss.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, b.cfg.ForwardTimeout)
	defer cancel()
	m, err := b.member.Refresh(ctx, epoch)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// Only a wait that ran its whole course says the control plane
		// cannot give the epoch now; a caller that gave up says nothing.
		miss.mu.Lock()
		miss.epoch, miss.until, miss.err = epoch, time.Now().Add(b.cfg.ForwardTimeout), err
		miss.mu.Unlock()
	}
	return m, err
}
