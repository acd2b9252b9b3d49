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
// ForwardTimeout: the records that need as new a map meanwhile fail at
// once instead of each waiting ForwardTimeout in turn. A peer stream's
// reader takes its records one at a time, so a pipeline of forwards that
// all needed an epoch the control plane could not give was answered one
// ForwardTimeout after another (hours for a full window), holding the
// stream, and the flow-control window of the connection it shares, all
// along.
type catchUpMiss struct {
	mu sync.Mutex
	lastMiss

	// waits counts the catch-ups that asked the control plane (Refresh).
	waits atomic.Int64
}

// lastMiss is the last catch-up of its kind that waited its whole course
// in vain; its holder guards it.
type lastMiss struct {
	epoch uint64 // the epoch asked for
	until time.Time
	err   error // nil: none
}

// covers reports whether a catch-up to epoch would fail now as m did.
func (m *lastMiss) covers(epoch uint64) bool {
	return m.err != nil && epoch >= m.epoch && time.Now().Before(m.until)
}

// catchUp returns a map at least as new as epoch, an epoch a peer named
// (a forward's, or an owner's refusal's): the broker's own if it is, else
// one asked from the control plane within ForwardTimeout, or an error. An
// epoch at or past one that was missed less than ForwardTimeout ago fails
// at once, unless the map has arrived since.
func (b *Broker) catchUp(ctx context.Context, epoch uint64) (*shardmap.Map, error) {
	if m := b.routingMap(); m.Epoch >= epoch {
		return m, nil
	}
	miss := &b.missed
	miss.mu.Lock()
	if miss.covers(epoch) {
		err := miss.err
		miss.mu.Unlock()
		return nil, fmt.Errorf("%w (an earlier wait for epoch %d failed less than %v ago)", err, miss.epoch, b.cfg.ForwardTimeout)
	}
	miss.mu.Unlock()
	m, ranOut, err := b.refresh(ctx, epoch)
	if ranOut {
		// Only a wait that ran its whole course says the control plane
		// cannot give the epoch now; a caller that gave up says nothing.
		miss.mu.Lock()
		miss.lastMiss = lastMiss{epoch, time.Now().Add(b.cfg.ForwardTimeout), err}
		miss.mu.Unlock()
	}
	return m, err
}

// refresh asks the control plane for a map at least as new as epoch,
// within ForwardTimeout; ranOut says it waited all of it.
func (b *Broker) refresh(ctx context.Context, epoch uint64) (m *shardmap.Map, ranOut bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.ForwardTimeout)
	defer cancel()
	b.missed.waits.Add(1)
	m, err = b.member.Refresh(ctx, epoch)
	return m, err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded), err
}

// clientCatchUp bounds what clients can make the broker ask of the
// control plane. A client names a newer map than the broker holds when it
// read one from a broker ahead of this one: the incarnation of a stream
// it picked a record's shard or a subscription's by (Created), or the
// map that grants a subscription this broker's map refuses. But any
// client certificate can name any epoch, and each catch-up asks the
// control plane for the whole map until it comes or ForwardTimeout
// passes: one per publisher stream or subscription, thousands of a
// principal's at once, asked it as often. So one such catch-up runs at a
// time per broker: the others wait for it, or for the map to reach their
// epoch, whichever comes first, and are then judged by the map the
// broker holds. A client granted in, or publishing by, a newer map is
// served once that map comes, however many of them wait. A client's miss
// is remembered apart from the peers' (catchUpMiss): an epoch no map
// holds, named by a client, must not fail a peer's forward that needs
// the next real one; the clients' requests naming it or a later one fail
// at once for ForwardTimeout, as the peers' do for theirs, rather than
// each waiting ForwardTimeout in turn on its stream.
type clientCatchUp struct {
	mu   sync.Mutex
	done chan struct{} // closed when the catch-up in flight ends; nil if none
	miss lastMiss      // the clients', apart from the peers'
}

// catchUpForClient returns the map what a client sent, naming epoch, is
// judged by: at least epoch if the control plane gives it in time (see
// clientCatchUp), else the broker's own. ctx is the caller's: its end
// ends the caller's wait, or the catch-up it runs for everyone.
func (b *Broker) catchUpForClient(ctx context.Context, epoch uint64) *shardmap.Map {
	if m := b.routingMap(); m.Epoch >= epoch {
		return m
	}
	d := &b.clients
	d.mu.Lock()
	if d.miss.covers(epoch) {
		d.mu.Unlock()
		return b.routingMap()
	}
	done := d.done
	if done == nil {
		done = make(chan struct{})
		d.done = done
		d.mu.Unlock()
		m, ranOut, err := b.refresh(ctx, epoch)
		d.mu.Lock()
		d.done = nil
		if ranOut {
			d.miss = lastMiss{epoch, time.Now().Add(b.cfg.ForwardTimeout), err}
		}
		d.mu.Unlock()
		close(done)
		if err != nil {
			return b.routingMap()
		}
		return m
	}
	d.mu.Unlock()
	for {
		changed := b.member.Changed()
		if m := b.routingMap(); m.Epoch >= epoch {
			return m
		}
		select {
		case <-changed:
		case <-done:
			return b.routingMap()
		case <-ctx.Done():
			return b.routingMap()
		}
	}
}
