package broker

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"github.com/felix-broker/felix/internal/msgtrace"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
	"github.com/felix-broker/felix/wal"
)

// Latency buckets in seconds: 50µs to 10s.
var latencyBuckets = []float64{
	0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
	0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// Records-per-fsync buckets: powers of two up to wal's default MaxBatch.
var batchBuckets = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192}

// telemetry is the broker's instruments. They are created once by New; on
// the hot path they are recorded with option slices built here, so that
// recording allocates nothing. With no providers configured, tracer is nil
// and timed is false, and the publish path takes no timestamp and makes
// no telemetry call. What a publish records is built from its events in
// events.go.
type telemetry struct {
	tracer trace.Tracer          // nil: tracing off
	ids    msgtrace.Reservations // tracer takes reserved span IDs (msgtrace.IDs)
	timed  bool                  // a MeterProvider was configured: take timestamps
	node   attribute.KeyValue
	nodeID string

	currentMap func() *shardmap.Map // the broker's, for a forward's server.address

	publishDur   metric.Float64Histogram // receipt to ack, on the receiving broker
	forwardDur   metric.Float64Histogram // forward to owner's answer, by peer
	fsyncDur     metric.Float64Histogram
	batchRecords metric.Int64Histogram
	walBytes     metric.Int64Counter
	recordsOut   metric.Int64Counter
	bytesOut     metric.Int64Counter
	errors       metric.Int64Counter
	lost         metric.Int64Counter // acked records found missing when opening a shard log
	streams      metric.Int64UpDownCounter

	local, forwarded     []metric.RecordOption    // path=local|forwarded
	fromClient, fromPeer metric.MeasurementOption // source=client|peer, of the counts in
	pubStream, subStream []metric.AddOption
	reqStream            []metric.AddOption
	quietGroups          metric.MeasurementOption // state=quiet, for felix.raft.groups
	activeGroups         metric.MeasurementOption // state=active
	codes                [32][]metric.AddOption   // by transport.ErrorCode

	reg metric.Registration // observable gauges' callback

	// later runs the telemetry of answered records, off their path: when
	// the broker has answered every record it took in (open drops to 0,
	// see observe), or at its next tick under load.
	later msgtrace.Deferred
	open  atomic.Int64 // records taken in and not yet answered (telemetry on only)

	// in counts the records and payload bytes taken in, by source (0:
	// client, 1: peer): atomics on the path, reported by the callback at
	// each collection, as a Prometheus client's counters are. Two OTel
	// Adds per record (each normalizing its attribute set) took 4% of a
	// broker's CPU at 130k records/s; two atomic adds cost next to nothing.
	in struct{ records, bytes [2]atomic.Int64 }

	peers  sync.Map   // peer id → *peerMetricOpts, made once per peer
	events eventQueue // answered records' events, for the next batch (events.go)
	// spanAttrs is where endServer and endClient gather a span's
	// attributes. Only build and buildHop call them, and only from later,
	// which runs its functions one at a time; the SDK's SetAttributes
	// copies what it is given (the broker's tracer is always the SDK's).
	spanAttrs []attribute.KeyValue
}

func recordOpt(kv ...attribute.KeyValue) []metric.RecordOption {
	return []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(kv...))}
}

func addOpt(kv ...attribute.KeyValue) []metric.AddOption {
	return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(kv...))}
}

// newTelemetry creates the broker's instruments and observable gauges.
// The gauges' callback reads b, so it is registered once b is built.
func newTelemetry(b *Broker, tp trace.TracerProvider, mp metric.MeterProvider) (*telemetry, error) {
	t := &telemetry{node: msgtrace.NodeID.String(b.cfg.NodeID), nodeID: b.cfg.NodeID, currentMap: b.currentMap}
	if tp != nil {
		t.tracer = tp.Tracer(msgtrace.ScopeName)
	}
	if mp == nil {
		mp = noop.NewMeterProvider()
	} else {
		t.timed = true
	}
	m := mp.Meter(msgtrace.ScopeName)
	var errs []error
	must := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	var err error
	t.publishDur, err = m.Float64Histogram("felix.publish.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from a publish reaching this broker to its ack leaving it (path=local: this broker owns the shard; forwarded: it forwarded to the owner)."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	must(err)
	t.forwardDur, err = m.Float64Histogram("felix.forward.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from forwarding a publish to the shard's owner to the owner's answer, by peer."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	must(err)
	t.fsyncDur, err = m.Float64Histogram("felix.wal.fsync.duration", metric.WithUnit("s"),
		metric.WithDescription("Time to write and fsync one group-commit batch of a shard log, or the entries of one append of a replica."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	must(err)
	t.batchRecords, err = m.Int64Histogram("felix.wal.batch.records", metric.WithUnit("{record}"),
		metric.WithDescription("Records made durable by one fsync (group commit batch size)."),
		metric.WithExplicitBucketBoundaries(batchBuckets...))
	must(err)
	t.walBytes, err = m.Int64Counter("felix.wal.written", metric.WithUnit("By"),
		metric.WithDescription("Bytes committed to shard logs and replicas."))
	must(err)
	recordsIn, err := m.Int64ObservableCounter("felix.records.in", metric.WithUnit("{record}"),
		metric.WithDescription("Publishes received, by source (client or a forwarding peer)."))
	must(err)
	bytesIn, err := m.Int64ObservableCounter("felix.payload.in", metric.WithUnit("By"),
		metric.WithDescription("Key and value bytes of publishes received, by source."))
	must(err)
	t.recordsOut, err = m.Int64Counter("felix.records.out", metric.WithUnit("{record}"),
		metric.WithDescription("Records sent to subscribers."))
	must(err)
	t.bytesOut, err = m.Int64Counter("felix.payload.out", metric.WithUnit("By"),
		metric.WithDescription("Key and value bytes of records sent to subscribers."))
	must(err)
	forwards, err := m.Int64ObservableCounter("felix.forwards", metric.WithUnit("{record}"),
		metric.WithDescription("Publishes forwarded to the shard's owner, by peer."))
	must(err)
	t.errors, err = m.Int64Counter("felix.errors", metric.WithUnit("{error}"),
		metric.WithDescription("Error answers sent to publishers and subscribers, by wire error code."))
	must(err)
	t.lost, err = m.Int64Counter("felix.wal.lost.records", metric.WithUnit("{record}"),
		metric.WithDescription("Acknowledged records found missing when opening a shard log, by stream and shard; the shard is unavailable until its files are restored or the loss is accepted."))
	must(err)
	conns, err := m.Int64ObservableUpDownCounter("felix.connections", metric.WithUnit("{connection}"),
		metric.WithDescription("Open QUIC connections, by type (client or peer)."))
	must(err)
	t.streams, err = m.Int64UpDownCounter("felix.quic.streams", metric.WithUnit("{stream}"),
		metric.WithDescription("Open QUIC streams, by type (publish, subscribe, request)."))
	must(err)
	shardsOwned, err := m.Int64ObservableGauge("felix.shards.owned", metric.WithUnit("{shard}"),
		metric.WithDescription("Shards the current map assigns to this broker."))
	must(err)
	epoch, err := m.Int64ObservableGauge("felix.map.epoch",
		metric.WithDescription("Epoch of the shard map this broker holds."))
	must(err)
	lag, err := m.Int64ObservableGauge("felix.subscriber.lag.records", metric.WithUnit("{record}"),
		metric.WithDescription("Records committed and not yet sent to the furthest-behind subscriber, by stream and shard."))
	must(err)
	// Per owned shard, bounded by Config.ShardMetrics (see shards_metrics.go).
	shardBytes, err := m.Int64ObservableGauge("felix.shard.log.size", metric.WithUnit("By"),
		metric.WithDescription("Bytes of a shard's log files on this broker (its owner), by stream and shard."))
	must(err)
	shardNext, err := m.Int64ObservableGauge("felix.shard.next.offset",
		metric.WithDescription("The offset a shard's next record will get (one past the last), by stream and shard."))
	must(err)
	shardRecords, err := m.Int64ObservableGauge("felix.shard.records", metric.WithUnit("{record}"),
		metric.WithDescription("Records a shard's log holds (next offset minus the first retention kept), by stream and shard."))
	must(err)
	shardOmitted, err := m.Int64ObservableGauge("felix.shard.metrics.omitted", metric.WithUnit("{shard}"),
		metric.WithDescription("Owned shards left out of the per-shard gauges by the broker's --shard-metrics bound."))
	must(err)
	raftGroups, err := m.Int64ObservableGauge("felix.raft.groups", metric.WithUnit("{group}"),
		metric.WithDescription("Raft groups (replicas of replicated shards) hosted here, by state: quiet (idle: no ticks, no heartbeats) or active."))
	must(err)
	replicaLeaderless, err := m.Int64ObservableGauge("felix.replica.leaderless", metric.WithUnit("{group}"),
		metric.WithDescription("Raft groups hosted here whose replica knows no leader (an election under way, or a group that lost its quorum)."))
	must(err)
	replicaBehind, err := m.Int64ObservableGauge("felix.replica.behind", metric.WithUnit("{group}"),
		metric.WithDescription("Raft groups hosted here where this replica is not a caught-up voter: a follower behind its leader's commit, a learner or joining replica, or a failed one. Zero on every broker: every replica counts towards its group's quorum (Kafka's under-replicated partitions)."))
	must(err)
	raftSilences, err := m.Int64ObservableCounter("felix.raft.peer.silences", metric.WithUnit("{silence}"),
		metric.WithDescription("Times a peer sharing raft groups with this broker went unheard for an election timeout; its groups here were woken, to elect where it led."))
	must(err)
	parkedSyncs, err := m.Int64ObservableCounter("felix.wal.fsyncs.parked", metric.WithUnit("{fsync}"),
		metric.WithDescription("Fdatasyncs of shard logs and replicas parked on the kernel (Linux AIO) instead of blocking the broker's thread: those taken while at least four of its logs were busy, or every committer's with --parked-fsync."))
	must(err)
	quicSent, err := m.Int64ObservableCounter("felix.quic.packets.sent", metric.WithUnit("{packet}"),
		metric.WithDescription("QUIC packets the broker sent, by type of connection: client (accepted from clients) or peer (to and from other brokers); quic-go's own count, ended connections included."))
	must(err)
	quicLost, err := m.Int64ObservableCounter("felix.quic.packets.lost", metric.WithUnit("{packet}"),
		metric.WithDescription("QUIC packets the broker sent that quic-go declared lost (never acknowledged in time) and sent again, by type of connection. On loopback or a LAN this is seldom the network: a receiver (a client, or a peer broker) that fell 256 packets behind reading its connection drops what comes next."))
	must(err)
	diskFree, err := m.Int64ObservableGauge("felix.disk.free", metric.WithUnit("By"),
		metric.WithDescription("Bytes free on the filesystem of the broker's data directory, as its last check read them; below --min-free-bytes the shards it writes refuse new records."))
	must(err)
	if len(errs) > 0 {
		return nil, errs[0]
	}

	t.local = recordOpt(attribute.String("path", "local"))
	t.forwarded = recordOpt(attribute.String("path", "forwarded"))
	t.fromClient = metric.WithAttributeSet(attribute.NewSet(attribute.String("source", "client")))
	t.fromPeer = metric.WithAttributeSet(attribute.NewSet(attribute.String("source", "peer")))
	t.pubStream = addOpt(attribute.String("type", "publish"))
	t.subStream = addOpt(attribute.String("type", "subscribe"))
	t.reqStream = addOpt(attribute.String("type", "request"))
	t.quietGroups = metric.WithAttributes(attribute.String("state", "quiet"))
	t.activeGroups = metric.WithAttributes(attribute.String("state", "active"))
	for i := range t.codes {
		t.codes[i] = addOpt(attribute.String("code", transport.ErrorCode(i).String()))
	}

	quicKinds := [connKinds]metric.ObserveOption{
		kindClient: metric.WithAttributeSet(attribute.NewSet(attribute.String("type", "client"))),
		kindPeer:   metric.WithAttributeSet(attribute.NewSet(attribute.String("type", "peer"))),
	}
	t.reg, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for src, at := range []metric.MeasurementOption{t.fromClient, t.fromPeer} {
			o.ObserveInt64(recordsIn, t.in.records[src].Load(), at)
			o.ObserveInt64(bytesIn, t.in.bytes[src].Load(), at)
		}
		for kind, q := range b.quic.totals() {
			o.ObserveInt64(quicSent, int64(q.sent), quicKinds[kind])
			o.ObserveInt64(quicLost, int64(q.lost), quicKinds[kind])
			o.ObserveInt64(conns, int64(q.open), quicKinds[kind])
		}
		t.peers.Range(func(_, v any) bool {
			po := v.(*peerMetricOpts)
			o.ObserveInt64(forwards, po.forwards.Load(), po.at)
			return true
		})
		if free := b.disk.free.Load(); free >= 0 {
			o.ObserveInt64(diskFree, free)
		}
		mp := b.currentMap()
		if mp == nil {
			return nil
		}
		o.ObserveInt64(epoch, int64(mp.Epoch))
		owned := 0
		for _, st := range mp.Streams {
			for _, owner := range st.Placement.All() {
				if owner == b.cfg.NodeID {
					owned++
				}
			}
		}
		o.ObserveInt64(shardsOwned, int64(owned))
		if b.shards != nil {
			o.ObserveInt64(parkedSyncs, int64(b.shards.syncGroup.Parked()))
		}
		for id, n := range b.subs.lag() {
			o.ObserveInt64(lag, int64(n), metric.WithAttributes(
				attribute.String("stream", id.Stream), attribute.String("shard", strconv.Itoa(id.Shard))))
		}
		if limit := b.cfg.ShardMetrics; limit > 0 && b.shards != nil {
			stats, omitted := b.shards.stats(mp, limit)
			for _, st := range stats {
				at := metric.WithAttributeSet(attribute.NewSet(
					attribute.String("stream", st.id.Stream), attribute.String("shard", strconv.Itoa(st.id.Shard))))
				o.ObserveInt64(shardBytes, st.bytes, at)
				o.ObserveInt64(shardNext, int64(st.next), at)
				o.ObserveInt64(shardRecords, int64(st.records()), at)
			}
			o.ObserveInt64(shardOmitted, int64(omitted))
		}
		if b.raft != nil {
			quiet, active := b.raft.groupStates()
			o.ObserveInt64(raftGroups, int64(quiet), t.quietGroups)
			o.ObserveInt64(raftGroups, int64(active), t.activeGroups)
			o.ObserveInt64(raftSilences, int64(b.raft.silences.Load()))
			h := b.ReplicaHealth()
			o.ObserveInt64(replicaLeaderless, int64(h.Leaderless))
			o.ObserveInt64(replicaBehind, int64(h.Behind))
		}
		return nil
	}, conns, recordsIn, bytesIn, forwards, shardsOwned, epoch, lag, shardBytes, shardNext, shardRecords, shardOmitted, raftGroups, replicaLeaderless, replicaBehind, raftSilences, parkedSyncs, quicSent, quicLost, diskFree)
	if err != nil {
		return nil, err
	}
	return t, nil
}

func (t *telemetry) close() {
	t.later.Close()
	if t.reg != nil {
		t.reg.Unregister()
	}
}

// now returns the time if metrics or tracing are on, else the zero time.
func (t *telemetry) now() time.Time {
	if t.timed || t.tracer != nil {
		return time.Now()
	}
	return time.Time{}
}

func (t *telemetry) countError(code transport.ErrorCode) {
	if int(code) < len(t.codes) {
		t.errors.Add(context.Background(), 1, t.codes[code]...)
		return
	}
	t.errors.Add(context.Background(), 1, metric.WithAttributes(attribute.String("code", code.String())))
}

// countLost counts records a shard log lost (see shardSet.reportLost).
func (t *telemetry) countLost(id shardmap.ShardID, records uint64) {
	t.lost.Add(context.Background(), int64(records), metric.WithAttributes(
		attribute.String("stream", id.Stream), attribute.String("shard", strconv.Itoa(id.Shard))))
}

// shardCommits is what telemetry keeps of one shard log's commits: the
// latest, for the spans of its records, and when it ended, for their
// answer times. It belongs to the goroutine committing a batch: the log's
// OnCommit hook (onCommit) sets it, and the completions of the batch's
// records, which that goroutine runs right after, read it (stamp).
type shardCommits struct {
	last  wal.Commit
	ended time.Time // the commit's write and fsync ended; zero with telemetry off
}

// stamp records in ev the commit that made its record durable, which the
// log has just made, and takes its end as the record's answer time: the
// batch's answers follow within microseconds, and one clock read per
// commit instead of one per record saved about 1% of a broker's CPU at
// 130k records/s. A completion of the log calls it.
func (sc *shardCommits) stamp(ev *pubEvents) {
	ev.commit = sc.last
	ev.answered = sc.ended
}

// onCommit is a shard log's wal.Options.OnCommit. It keeps the commit in
// e.commits for its records, whose completions follow, and leaves
// recording it for later.
func (t *telemetry) onCommit(e *shardEntry) func(wal.Commit) {
	return func(c wal.Commit) {
		if t.tracer != nil {
			e.commits.last = c
		}
		if !t.timed && t.tracer == nil {
			return
		}
		e.commits.ended = c.Start.Add(c.Sync)
		if !t.timed {
			return
		}
		t.later.Add(func() { t.recordCommit(c.Sync, c.Records, int64(c.Bytes)) })
	}
}

// recordCommit records one write and fdatasync of a shard log or a
// replica: how long it took, the records and the bytes it made durable.
func (t *telemetry) recordCommit(d time.Duration, records int, bytes int64) {
	ctx := context.Background()
	t.fsyncDur.Record(ctx, d.Seconds())
	t.batchRecords.Record(ctx, int64(records))
	t.walBytes.Add(ctx, bytes)
}

// onReplicaSync is a replica's replica.Config.OnSync: a replicated
// shard's writes and fdatasyncs count in felix_wal_fsync_duration_seconds,
// felix_wal_batch_records and felix_wal_written_bytes_total like a shard
// log's commits (one fdatasync of a replica may cover several entries,
// each a batch: the records of all of them).
func (t *telemetry) onReplicaSync() func(time.Duration, int, int64) {
	if !t.timed {
		return nil
	}
	return func(d time.Duration, records int, bytes int64) {
		t.later.Add(func() { t.recordCommit(d, records, bytes) })
	}
}

// subRegistry tracks live subscriptions for the lag gauge.
type subRegistry struct {
	mu   sync.Mutex
	subs map[*subPos]struct{}
}

// subPos is one subscription's position: the next offset it will be sent.
type subPos struct {
	id   shardmap.ShardID
	log  shardLog
	next atomic.Uint64
}

func (r *subRegistry) add(p *subPos) {
	r.mu.Lock()
	if r.subs == nil {
		r.subs = map[*subPos]struct{}{}
	}
	r.subs[p] = struct{}{}
	r.mu.Unlock()
}

func (r *subRegistry) remove(p *subPos) {
	r.mu.Lock()
	delete(r.subs, p)
	r.mu.Unlock()
}

// lag returns, per shard with subscribers, the lag of the furthest behind.
func (r *subRegistry) lag() map[shardmap.ShardID]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[shardmap.ShardID]uint64, len(r.subs))
	for p := range r.subs {
		var n uint64
		if end, pos := p.log.NextOffset(), p.next.Load(); end > pos {
			n = end - pos
		}
		if cur, ok := out[p.id]; !ok || n > cur {
			out[p.id] = n
		}
	}
	return out
}
