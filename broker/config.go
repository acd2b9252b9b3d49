package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/felix-broker/felix/internal/msgtrace"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
	"github.com/felix-broker/felix/wal"
)

// Config configures a Broker. The zero value of every optional field means
// its documented default; New applies defaults to a copy.
type Config struct {
	// NodeID names this broker in the cluster; required.
	NodeID string
	// Listen is the QUIC address to listen on; default "127.0.0.1:7100".
	Listen string
	// Advertise is the address other brokers and clients use to reach this
	// one; default the address actually bound.
	Advertise string
	// Admin is the advertised HTTP admin address (metrics, health), if
	// any. The broker does not serve it; it registers it in the map so
	// operators' tools find it.
	Admin string
	// DataDir holds the shard logs; required.
	DataDir string
	// ServerTLS is the listener's TLS config; it must offer ALPNClient and
	// ALPNPeer and verify client certificates against the cluster CA.
	ServerTLS *tls.Config
	// PeerTLS dials other brokers (ALPNPeer) with this node's certificate.
	PeerTLS *tls.Config
	// CtlAddr is the control plane's QUIC address, or the addresses of its
	// members separated by commas (any will do; spaces around them and
	// empty entries are ignored); required.
	CtlAddr string
	// CtlTLS dials the control plane (ALPNCtl) with this node's certificate.
	CtlTLS *tls.Config
	// Transport tunes QUIC and framing.
	Transport transport.Config
	// MaxPayload is the one maximum record size: the bytes of a record's
	// key, value, headers (names and values) and producer id. Default
	// 1 MiB. A record over it is refused with payload_too_large, whatever
	// the size of the frame it came in: the broker's frame limit
	// (Transport.MaxFrame, unless set) is derived from it with
	// transport.PublishFrameLimit, a publish frame over that limit is
	// skipped and answered payload_too_large too, and one more than 4 times
	// over it closes the stream with that code. At most MaxPayloadCeiling.
	//
	// Brokers of one cluster may differ in it (a rolling change of
	// --max-record-bytes): a record is refused by the broker that stores
	// it, for that record alone, whichever broker received it. A peer's
	// forwarded publish over this broker's limit is skipped whatever its
	// size (a skipped frame holds no memory), and a raft frame from a
	// peer is taken up to what a broker of MaxPayloadCeiling sends, so a
	// follower takes the entries of a leader whose limit is larger.
	MaxPayload int
	// ForwardTimeout bounds how long a publish waits to be routed: for a
	// map as new as its sender's, for its replicated shard's leader to be
	// known and reached, for a forwarded record's answers once its
	// publisher stream ends, and for a broker still starting or draining.
	// A record forwarded on a live connection waits for its owner's
	// answer as a direct publish does (an owner whose disk hangs answers
	// nothing: the publisher's own deadline bounds that wait; at
	// replication factor 3, CommitTimeout). Default 10s.
	ForwardTimeout time.Duration
	// CommitTimeout bounds how long a record of a replicated shard waits
	// for its raft group to commit it once proposed (no majority can
	// write it, or its leader lost its quorum): then its publisher is
	// answered timeout, the outcome unknown, and the entry keeps its
	// chance to be committed. Default 10s.
	CommitTimeout time.Duration
	// LeaseTTL is the control plane lease the broker heartbeats by until
	// the control plane says its own, which it then goes by, with a
	// warning if they differ (ctlclient.MemberConfig.LeaseTTL); set it as
	// the control plane's. Default 3s, the control plane's default.
	LeaseTTL time.Duration
	// SegmentSize is the shard logs' segment size; default the wal default.
	SegmentSize int
	// ParkedSync parks every fdatasync that the committers of shard logs
	// of replication factor 1 run (wal.Options.ParkedSync). Off by
	// default: then they park only while several of the broker's logs
	// have records to commit at once (parkAtBusyLogs, wal.SyncGroup), and
	// block otherwise.
	ParkedSync bool
	// AcceptLoss names shards, as "stream/shard", whose logs may open
	// although acknowledged records are missing from them (a damaged or
	// truncated log: wal.LostRecordsError). Such a shard is otherwise
	// unavailable, with one error log line and felix.wal.lost.records
	// counting the records. Accepting continues the log past the lost
	// offsets, which are never reused and read as corrupt. An operator's
	// decision for named shards, after trying to restore their files.
	AcceptLoss []string
	// Knobs are testing knobs: tests set them, production code never does.
	Knobs Knobs
	// Logger receives one line per meaningful event; default slog.Default().
	Logger *slog.Logger
	// TracerProvider traces publishes through this broker: a server span
	// per publish received, a client span per forward, the log append and
	// the fsync it waited for. Default nil: no tracing, and the publish
	// path makes no tracing calls at all. The global provider is never
	// used implicitly.
	//
	// Spans are started and ended in batches off the publish path, except
	// that a forward needs its client span's ID before it is sent: with an
	// SDK provider built with TraceIDGenerator the broker reserves that ID
	// and starts the spans afterwards too; with any other it starts them
	// before forwarding.
	TracerProvider trace.TracerProvider
	// MeterProvider receives the broker's metrics (see the package doc).
	// Default nil: no metrics, and the publish path takes no timestamps
	// for them.
	MeterProvider metric.MeterProvider
	// ShardMetrics bounds the shards the per-shard gauges
	// (felix.shard.log.size, felix.shard.next.offset,
	// felix.shard.records, labelled stream and shard) report: the first
	// this many shards this broker owns, in stream and shard order; the
	// rest are counted in felix.shard.metrics.omitted. Three series per
	// owned shard is what a scrape then carries. Default 1024; -1 turns
	// the per-shard gauges off.
	ShardMetrics int

	// Shard logs: how many are open and how many shards are held (issue
	// 11). See "Open logs under a budget" in shards.go.

	// MaxOpenShards bounds the shard logs open at once. Logs open on first
	// use (and, while under the bound, when a map assigns the shard); to
	// open one more past the bound the broker first closes the least
	// recently used log nobody is publishing to or subscribed to, and if
	// every open log is in use the publish or subscription gets an
	// unavailable error naming the shard. An open log holds 3 file
	// descriptors (4 once it has parked an fdatasync), a goroutine, up to wal's
	// TailRecords recent records and up to a segment (SegmentSize) of
	// tidwall's in-memory tail; a log closed and opened again pays its recovery (a read of its last
	// segment) again, so set it above the shards in active use.
	// Default 1024, or a sixth of what the process's file-descriptor
	// limit (RLIMIT_NOFILE) leaves after 256 for connections, if that is
	// smaller; never below 16. LogMemory lowers it further.
	MaxOpenShards int
	// LogMemory bounds, in bytes, what the open shard logs and replicas
	// hold in memory: each holds up to its tail segment (tidwall keeps it
	// in a byte slice, up to 5/4 of SegmentSize with its growth) and its
	// tail cache (up to twice TailBytes), so at most LogMemory / that many
	// are open at once (never fewer than 16), within MaxOpenShards. With
	// the defaults that is 3.25 MiB a log and 315 logs. Default 1 GiB.
	LogMemory int64
	// MinFreeBytes is the free space the filesystem of DataDir must keep:
	// below it the broker refuses new records to the shards it writes
	// (limit_exceeded) until space is freed, so that no log meets a full
	// disk (see diskspace.go). It must cover what the broker writes in a
	// quarter of a second, between two checks. Default 256 MiB; -1 turns
	// the check off.
	MinFreeBytes int64
	// MaxShards bounds the shards this broker holds: streams are admitted
	// whole (all the shards of the stream the map assigns here) while the
	// total stays within it, in the order they appear (streams with data
	// on this broker first after a restart); a stream past it is refused
	// with one log line per map, and publishes and subscriptions to it
	// get an unavailable error. Default 16384, the control plane's default
	// MaxShardsTotal, so that a broker can hold every shard of a default
	// cluster.
	MaxShards int

	// Client resource limits: each bounds what one client can
	// make the broker hold. Past a limit the client gets a typed error on
	// the stream (limit_exceeded unless said otherwise), or a connection
	// close with that code, and the broker serves everyone else; each
	// limit hit is counted in felix_limit_hits_total{limit} and logged
	// once per principal and limit. Peers (other brokers, ALPNPeer) count
	// against none of them.

	// MaxConns bounds the client connections to this broker. Default 4096.
	MaxConns int
	// MaxConnsPerPrincipal bounds the client connections of one principal
	// (one client certificate name) to this broker. Default 64.
	MaxConnsPerPrincipal int
	// MaxStreamsPerConn bounds the open streams (publishers, subscribers,
	// requests) of one client connection; one more is answered
	// limit_exceeded and closed. Default 256. (The QUIC limit,
	// Transport.MaxIncomingStreams, is higher, for peer connections.)
	MaxStreamsPerConn int
	// FirstFrameTimeout closes a stream that has not sent its first frame
	// within it, answering timeout. Default 10s.
	FirstFrameTimeout time.Duration
	// MaxSubsPerConn bounds the subscriptions (subscriber streams) open on
	// one client connection. Default 128.
	MaxSubsPerConn int
	// MaxCredit bounds a subscription's outstanding credit, in records: a
	// Subscribe or Credit frame that would take it past the bound is
	// answered limit_exceeded and the subscription closed. Default 65536.
	MaxCredit int
	// SubscriptionBytes bounds the record bytes (keys, values, headers,
	// producer ids) a subscription reads and holds at once, which is one
	// Records frame on its way to the subscriber; a single record larger
	// than it (up to MaxPayload) is sent alone. Default 1 MiB. It is at
	// most the Records frames' limit (the larger of 4 MiB and
	// Transport.MaxFrame) less 24,725 bytes, the framing of 512 records
	// (the most one frame carries): 4,169,579 bytes under a 4 MiB limit.
	// A frame of records with many headers carries fewer records instead;
	// a record too large for any frame (stored while MaxPayload was
	// larger) ends the subscription with payload_too_large naming its
	// offset.
	SubscriptionBytes int
	// SubscriptionBytesPerPrincipal bounds those bytes over all the
	// subscriptions of one principal: a subscriber that does not read
	// keeps its frame, and its principal's other subscriptions wait for
	// room. It is at least max(SubscriptionBytes, MaxPayload). Default
	// 64 MiB.
	SubscriptionBytesPerPrincipal int
	// PublishInFlight bounds the records one publisher stream may have
	// taken in whose answer (ack or error) has not been written to the
	// stream yet: past it the broker stops reading the stream, which
	// pushes back on the publisher through QUIC flow control, so a
	// publisher that does not read its acks holds at most this many.
	// Default 4096.
	PublishInFlight int
	// PublishBytesPerPrincipal bounds, over all the publisher streams of
	// one principal, the bytes of records taken in and not answered (each
	// counts its frame, which its fields keep alive, or its fields if they
	// are larger once scoped) plus 512 bytes per record whose answer is
	// not written yet; past it the
	// broker stops reading those streams until answers are written. It is
	// at least MaxPayload + 512. Default 64 MiB.
	PublishBytesPerPrincipal int
	// MaxHeaders bounds the headers of one record; a record with more is
	// refused with invalid before it is buffered. Default 64.
	MaxHeaders int
	// MaxHeaderBytes bounds the bytes of one record's header names and
	// values; a record with more is refused with payload_too_large. It
	// counts toward MaxPayload as well. Default 16 KiB.
	MaxHeaderBytes int
	// TailBytes bounds the recent records each shard log, and each
	// replica of a replicated shard, keeps in memory for live subscribers
	// (wal.Options.TailBytes, replica.Config.TailBytes). Default 1 MiB.
	TailBytes int
	// RetentionCheck is how often retention passes run over the shard
	// logs of streams with a retention limit: each open log's own
	// (package wal), one pass over every hosted replica (replicated
	// shards), and the sweep of the logs closed for MaxOpenShards, which
	// opens, within the budget, those whose oldest segment has expired
	// (and, once, those not opened since the broker started) for a pass
	// (see "Retention of closed logs" in shards_retention.go). Default 10s.
	RetentionCheck time.Duration

	// Replicated shards (streams of replication factor 3, see
	// replicated.go).

	// RaftTick is the interval of the one ticker that ticks every raft
	// group this broker hosts. Default 100ms.
	RaftTick time.Duration
	// RaftElectionTicks is the ticks a follower waits without hearing
	// from a leader before it campaigns (raft randomizes it up to twice
	// that): with the defaults a leader lost is replaced within 1 to 2 s
	// plus an election round trip. Default 10.
	RaftElectionTicks int
	// ReadyReplicaWait bounds how long after Start readiness waits for
	// the replicas this broker hosts to catch up with their leaders (see
	// "Replica health" in replicahealth.go): past it the broker is ready
	// however far behind they are. Negative: readiness does not wait for
	// them. Default DefaultReadyReplicaWait (2m).
	ReadyReplicaWait time.Duration

	// Idempotent publish: what each shard's owner remembers of the
	// producers publishing to it with a ProducerID and a ProducerSeq, to
	// write each of their records once however often it is retried (on a
	// replicated shard, every replica remembers it). See "Idempotent
	// publish" in producers.go.

	// MaxProducers bounds the producers each open shard log remembers;
	// past it the least recently used one with nothing in flight is
	// forgotten (its next record is refused unknown_producer unless it is
	// sequence 1, which is written, a retry of its first record included;
	// the SDK goes on under a new producer id, which may write a record
	// again). Default 10,000.
	MaxProducers int
	// ProducerExpiry is how long a shard remembers a producer that
	// publishes nothing to it: a retry later than this after the
	// producer's last record is written again. Default 15 minutes.
	ProducerExpiry time.Duration
	// ProducerWindow is how many of each producer's most recent records
	// a shard remembers the acks of: a retry of one of them gets its
	// original ack (offset and all); a retry of an older one gets
	// duplicate_sequence (written once, offset no longer known). Keep it
	// at least the SDK's in-flight window for idempotent publishers.
	// Default 256 (16 bytes each).
	ProducerWindow int
	// ProducerRebuildBytes bounds how much of the end of a shard's log is
	// read to rebuild its producers when the log is opened (after a
	// restart, say): the scan goes back from the newest record until a
	// record older than ProducerExpiry, this many bytes of records (keys,
	// values, headers, producer ids), MaxProducers producers or the first
	// record. Producers seen only before that are unknown after the
	// restart. Default 64 MiB. (A replica of a replicated shard learns
	// them from its whole committed log, which raft applies again when it
	// opens.)
	ProducerRebuildBytes int64
}

// Defaults of the client resource limits, as documented on Config.
const (
	DefaultMaxConns                      = 4096
	DefaultMaxConnsPerPrincipal          = 64
	DefaultMaxStreamsPerConn             = 256
	DefaultFirstFrameTimeout             = 10 * time.Second
	DefaultMaxSubsPerConn                = 128
	DefaultMaxCredit                     = 65536
	DefaultSubscriptionBytes             = 1 << 20
	DefaultSubscriptionBytesPerPrincipal = 64 << 20
	DefaultPublishInFlight               = 4096
	DefaultPublishBytesPerPrincipal      = 64 << 20
	DefaultMaxHeaders                    = 64
	DefaultMaxHeaderBytes                = 16 << 10
)

// MaxPayloadCeiling is the most MaxPayload may be, on any broker: 32 MiB.
// Every broker takes raft frames from its peers up to what a broker of
// this limit sends (raftFrameLimit), so the ceiling bounds what a peer
// can make it buffer for one frame; a raft entry of a record this large
// still fits what a broker queues for one peer (raftQueueBytes).
const MaxPayloadCeiling = 32 << 20

// withLimitDefaults applies the defaults of the client resource limits and
// derives the frame limit from the record limit. MaxPayload is set.
func (c Config) withLimitDefaults() Config {
	setDefault(&c.MaxConns, DefaultMaxConns)
	setDefault(&c.MaxConnsPerPrincipal, DefaultMaxConnsPerPrincipal)
	setDefault(&c.MaxStreamsPerConn, DefaultMaxStreamsPerConn)
	if c.FirstFrameTimeout <= 0 {
		c.FirstFrameTimeout = DefaultFirstFrameTimeout
	}
	setDefault(&c.MaxSubsPerConn, DefaultMaxSubsPerConn)
	setDefault(&c.MaxCredit, DefaultMaxCredit)
	setDefault(&c.PublishInFlight, DefaultPublishInFlight)
	setDefault(&c.PublishBytesPerPrincipal, DefaultPublishBytesPerPrincipal)
	c.PublishBytesPerPrincipal = max(c.PublishBytesPerPrincipal, c.MaxPayload+ackReserve)
	setDefault(&c.MaxHeaders, DefaultMaxHeaders)
	setDefault(&c.MaxHeaderBytes, DefaultMaxHeaderBytes)
	if c.Transport.MaxFrame <= 0 {
		c.Transport.MaxFrame = transport.PublishFrameLimit(c.MaxPayload, c.MaxHeaders)
	}
	setDefault(&c.SubscriptionBytes, DefaultSubscriptionBytes)
	c.SubscriptionBytes = min(c.SubscriptionBytes, maxSubscriptionBytes(c))
	setDefault(&c.SubscriptionBytesPerPrincipal, DefaultSubscriptionBytesPerPrincipal)
	c.SubscriptionBytesPerPrincipal = max(c.SubscriptionBytesPerPrincipal, c.SubscriptionBytes, c.MaxPayload)
	return c
}

// recordsFrameLimit is the frame limit of the Records frames a broker of
// c writes: its own, and at least the SDK's default (a broker whose
// records are small still sends many in a frame).
func recordsFrameLimit(c Config) int { return max(c.Transport.MaxFrame, transport.DefaultMaxFrame) }

// maxSubscriptionBytes is the most SubscriptionBytes can be for a frame
// of that many bytes of records in maxRecordsPerFrame records, with no
// headers, to fit the frame limit, whatever the stream's name. (Records
// with many headers can still go over: the subscription sends fewer of
// them in a frame.)
func maxSubscriptionBytes(c Config) int {
	return transport.RecordsRoom(recordsFrameLimit(c), "") - shardmap.MaxStreamName -
		maxRecordsPerFrame*transport.RecordLen(0, 0)
}

// withProducerDefaults applies the defaults of the idempotent-publish
// bounds.
func (c Config) withProducerDefaults() Config {
	setDefault(&c.MaxProducers, DefaultMaxProducers)
	setDefault(&c.ProducerWindow, DefaultProducerWindow)
	if c.ProducerExpiry <= 0 {
		c.ProducerExpiry = DefaultProducerExpiry
	}
	if c.ProducerRebuildBytes <= 0 {
		c.ProducerRebuildBytes = DefaultProducerRebuildBytes
	}
	return c
}

func (c Config) producerLimits() producerLimits {
	c = c.withProducerDefaults()
	return producerLimits{max: c.MaxProducers, expiry: c.ProducerExpiry, window: c.ProducerWindow, rebuildBytes: c.ProducerRebuildBytes}
}

func setDefault(v *int, def int) {
	if *v <= 0 {
		*v = def
	}
}

// minLeaseTTL is the shortest LeaseTTL a broker takes.
const minLeaseTTL = 30 * time.Millisecond

// ctlAddrs returns the addresses CtlAddr lists, each trimmed of spaces,
// without empty entries: "ctl-0:7000, ctl-1:7000," names two.
func (c Config) ctlAddrs() []string {
	var addrs []string
	for a := range strings.SplitSeq(c.CtlAddr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	return addrs
}

func (c Config) withDefaults() (Config, error) {
	if c.NodeID == "" {
		return c, errors.New("broker: config: NodeID is required")
	}
	if c.DataDir == "" {
		return c, errors.New("broker: config: DataDir is required")
	}
	if len(c.ctlAddrs()) == 0 {
		return c, fmt.Errorf("broker: config: CtlAddr is required (got %q)", c.CtlAddr)
	}
	if c.ServerTLS == nil || c.PeerTLS == nil || c.CtlTLS == nil {
		return c, errors.New("broker: config: ServerTLS, PeerTLS and CtlTLS are required")
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:7100"
	}
	if c.MaxPayload == 0 {
		c.MaxPayload = 1 << 20
	}
	if c.ForwardTimeout == 0 {
		c.ForwardTimeout = 10 * time.Second
	}
	if c.CommitTimeout <= 0 {
		c.CommitTimeout = 10 * time.Second
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 3 * time.Second
	}
	if c.LeaseTTL < minLeaseTTL {
		// Heartbeats go every LeaseTTL/3: 0 there panics a ticker.
		return c, fmt.Errorf("broker: config: LeaseTTL %v is under %v (set it as the control plane's, 3s by default)", c.LeaseTTL, minLeaseTTL)
	}
	if c.MaxPayload < 0 {
		return c, fmt.Errorf("broker: config: MaxPayload %d is negative (0 means the default, 1 MiB)", c.MaxPayload)
	}
	if c.MaxPayload > MaxPayloadCeiling {
		return c, fmt.Errorf("broker: config: MaxPayload %d is over MaxPayloadCeiling, %d (32 MiB): every broker takes its peers' raft entries up to that size, whatever its own limit", c.MaxPayload, MaxPayloadCeiling)
	}
	c = c.withLimitDefaults() // before the transport's: it derives MaxFrame
	c.Transport = c.Transport.WithDefaults()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ShardMetrics == 0 {
		c.ShardMetrics = DefaultShardMetrics
	}

	// Shard logs (issue 11).
	if c.MaxOpenShards <= 0 {
		c.MaxOpenShards = defaultMaxOpenShards()
	}
	if c.LogMemory <= 0 {
		c.LogMemory = DefaultLogMemory
	}
	if c.MinFreeBytes == 0 {
		c.MinFreeBytes = DefaultMinFreeBytes
	}
	c.MaxOpenShards = min(c.MaxOpenShards, openByMemory(c.LogMemory, c.SegmentSize, c.TailBytes))
	if c.MaxShards <= 0 {
		c.MaxShards = DefaultMaxShards
	}
	c = c.withProducerDefaults()
	if c.RaftTick <= 0 {
		c.RaftTick = 100 * time.Millisecond
	}
	if c.RaftTick < time.Millisecond {
		// Every replicated shard's group ticks on it.
		return c, fmt.Errorf("broker: config: RaftTick %v is under 1ms", c.RaftTick)
	}
	if c.RetentionCheck <= 0 {
		c.RetentionCheck = 10 * time.Second
	}
	if c.RaftElectionTicks <= 0 {
		c.RaftElectionTicks = 10
	}
	if c.ReadyReplicaWait == 0 {
		c.ReadyReplicaWait = DefaultReadyReplicaWait
	}
	return c, nil
}

// DefaultShardMetrics is Config.ShardMetrics's default.
const DefaultShardMetrics = 1024

// TraceIDGenerator returns the ID generator to build a TracerProvider
// with (sdktrace.WithIDGenerator), so that a forwarding broker can reserve
// span IDs and keep span work off the forward path. It generates random
// IDs like the SDK's default.
func TraceIDGenerator() sdktrace.IDGenerator { return msgtrace.IDs{} }

// Knobs are the broker's testing knobs (Config.Knobs). The zero value is
// production behaviour.
type Knobs struct {
	// WALFS is the filesystem seam under every shard log (wal.Options.FS),
	// for injecting write and fsync faults. Default nil: the OS.
	WALFS wal.FS
	// RouteMap, if set, is given the map each publish is about to be
	// routed by and returns the one to route it by instead: a seam that
	// makes a map change land between a forward and its commit. Default
	// nil: the current map (the publish path pays one nil check).
	RouteMap func(current *shardmap.Map) *shardmap.Map
	// DialPeer, if set, runs before a forwarding lane dials its owner
	// (once per lane, never per record); an error fails the dial. A test
	// blocks it to hold one lane connecting. Default nil.
	DialPeer func(ctx context.Context, nodeID string) error
	// NoQuiesce keeps idle raft groups ticking and heartbeating (no
	// quiescence, raft.go), for a benchmark to compare. Default false.
	NoQuiesce bool
	// ReplicaBeforeSync, if set, runs before each fdatasync of a
	// replica's appended entries (replica.Knobs.BeforeSync); an error
	// fails the fdatasync, and the group. Default nil.
	ReplicaBeforeSync func(id shardmap.ShardID, last uint64) error
	// FreeBytes, if set, replaces the statfs of the data directory that
	// the free-space check reads (diskspace.go). Default nil.
	FreeBytes func(dir string) (int64, error)
	// RaftSimplex makes this broker's raft streams one-way, as an earlier
	// version's were: its streams do not say Duplex and it reads nothing
	// back on them, and it adopts no peer's stream. For a test of a
	// mixed pair during a rolling upgrade. Default false.
	RaftSimplex bool
	// HandLeadersBack, if set, is asked before each round that hands
	// leaderships back to their owners (preferOwners, every 50 raft
	// ticks); false skips the round. A test holds a moved leadership
	// where it moved. Default nil: every round runs.
	HandLeadersBack func() bool
	// Now, if set, is the broker's wall clock: what shard logs and
	// replicas stamp records with (wal.Options.Now, replica.Knobs.Now),
	// and what the idempotent producer tables date those stamps by
	// (producers.go). Durations the broker measures (routing deadlines,
	// producer expiry) are on the monotonic clock and never read it.
	// Default nil: time.Now.
	Now func() time.Time
}
