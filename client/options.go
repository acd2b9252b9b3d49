package client

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/felix-broker/felix/transport"
)

// Opt configures a [Client]. Only this package defines options; pass them
// to [Connect].
type Opt interface{ apply(*config) }

type optFunc func(*config)

func (f optFunc) apply(c *config) { f(c) }

// config is what Connect is given, with defaults applied by defaults().
type config struct {
	ca         *x509.CertPool
	caFile     string
	cert       *tls.Certificate
	certFile   string // read by Connect when cert is nil
	keyFile    string
	serverName string
	insecure   bool

	logger *slog.Logger

	tracerProvider trace.TracerProvider // nil: no tracing
	meterProvider  metric.MeterProvider // nil: no metrics

	// maxInFlight bounds records sent and not yet answered, per publish
	// stream. Default 1024.
	maxInFlight int
	// blockOnFull: a full window blocks PublishAsync (true, the default)
	// or fails it with ErrWindowFull.
	blockOnFull bool

	// dialTimeout bounds one dial of one broker. Default 10s.
	dialTimeout time.Duration
	transport   transport.Config

	// requestTimeout bounds each shard-map fetch from one broker
	// (fetchMap). Default DefaultRequestTimeout.
	requestTimeout time.Duration

	// idempotent: publishers number their records and send again those
	// of unknown outcome (WithIdempotence), for up to retryTimeout
	// (default DefaultRetryTimeout).
	idempotent   bool
	retryTimeout time.Duration

	// backoffMin and backoffMax bound the delay between redials of a
	// broker that failed. Defaults 100ms and 5s.
	backoffMin, backoffMax time.Duration

	// homeFailover is how long the home broker may fail every dial
	// (at least homeFailoverDials of them) before the client moves its
	// home to another live broker (home.go); negative: never. Default
	// DefaultHomeFailover.
	homeFailover time.Duration

	// connIdleTimeout is how long a pooled connection to a broker other
	// than the home may go unused before the client closes it
	// (idleconns.go); negative: never. Default DefaultConnIdleTimeout.
	connIdleTimeout time.Duration
}

// Defaults of the options.
const (
	DefaultMaxInFlight = 1024
	DefaultDialTimeout = 10 * time.Second
	DefaultBackoffMin  = 100 * time.Millisecond
	DefaultBackoffMax  = 5 * time.Second
	DefaultCredit      = 1024
	// DefaultHomeFailover is how long the home broker may fail every
	// dial before the client moves its home (see [WithHomeFailover]).
	DefaultHomeFailover = 10 * time.Second
	// DefaultConnIdleTimeout is how long a connection to a broker other
	// than the home may go unused before the client closes it (see
	// [WithConnIdleTimeout]); franz-go's ConnIdleTimeout is the same.
	DefaultConnIdleTimeout = 20 * time.Second
)

// DefaultRequestTimeout is how long the client waits for a broker to
// answer a request it makes on its own behalf (see [WithRequestTimeout]).
const DefaultRequestTimeout = 3 * time.Second

func newConfig(opts []Opt) config {
	c := config{blockOnFull: true}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	if c.maxInFlight <= 0 {
		c.maxInFlight = DefaultMaxInFlight
		if c.idempotent {
			c.maxInFlight = DefaultIdempotentMaxInFlight
		}
	}
	if c.retryTimeout <= 0 {
		c.retryTimeout = DefaultRetryTimeout
	}
	if c.dialTimeout <= 0 {
		c.dialTimeout = DefaultDialTimeout
	}
	if c.requestTimeout <= 0 {
		c.requestTimeout = DefaultRequestTimeout
	}
	if c.backoffMin <= 0 {
		c.backoffMin = DefaultBackoffMin
	}
	if c.backoffMax < c.backoffMin {
		c.backoffMax = max(DefaultBackoffMax, c.backoffMin)
	}
	if c.homeFailover == 0 {
		c.homeFailover = DefaultHomeFailover
	}
	if c.connIdleTimeout == 0 {
		c.connIdleTimeout = DefaultConnIdleTimeout
	}
	return c
}

// WithCA verifies brokers against pool, the cluster CA. Verifying the
// broker is the default and required: Connect fails without WithCA or
// WithCAFile unless WithInsecure is given.
func WithCA(pool *x509.CertPool) Opt { return optFunc(func(c *config) { c.ca = pool }) }

// WithCAFile verifies brokers against the PEM CA certificate(s) in path,
// read by Connect.
func WithCAFile(path string) Opt { return optFunc(func(c *config) { c.caFile = path }) }

// WithClientCert presents cert to brokers (mutual TLS). Every broker
// requires a client certificate from the cluster CA: its common name is the
// principal the cluster authorizes. Connect fails without WithClientCert or
// WithClientCertFile.
func WithClientCert(cert tls.Certificate) Opt {
	return optFunc(func(c *config) { c.cert = &cert })
}

// WithClientCertFile presents the PEM certificate in certFile, with its
// key in keyFile, read by Connect (see [WithClientCert]).
func WithClientCertFile(certFile, keyFile string) Opt {
	return optFunc(func(c *config) { c.certFile, c.keyFile = certFile, keyFile })
}

// WithServerName sets the name every broker's certificate is verified
// against. By default it is the host part of the address dialed.
func WithServerName(name string) Opt { return optFunc(func(c *config) { c.serverName = name }) }

// WithInsecure turns OFF verification of the broker's certificate.
//
// DEVELOPMENT ONLY. With it, anyone on the network path can impersonate a
// broker, read every record and forge every ack. Never use it in
// production; use WithCA or WithCAFile with the cluster CA instead.
func WithInsecure() Opt { return optFunc(func(c *config) { c.insecure = true }) }

// WithLogger sets the logger for connection events (dials, reconnects,
// redirects); never one line per record. Default slog.Default().
func WithLogger(l *slog.Logger) Opt { return optFunc(func(c *config) { c.logger = l }) }

// WithMaxInFlight bounds the records sent on one publish stream and not yet
// acknowledged (the async publish window). Default [DefaultMaxInFlight];
// n <= 0 means the default.
func WithMaxInFlight(n int) Opt { return optFunc(func(c *config) { c.maxInFlight = n }) }

// WithBlockOnFull says what PublishAsync does when the window is full:
// block until a slot frees or its context ends (true, the default), or
// fail at once with [ErrWindowFull] (false).
func WithBlockOnFull(block bool) Opt { return optFunc(func(c *config) { c.blockOnFull = block }) }

// WithDialTimeout bounds one attempt to connect to one broker. Default
// [DefaultDialTimeout].
func WithDialTimeout(d time.Duration) Opt { return optFunc(func(c *config) { c.dialTimeout = d }) }

// WithRequestTimeout bounds each request the client makes to a broker on
// its own behalf: fetching the shard map, which a broker answers from its
// own copy (at Connect; before a publisher or subscription routes by a
// map that lacks its stream; when a broker named a newer map; after a
// subscription lost its shard's broker), and the same fetch by
// [Client.Map] and [Client.ReplicaStatus]. A broker that has not answered
// within d (one whose request handling is stuck while its connection
// still answers) counts as failed, as one that cannot be reached does:
// the map is asked from the other live brokers of the last map seen,
// each within d, and a subscription reattaches by the map it has.
// Connect, whose map fetch is best effort, returns at most d after it is
// connected. The caller's context still bounds all of it; the
// application's own admin calls (CreateStream, Streams, ...) are bounded
// by their context only. Default [DefaultRequestTimeout]; d <= 0 means
// the default.
func WithRequestTimeout(d time.Duration) Opt {
	return optFunc(func(c *config) { c.requestTimeout = d })
}

// WithTransport sets the QUIC transport settings (idle timeout, keep-alive,
// windows, frame limit). The zero Config means transport's defaults. The
// answers to admin requests, which may carry the whole shard map, are
// read up to transport.MaxMapFrame whatever the frame limit.
func WithTransport(tc transport.Config) Opt { return optFunc(func(c *config) { c.transport = tc }) }

// WithReconnect sets the capped exponential backoff between attempts to
// redial a broker that failed: the first retry waits about min, each next
// one twice as long, never more than max. Defaults [DefaultBackoffMin] and
// [DefaultBackoffMax].
func WithReconnect(min, max time.Duration) Opt {
	return optFunc(func(c *config) { c.backoffMin, c.backoffMax = min, max })
}

// WithHomeFailover sets how long the client's home broker (the one given
// to [Connect], through which publishes and admin requests go) may fail
// every dial before the client moves its home to another live broker of
// the last shard map seen: one it has a live connection to if there is
// one, else the next after the failed one in the map's order. The move
// takes two or more dials in a row that got no connection, the last d or
// more after the first (a dial cut short by its caller's context counts:
// one of a host that is gone lasts the dial timeout), so a broker that
// restarts at the same address within d stays the home. The home is dialed when something needs it (a publish,
// an admin request), so the move happens on such a dial; the publish or
// request whose dial made it goes to the new home at once. Publisher
// streams opened after the move, and admin requests, go to the new home;
// one already open stays where it is until it fails, as any does when its
// broker is lost. The client does not move back. A home that says it is
// shutting down (it closes the connection, or refuses or stops reading a
// publish stream, with shutting_down) is left at once, without waiting
// for d; for d it is not chosen as a new home, nor as the replica a
// subscription reads from while another is live. Default
// [DefaultHomeFailover]; d < 0 keeps the home for the client's life.
func WithHomeFailover(d time.Duration) Opt {
	return optFunc(func(c *config) { c.homeFailover = d })
}

// WithConnIdleTimeout sets how long the client keeps a connection to a
// broker other than its home once nothing uses it: no request in flight
// on it and no publisher stream open on it. Such connections are made
// for [Client.ReplicaStatus], for a shard map the home did not give, or
// were the home before it moved ([WithHomeFailover]). One unused for d is
// closed (within d/2 more), and the broker is dialed again when next
// needed; one to a broker that is no longer in the shard map is closed as
// soon as nothing uses it, whatever d. The home broker's connection is
// kept for the client's life, and a subscription closes each of its own
// connections once no shard of it reads over it. Default
// [DefaultConnIdleTimeout], as franz-go's ConnIdleTimeout; d < 0 keeps
// unused connections open until Close.
func WithConnIdleTimeout(d time.Duration) Opt {
	return optFunc(func(c *config) { c.connIdleTimeout = d })
}

// WithIdempotence makes every publisher of the client idempotent: it
// numbers its records itself (a random producer id per Publisher and
// shard, sequences from 1 in send order), and when a record's outcome is
// unknown — the connection or stream died, or the broker answered
// unavailable, shutting_down, timeout or internal — it sends the record
// again by itself, with the same producer id and sequence, on a new
// stream (redialing the broker as needed) before any later record. The
// shard's owner writes each (producer id, sequence) once: a retry of a
// record it had committed gets the original ack, with Ack.Duplicate set.
// So each record is committed exactly once, in the order sent, and its
// Future resolves with its ack; the application does not retry.
//
// This covers Publisher.Publish/PublishAsync and Client.Publish/
// PublishAsync. The shard of each record is picked by the client from the
// shard map (the key's hash, as the broker would). A record stays
// unresolved for at most the retry timeout ([WithRetryTimeout]): past it
// the publisher gives up on it, and it fails with an error matching
// [ErrRetriesExhausted] and [ErrConnectionLost] (outcome unknown). A
// record the broker refuses for good (payload_too_large, unauthorized,
// unknown_stream, ...) fails with that error as usual. One that fails
// with [ErrDuplicateSequence] was written once before but longer
// ago than the owner remembers acks for (the brokers' --producer-window,
// 256 by default; keep WithMaxInFlight at most that): it is in the shard
// once, its offset unknown.
//
// The brokers remember a producer for --producer-expiry (15 minutes by
// default) after its last record and across their restarts (they read
// back the end of each log); a retry later than that may be written
// twice. Unless WithMaxInFlight is given, an idempotent client keeps at
// most [DefaultIdempotentMaxInFlight] records in flight per publisher.
// WithProducer is ignored by idempotent publishers.
func WithIdempotence() Opt { return optFunc(func(c *config) { c.idempotent = true }) }

// WithRetryTimeout bounds how long an idempotent publisher (see
// [WithIdempotence]) keeps sending a record of unknown outcome again,
// counted from when its outcome first became unknown. Default
// [DefaultRetryTimeout].
func WithRetryTimeout(d time.Duration) Opt { return optFunc(func(c *config) { c.retryTimeout = d }) }

// PublishOpt configures one publish.
//
// Each option is a small value that returns the configuration it was
// given with its field set: the configuration is copied, never shared by
// pointer, so that a publish's stays on its caller's stack (through an
// interface call, a pointer to it would make it a heap allocation per
// record).
type PublishOpt interface {
	applyPublish(publishConfig) publishConfig
}

type (
	shardOpt    int32
	thenOpt     func(Ack, error)
	headersOpt  map[string]string
	producerOpt struct {
		id  string
		seq uint64
	}
)

func (o shardOpt) applyPublish(c publishConfig) publishConfig   { c.shard = int32(o); return c }
func (o thenOpt) applyPublish(c publishConfig) publishConfig    { c.then = o; return c }
func (o headersOpt) applyPublish(c publishConfig) publishConfig { c.headers = o; return c }
func (o producerOpt) applyPublish(c publishConfig) publishConfig {
	c.producerID, c.producerSeq = o.id, o.seq
	return c
}

type publishConfig struct {
	shard       int32 // -1: from the key
	headers     map[string]string
	producerID  string
	producerSeq uint64
	then        func(Ack, error)
}

// WithShard sends the record to shard n, whatever its key.
func WithShard(n int) PublishOpt { return shardOpt(n) }

// OnResolved has fn called once with the record's outcome, as soon as its
// Future resolves: with an ack or a broker's refusal, on the goroutine
// that reads the publisher's acks, in the order they arrive (no goroutine
// hand-off between the ack and fn, as with franz-go's promises); with a
// failure of the connection or the publisher, within a few milliseconds
// on the client's runner of deferred work (the one that ends producer
// spans; Close runs what it holds). fn must not block, must not
// publish on the same publisher and must not close it or the client
// (Close waits for the goroutine running fn): the acks behind it wait for
// it. It is not called when the
// publish call itself returns an error. The Future resolves first: a
// Wait on it may return just before fn is called.
func OnResolved(fn func(Ack, error)) PublishOpt { return thenOpt(fn) }

// WithHeaders attaches headers (for example a W3C traceparent) to the
// record. The map is sent as is; do not modify it until the publish
// returns.
func WithHeaders(h map[string]string) PublishOpt { return headersOpt(h) }

// WithProducer tags the record with a producer id and its sequence number
// within that producer, stored with the record and given to subscribers.
//
// With seq > 0 the publish is idempotent at the shard's owner (a
// replicated stream's leader, across failovers too): sequences
// are per producer id and shard, start at 1 and go up by one in send
// order; a sequence already committed is answered with its original ack
// (Ack.Duplicate) and not written again, and a gap is refused with
// [ErrOutOfOrderSequence]. The application then retries records
// of unknown outcome itself, in order; [WithIdempotence] does all of
// this for it. Seq 0 means not idempotent: the id is metadata only.
func WithProducer(id string, seq uint64) PublishOpt { return producerOpt{id, seq} }

// SubOpt configures a subscription.
type SubOpt interface{ applySub(*subConfig) }

type subOptFunc func(*subConfig)

func (f subOptFunc) applySub(c *subConfig) { f(c) }

type subConfig struct {
	shard       int  // -1: all shards
	one         bool // Shard(n) given: shard is n, whatever its sign
	credit      uint32
	skipCorrupt bool // see SkipCorrupt (subscribe.go)
}

// Shard subscribes to shard n only, which must be one of the stream's
// (from 0): Subscribe refuses another n with an error matching
// shardmap.ErrNoShard. By default a subscription covers every shard of
// the stream.
func Shard(n int) SubOpt { return subOptFunc(func(c *subConfig) { c.shard, c.one = n, true }) }

// Credit sets how many records each shard's broker may send ahead of the
// application, per shard. Default [DefaultCredit]. More is taken again as
// the application consumes (half the credit at a time).
func Credit(n int) SubOpt {
	return subOptFunc(func(c *subConfig) {
		if n > 0 {
			c.credit = uint32(min(n, 1<<30))
		}
	})
}

// Start says where a subscription begins: [Earliest], [Latest],
// [AtOffset] or [AtOffsets].
type Start struct {
	kind    transport.StartKind
	offset  uint64
	offsets map[int]uint64
}

// Earliest starts at the oldest record each shard still has.
func Earliest() Start { return Start{kind: transport.StartEarliest} }

// Latest starts at the next record committed after the subscription
// begins.
func Latest() Start { return Start{kind: transport.StartLatest} }

// AtOffset starts at offset n. It is for one shard: use it with Shard(s)
// or on a stream of one shard.
func AtOffset(n uint64) Start { return Start{kind: transport.StartOffset, offset: n} }

// AtOffsets starts each shard at next[shard], as returned by
// [Subscription.Next], to resume a subscription. Shards not in next start
// at the earliest record.
func AtOffsets(next map[int]uint64) Start {
	cp := make(map[int]uint64, len(next))
	for k, v := range next {
		cp[k] = v
	}
	return Start{kind: transport.StartOffset, offsets: cp}
}

func (s Start) forShard(shard int) (transport.StartKind, uint64) {
	if s.offsets != nil {
		if off, ok := s.offsets[shard]; ok {
			return transport.StartOffset, off
		}
		return transport.StartEarliest, 0
	}
	return s.kind, s.offset
}
