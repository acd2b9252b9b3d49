package broker

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/quic-go/quic-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/felix-broker/felix/internal/logonce"
	"github.com/felix-broker/felix/internal/msgtrace"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// Names of the limits, as logged and as the limit attribute of
// felix_limit_hits_total.
const (
	limitConns            = "connections"
	limitConnsPerPrinc    = "connections_per_principal"
	limitStreamsPerConn   = "streams_per_connection"
	limitFirstFrame       = "first_frame_timeout"
	limitSubsPerConn      = "subscriptions_per_connection"
	limitCredit           = "subscription_credit"
	limitHeaders          = "headers"
	limitHeaderBytes      = "header_bytes"
	limitRecordBytes      = "record_bytes"
	limitPublishInFlight  = "publish_in_flight"
	limitPublishBytes     = "publish_bytes_per_principal"
	limitSubscriptionByte = "subscription_bytes_per_principal"
	limitProducers        = "producers"
	limitProducerID       = "producer_id_bytes"
	limitSubscribedLogs   = "subscribed_logs_per_principal"
)

// ackReserve is what each record a client publishes is charged beyond its
// own bytes against its principal's PublishBytesPerPrincipal: room for its
// answer (an Ack or an Error frame) while that waits to be written.
const ackReserve = 512

// limits holds the broker-wide state of its resource limits: connection
// counts, and per principal the byte budgets its streams share. A
// principal's entry lives while it has a connection.
type limits struct {
	cfg  *Config
	log  *slog.Logger
	hits metric.Int64Counter
	once logonce.Set // limit and principal already logged

	// mu guards the counts; it is taken per connection, never per record.
	mu struct {
		sync.Mutex
		conns      int                      // client connections
		principals map[string]*principalUse // by principal name
		// pinned counts every principal's subscriptions by shard whose
		// log they keep open (replication factor 1).
		pinned map[shardmap.ShardID]int
	}
}

// principalUse is what one principal's connections hold together.
type principalUse struct {
	conns   int         // guarded by limits.mu
	publish *byteBudget // record bytes in flight and answers not yet written
	sub     *byteBudget // records read for subscribers and not yet written
	// pins counts the principal's subscriptions by shard whose log
	// they keep open (replication factor 1); guarded by limits.mu.
	pins map[shardmap.ShardID]int
}

// frameHolder charges what a client stream's Reader buffers for a large
// frame (transport.Holder) to the principal's publish budget, waiting for
// room as a publish does: a frame started and never finished, on every
// stream a principal may open, once held a MiB each outside every budget.
type frameHolder struct {
	budget     *byteBudget
	stop, done <-chan struct{}
}

func (h frameHolder) Hold(n int) bool { return h.budget.acquire(int64(n), h.stop, h.done) }
func (h frameHolder) Free(n int)      { h.budget.release(int64(n)) }

// connUse counts what one client connection holds.
type connUse struct {
	principal string
	use       *principalUse
	streams   atomic.Int32
	subs      atomic.Int32
}

func newLimits(cfg *Config, log *slog.Logger) (*limits, error) {
	l := &limits{cfg: cfg, log: log}
	l.mu.principals = map[string]*principalUse{}
	mp := cfg.MeterProvider
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	var err error
	l.hits, err = mp.Meter(msgtrace.ScopeName).Int64Counter("felix.limit.hits", metric.WithUnit("{hit}"),
		metric.WithDescription("Requests refused or held back because a client reached a resource limit, by limit."))
	return l, err
}

// hit counts a limit reached by principal and logs it once per limit and
// principal.
func (l *limits) hit(limit, principal, detail string) {
	l.hits.Add(context.Background(), 1, metric.WithAttributes(attribute.String("limit", limit)))
	if l.once.First(limit + "\x00" + principal) {
		l.log.Warn("client reached a resource limit (logged once per principal and limit)",
			"limit", limit, "principal", principal, "detail", detail)
	}
}

// exceeded counts a limit hit and returns the typed error the client gets.
func (l *limits) exceeded(limit, principal, format string, args ...any) *transport.Error {
	msg := fmt.Sprintf(format, args...)
	l.hit(limit, principal, msg)
	return &transport.Error{Code: transport.CodeLimitExceeded, Message: msg}
}

// admitConn counts a new client connection of principal, or refuses it.
// The returned connUse is released with releaseConn.
func (l *limits) admitConn(principal string) (*connUse, *transport.Error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.conns >= l.cfg.MaxConns {
		return nil, l.exceeded(limitConns, principal, "the broker has %d client connections, its limit (MaxConns); connect to another broker or retry later", l.mu.conns)
	}
	u := l.mu.principals[principal]
	if u != nil && u.conns >= l.cfg.MaxConnsPerPrincipal {
		return nil, l.exceeded(limitConnsPerPrinc, principal, "principal %q has %d connections to this broker, its limit (MaxConnsPerPrincipal); share connections between publishers and subscribers", principal, u.conns)
	}
	if u == nil {
		u = &principalUse{
			publish: newByteBudget(int64(l.cfg.PublishBytesPerPrincipal)),
			sub:     newByteBudget(int64(l.cfg.SubscriptionBytesPerPrincipal)),
		}
		l.mu.principals[principal] = u
	}
	u.conns++
	l.mu.conns++
	return &connUse{principal: principal, use: u}, nil
}

func (l *limits) releaseConn(c *connUse) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.conns--
	if c.use.conns--; c.use.conns == 0 {
		delete(l.mu.principals, c.principal)
	}
}

// pin counts a subscription of c's principal that keeps shard id's log
// open, or refuses it. A subscription pins its log for its whole life,
// idle or not, and logs pinned are never closed for the budget, so
// subscriptions together keep at most budget.all logs open at once (three
// quarters of the broker's open-log budget: the rest is for publishes),
// and one principal's at most budget.principal (half of it). One
// principal subscribed to as many shards as the budget holds made every
// other log's open fail unavailable; so did two, each within its half.
// Each pin is undone with unpin.
func (l *limits) pin(c *connUse, id shardmap.ShardID, budget pinBudget) *transport.Error {
	l.mu.Lock()
	defer l.mu.Unlock()
	u := c.use
	if u.pins[id] == 0 && len(u.pins) >= budget.principal {
		return l.exceeded(limitSubscribedLogs, c.principal,
			"principal %q's subscriptions keep %d shard logs open on this broker, its limit (half of --max-open-shards, so that others' logs can open); end a subscription first",
			c.principal, len(u.pins))
	}
	if l.mu.pinned[id] == 0 && len(l.mu.pinned) >= budget.all {
		return l.exceeded(limitSubscribedLogs, c.principal,
			"subscriptions keep %d shard logs open on this broker, its limit (three quarters of --max-open-shards, so that publishes can open theirs); end a subscription, or raise --max-open-shards",
			len(l.mu.pinned))
	}
	if u.pins == nil {
		u.pins = map[shardmap.ShardID]int{}
	}
	if l.mu.pinned == nil {
		l.mu.pinned = map[shardmap.ShardID]int{}
	}
	u.pins[id]++
	l.mu.pinned[id]++
	return nil
}

// unpin undoes a pin of id by c's principal.
func (l *limits) unpin(c *connUse, id shardmap.ShardID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.use.pins[id]--; c.use.pins[id] <= 0 {
		delete(c.use.pins, id)
	}
	if l.mu.pinned[id]--; l.mu.pinned[id] <= 0 {
		delete(l.mu.pinned, id)
	}
}

// admitStream counts a new stream on c, or refuses it: the stream is
// answered with an Error frame without blocking (it is fresh, so its
// flow-control window has room) and closed. It returns false if refused.
func (l *limits) admitStream(c *connUse, s *quic.Stream) bool {
	if n := c.streams.Add(1); int(n) <= l.cfg.MaxStreamsPerConn {
		return true
	}
	c.streams.Add(-1)
	werr := l.exceeded(limitStreamsPerConn, c.principal, "the connection has %d open streams, the broker's limit (MaxStreamsPerConn); close streams or open another connection", l.cfg.MaxStreamsPerConn)
	if b, err := transport.AppendFrame(nil, werr); err == nil {
		s.TryWriteAll(b)
	}
	s.CancelRead(quic.StreamErrorCode(werr.Code))
	s.Close()
	return false
}

// byteBudget is a count of bytes in use, bounded: acquire waits while the
// bound would be passed, except that it always grants a request when
// nothing is in use (so one item larger than the bound still goes
// through, alone).
type byteBudget struct {
	max int64

	// mu guards used and the channel that wakes waiters, which release
	// closes and replaces only if someone waits.
	mu   sync.Mutex
	used int64
	wake chan struct{}
}

func newByteBudget(max int64) *byteBudget { return &byteBudget{max: max} }

// tryAcquire takes n bytes if that keeps within the bound.
func (bb *byteBudget) tryAcquire(n int64) bool {
	bb.mu.Lock()
	defer bb.mu.Unlock()
	if bb.used != 0 && bb.used+n > bb.max {
		return false
	}
	bb.used += n
	return true
}

// acquire takes n bytes, waiting for them; it returns false if abort or
// done closes first.
func (bb *byteBudget) acquire(n int64, abort, done <-chan struct{}) bool {
	for {
		bb.mu.Lock()
		if bb.used == 0 || bb.used+n <= bb.max {
			bb.used += n
			bb.mu.Unlock()
			return true
		}
		if bb.wake == nil {
			bb.wake = make(chan struct{})
		}
		wake := bb.wake
		bb.mu.Unlock()
		select {
		case <-wake:
		case <-abort:
			return false
		case <-done:
			return false
		}
	}
}

// release gives back n bytes.
func (bb *byteBudget) release(n int64) {
	if n == 0 {
		return
	}
	bb.mu.Lock()
	bb.used -= n
	wake := bb.wake
	bb.wake = nil
	bb.mu.Unlock()
	if wake != nil {
		close(wake)
	}
}

// inUse returns the bytes in use.
func (bb *byteBudget) inUse() int64 {
	bb.mu.Lock()
	defer bb.mu.Unlock()
	return bb.used
}
