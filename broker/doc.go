// Package broker owns one Felix broker: its client and peer sessions, the
// publish path (append locally when this node owns the shard, forward to the
// owner when it does not), the subscribe path (replay from the log, then
// live tail under credit-based flow control), the shard logs it owns, and the
// pool of peer connections it forwards over.
//
// A broker obeys the shard map the control plane pushes (see package ctl);
// it never computes ownership itself. It must never acknowledge a record
// before the owning broker's log has fsynced it.
//
// # Streams on a connection
//
// Every interaction is one bidirectional QUIC stream; the first frame a peer
// sends on it decides what it is:
//
//   - Publish: a publisher stream. Many pipelined Publish frames; one Ack or
//     Error per frame, matched by Seq. Records of one stream bound for one
//     shard are committed in the order sent, also through a forwarding hop.
//     A Publish frame over the record limit, the first included, is skipped
//     and refused payload_too_large alone; from a forwarding peer (whose
//     limit may be larger) whatever its size.
//   - Subscribe: one shard of one stream, from earliest, latest or an offset.
//     A broker that does not own the shard answers NotOwner naming the owner
//     (a redirect the SDK follows). It sends Records frames within the
//     credit granted (the Subscribe frame's, then Credit frames), each
//     within the frame limit: SubscriptionBytes leaves room for the framing
//     of a frame's 512 records, and records whose framing is more (many
//     headers) go in the next frame. A subscriber that closes its side
//     (FIN) grants no more and is still sent what it granted; the broker
//     then closes the stream. A reset, the subscriber's connection ending,
//     or a frame other than Credit ends the subscription at once. One that
//     cannot go on ends with an Error frame, never by skipping a record: a
//     record too large for any frame (stored while MaxPayload was larger)
//     is payload_too_large with its offset in From and To.
//   - Request: one admin request and its Response; map.get is answered from
//     the broker's map, the rest are relayed to the control plane. An
//     answer may carry the whole map and goes up to transport.MaxMapFrame,
//     the control plane's own bound on maps, not the frame limit of what
//     clients send; one over it is logged and answered frame_too_large.
//
// Peers (other brokers, ALPN felix-peer/1, mTLS with node certificates) open
// publisher streams to forward records; the owner treats them like a client
// stream except that it checks the forwarder's map epoch (fencing).
//
// # Goroutines of the publish path
//
// Each piece of a publisher stream's state has one owner, and no lock is
// held across anything that can block (a wait for a map, a dial, a
// stream opening, a flow-controlled write, an fsync):
//
//   - The session's reader (servePublish, one per publisher stream) owns
//     the stream's read side and the authorization cache. It takes each
//     record in (a slot of Config.PublishInFlight and the principal's
//     bytes: the only waits that hold it back, and they are the
//     publisher's own flow control), routes it by the map and either
//     appends it to the local log (committing it inline with AppendNow
//     when nothing more is buffered and the log is idle) or puts it on
//     the lane to its owner. A reader waits for a map only for a record
//     whose sender has seen a newer one than this broker holds: a
//     forward carrying a newer epoch (at most ForwardTimeout for an epoch
//     the control plane cannot give, and the records needing it that
//     follow within ForwardTimeout fail at once), or a client's record
//     picked by a newer incarnation of its stream (every client's such
//     waits share one catch-up at a time: catchup.go). A peer's wait
//     holds back that forwarding lane, and
//     what the forwarder sends on it meanwhile counts against the flow
//     window of the pair's one connection, which the pair's other lanes
//     and raft share: a few lanes waiting at once can hold those back
//     too, for as long.
//   - A shard's committer (package wal) owns the log's write side; it
//     calls each record's completion, which writes the answer. While it
//     runs a commit's completions it corks each publisher stream it
//     answers on, and uncorks them after the last (wal's Answered hook):
//     a commit's acks go to quic-go in one write per stream, not one per
//     record, on the committer's goroutine still (no hand-off added).
//   - A lane (forward.go, one per session and owner) has a connector
//     goroutine that gets the peer's pooled connection (dialed, when
//     there is none, by one goroutine of the pool per peer, which the
//     pool's close cancels: no lane's end fails the others waiting for
//     it) and opens the lane's stream while forwards
//     routed meanwhile wait in its writer's backlog, in order; then it
//     writes that backlog, starts the lane's reader, and ends. An owner
//     that stops reading as it shuts down makes the lane drain: it takes
//     no more forwards, and its reader relays the owner's answers until
//     the owner ends the stream (a timer, counted with the session's
//     workers, ends the drain after ForwardTimeout); the forwards still
//     unanswered when the owner ends its stream (its FIN, written only
//     once it answered all it took in) were never read, and fail
//     shutting_down, not written. A lane leases its
//     pooled connection (peerPool.lease, under the pool's mutex, never
//     across a dial; an overflow connection to the same peer once the
//     pooled one carries as many lanes as the peer lets it open streams,
//     closed when its last lane leaves) and gives it back when it ends;
//     one that read to the
//     end of the owner's stream retires the connection, and the last such
//     lane hangs it up, which the shutting-down owner waits for before it
//     closes its connections (lingerForAnswers). The reader
//     owns the lane's read side: it relays each Ack to the publisher
//     (corking the publisher's stream while more answers are buffered, so
//     answers that arrived together go out in one write) and hands a
//     NotOwner refusal to the session's retrier, never waiting for a map
//     or a lock held across one.
//   - The retrier (one per session, running only while records wait to
//     be routed again) catches up to the refusing owner's map and routes
//     each shard's waiting records again, in the order received, once
//     nothing of that shard is unanswered on another route (order.go).
//   - An idempotent retry of a replicated shard's record that is still in
//     flight waits in the shard's producer table for the original's fate,
//     with a timer (producers.go, boundWait) that answers it timeout after
//     CommitTimeout and takes it back from the table; whichever of the two
//     takes it from the table answers it, and the outcome stops the timer.
//   - A frameWriter (acks.go) serializes the frames written on one
//     stream: answers on the publisher stream, forwards on a lane.
//     TryWriteAll queues a frame in quic-go's send buffer without
//     blocking; only while the flow-control window is full does a
//     flusher goroutine write the backlog with blocking writes.
//
// The mutexes on the path, each held for memory operations only: the
// session's lanes (lookup or insertion of a lane, which is opened without
// waiting for it) and its routes and waiting records (order.go); a lane's pending forwards; a
// frameWriter's buffers (encoding and a non-blocking TryWriteAll; the
// flusher writes with it released); the principal's byte budget; the
// shard set's index (an RLock), a shard's producer table, and, only for a
// forward carrying a newer epoch than this broker holds, the last missed
// catch-up, and for a client's record picked by a newer incarnation of
// its stream, the clients' catch-up in flight (catchup.go: each read and
// written around the wait, never across it). How to check
// it: every blocking call on the path (member.Refresh, peerPool.conn,
// OpenStreamSync, quic Stream.Write, wal's fsync) is made by a goroutine
// that holds none of them (the reader, the connector, the retrier, a
// flusher, the committer), which reading forward.go, publish.go and
// acks.go shows, and TestAcksFlowWhileALaneConnects holds one lane's dial
// open (Config.Knobs.DialPeer) and shows that the same stream's records
// for other shards are still read, committed and acknowledged meanwhile.
//
// # Hand-offs per path
//
// A hand-off is one goroutine waking another. quic-go's connection loop
// receives and sends each connection's packets, so a frame read wakes it
// and then the reading goroutine, and a frame written wakes it.
//
// A thread woken costs more than a goroutine: on a VM, an interrupt to an
// idle vCPU. Besides the hand-offs below, the Go runtime woke one per idle
// spell: its sysmon parks when every P is idle, and the next syscall
// wakes it. `felix broker` runs with sysmon kept awake (package sysmon),
// which took the forwarding hop from 1.25-1.36 round trips to 0.41-0.76
// (docs/performance.md, "Idle CPUs and the Go runtime's sysmon").
//
// Direct (the client's broker owns the shard), before and after issue 13:
// quic-go loop → session reader, which appends and, with the log idle and
// nothing more buffered, fsyncs and writes the ack itself → quic-go loop.
// One Felix goroutine; under load the reader queues and the shard's
// committer fsyncs and writes the ack: two. The committer's fdatasync of
// a batch of fewer than 16 records hands its P to the rest of the broker
// for the call (the network input, the other shards), as does the
// reader's inline one while another of the broker's logs is busy; a lone
// record on an idle broker keeps the P (handing it on costs a thread
// wake-up), and so does a larger batch (the broker is busy, and its acks
// would wait for the P to come back; wal's tailSync). While four or
// more of the broker's logs and replicas are busy (wal.SyncGroup,
// parkAtBusyLogs) a committer's fdatasync is parked on the kernel
// instead, and its completion wakes the committer again through Go's
// poller: no goroutine more, one wake-up more per batch, no thread
// blocked; the group costs an atomic load per batch and an atomic add
// when a log turns busy or idle, no lock. Locks per record: the slot
// (a channel), the principal's budget, the shard index, the log's queue,
// the ack writer. Before, the reader also took dispatchMu and swapped a
// test seam's atomic pointer (a shared cache-line write) per record;
// now it pays one nil check (Config.Knobs.RouteMap).
//
// Forwarded (client → forwarder F → owner O → F → client), before and
// after: F's reader → quic-go (F→O) → O's peer-stream reader (→ O's
// committer under load) → quic-go (O→F) → F's lane reader → quic-go
// (F→client): three Felix goroutines (four under load), the fewest with
// blocking stream reads, since each of the three streams needs a reader.
// What changed is what they hold and wait for. Before: F's reader took
// dispatchMu and, under it, could wait for a map refresh (up to
// ForwardTimeout), a dial and stream opening (up to 3 s) and a
// flow-controlled write to O; O's reader did its appends under its own
// dispatchMu; F's lane reader, on a NotOwner, waited for a refresh and
// then for dispatchMu, so every ack on that lane waited behind the
// reader's dial or write. After: F's reader puts the forward on the lane
// with a non-blocking write (or in the backlog of a lane still
// connecting or with a full window) and holds no lock beyond that;
// F's lane reader takes the pending forward, writes the answer with a
// non-blocking write, and hands refusals to the retrier; O's reader holds
// no lock while it appends or fsyncs. Locks per forwarded record at F:
// slot, budget, lanes, the lane's pending map (twice: add, take), the
// lane's writer and the ack writer; none is held across a wait.
//
// Re-routed after NotOwner: before, F's lane reader refreshed and
// re-dispatched itself (stalling that lane's acks); now the lane reader
// queues the refusal → retrier (one hand-off, only on a map change) →
// the retrier refreshes and routes it again like the reader would.
//
// Order across a re-route (order.go): a session keeps each shard's
// unanswered records on one route at a time (one lane, or this broker's
// own replica). A record refused, or waiting for a leader, waits with
// the records of its shard that came after it, in the order received,
// and the retrier routes them oldest first once nothing of the shard is
// unanswered elsewhere; a record routed by a newer map to another owner
// while earlier ones are unanswered on the old route waits the same way.
// Before, a record the reader routed by the new map could overtake a
// refused one of its shard (TestRerouteKeepsOrder and
// TestReplicatedOrderAcrossLeaderChanges fail without it). A waiting
// record whose successor an owner acknowledged meanwhile (one that
// refused a record and then took the next) fails unavailable, nothing
// written, rather than be committed out of order. The cost on the hot
// path: a forwarded or replicated record takes the session's route lock
// twice (routed, answered); a record of replication factor 1 appended
// here loads one atomic counter.
//
// # Replicated shards (replication factor 3)
//
// A shard of a stream with Replicas 3 is a raft group on the three brokers
// of its replica set; each hosts its replica (a replica.Group) in the
// shard's data directory, opened when a map assigns it and kept open
// (replicated.go). The publish and subscribe paths use one interface,
// shardLog, for a *wal.Log or a *replica.Group; for replication factor 1
// the publish path pays one integer comparison (StreamConfig.Replicas) per
// record and is otherwise unchanged. Where a record goes, and what happens
// while no leader is known, is in replicated.go; how raft messages travel
// (one stream per pair of brokers, written by the groups themselves, the
// sender checked against its certificate) in raft.go; a lost replica
// rejoining in rejoin.go, and a replica moved to another broker in
// moves.go.
//
// Goroutines added: per broker, raftNet's ticker (ticks every hosted group
// each Config.RaftTick, has each peer's stream carry a keep-alive frame when
// its stream was idle that tick, and wakes the quiet groups of a peer that
// fell silent or came back: raft.go), the shard set's sweep of the closed
// logs of replication factor 1 due for retention (shards_retention.go,
// stopped by the shard set's close), its retention pass (runRetention:
// each Config.RetentionCheck, applies every hosted replica's retention,
// one after the other, and replaces a replica whose group failed:
// shardSet.replaceFailed) and one goroutine per peer it sends raft
// messages to (raftpeer.go: it opens that raft stream, and opens it again
// after a failure; the groups queue their messages on it without
// blocking, and a flusher writes only while its flow-control window is
// full); per raft stream a peer opened, its reader
// (serveRaft, a stream goroutine like a publisher's), which hands each
// message to its group's Step without waiting, and per raft stream this
// broker opened, its reader (raftPeer.read: a pair's stream carries
// both directions, so that one QUIC connection per pair carries its
// raft traffic and each side's messages acknowledge the other's packets;
// measured, 8.1-8.5 packets per replicated record on the peer
// connections instead of 10.6); per hosted group, the
// group's own goroutine (package replica), which owns the RawNode and
// the log, and calls each record's completion, which writes the ack; per
// replica that replaces a lost one or was moved here, until it is a
// voter, its join
// goroutine (rejoin.go: asks the leader to admit it). All are stopped by
// Close: the peers' goroutines, ticker, retention pass and joins by
// raftNet.close (a join also when its group is unregistered), the readers
// with the connections, the groups when their shard set closes.
//
// Hand-offs, client → leader L (direct), with followers F1, F2: L's
// session reader → L's group goroutine (proposes, queues the append to F1
// and F2 on their raft streams itself, then writes and fsyncs its entry)
// → quic-go → F's raft stream reader → F's group goroutine (appends,
// fsyncs, queues its answer itself) → quic-go → L's raft stream reader →
// L's group goroutine (commits, applies, assigns offsets, calls the
// completions) → quic-go (the ack). Four Felix goroutines on the leader
// (the group's twice) and two on each follower per round, against one or
// two for R=1; under load each round carries a whole batch of records.
// Before, a sender goroutine per peer wrote the raft streams: one more
// hand-off on the leader and on each follower per round. Through a
// forwarder (or a follower) the forwarding hop of R=1 comes first. The
// leader's own fsync runs in parallel with the followers' (raft's appends
// are queued before the write, see package replica). Once a round
// commits, raft also tells each follower how far (an append without
// entries): those go after the round's acks, and the group yields before
// queuing them, so that on a broker with one P the acks' connection loop
// sends first; before, the acks' packets waited behind the two sends to
// the followers (R=3 direct p50 6.6% lower, forwarded 4.0%, A/B). A
// follower's answer goes as soon as its entries are durable, before the
// hard state is written when only the commit index changed in it.
//
// # Identity and authorization
//
// Every connection is mutual TLS with a certificate from the cluster CA;
// its role decides what it may be. On the client protocol the peer must
// hold a client certificate, whose common name is the principal; on the
// peer protocol a broker's node certificate, whose node id is the only
// name it may forward in (Publish.Via). Each publish, subscribe and map
// read is authorized for the principal under the policy carried by the
// current shard map (see package auth) at this broker, before anything
// is routed; a publisher stream caches the decision for its stream and
// map epoch, so the check costs a comparison per record. Admin requests
// are relayed to the control plane with the principal, which authorizes
// it there. Denials are unauthorized errors, logged once per principal,
// action and stream. A stream name no stream can have
// (shardmap.ValidateStreamName) is refused invalid before it is
// authorized, so what a denial keeps, logs and answers holds at most
// shardmap.MaxStreamName bytes of a name.
//
// A certificate on the cluster's revocation list (Config.Transport.Revocations,
// which `felix broker` sets from crl.pem in its --certs directory, see
// transport.WatchCRL) is refused by the listener right after its
// handshake with unauthorized, before the broker sees the connection; a
// client's, a peer's and the control plane's alike, and so are the
// brokers and control planes this broker dials. A connection up when a
// reload of the list revokes its certificate is closed with
// unauthorized.
//
// # Limits
//
// What one client can make a broker hold is bounded (see the limit
// fields of [Config]): connections in their handshake (the listener's:
// Transport.MaxHandshakes, with a QUIC Retry asked of new clients past
// Transport.RetryHandshakes, see transport.Listen), connections in
// total and per principal, streams and subscriptions per connection,
// the first frame's deadline, credit and bytes per subscription and
// per principal, unanswered records per publisher stream and publish
// bytes per principal, header count and size, one record size (with
// the frame limit derived from it), the in-memory tail per shard, and
// shard logs open at once and owned (open logs capped by count and by
// the bytes they hold: Config.LogMemory).
//
// A subscription behind its shard's in-memory tail reads the segment
// files by position (wal.Reader, on a log of replication factor 1): about
// the bytes it is sent, whatever its credit, however many subscriptions
// catch up in other parts of the log at once. (Log.Read loads a whole 1
// MiB segment into a cache of two: four subscriptions at credit 1 in
// different old segments cost a segment read per record.) Between reads
// its log reader holds its position only, 80 bytes (the Reader and its
// method value), and the subscription's stream drops its frame buffers
// while it waits for credit or records (transport.Writer.Release; its
// credit grants are read with a 64-byte buffer): an idle subscription
// costs its QUIC stream and two goroutines, about 18 KB with the
// client's side (TestIdleSubscriptionHoldsItsPositionOnly); during one, what the read returns
// (charged to SubscriptionBytesPerPrincipal) and at most one partial
// entry per 64 KiB read; finding its place in a segment (a new
// subscription, or one the tail left behind) reads the segment up to it
// once, through a 64 KiB buffer. So a broker's subscriptions' log
// readers hold at most MaxConns x MaxSubsPerConn x 80 bytes between reads
// (40 MiB at the defaults), one principal's MaxConnsPerPrincipal x
// MaxSubsPerConn x 80 (640 KiB), their streams and goroutines about
// 200 times that, and each shard log at most three open files for them
// (tidseg.FilesMax: a read that needs a fourth waits for one to close).
// A subscription of a replicated shard reads its replica's raft log alike
// (replica.Reader): one entry (a group-commit batch) is read whole, and
// the Reader keeps what the read left of it for the next read, at most 16
// KiB per subscription and 1 MiB over all the subscriptions of a replica
// (past it they keep nothing and read an entry again for each read of
// it), beside its position (a Reader is 120 bytes, 144 with its method
// value); each replica keeps two open segment files for them.
// Past a bound the client gets a typed error or flow control holds it
// back; each hit is counted in felix_limit_hits_total{limit} and logged
// once per principal and limit. Peers count against none of them: what a
// peer's raft messages hold is bounded per replica (replica.Group.Step)
// and, to be sent, per peer (raftQueueBytes; raft.go).
//
// The disk is bounded too: while the data directory's filesystem has less
// than Config.MinFreeBytes free, the shards this broker writes refuse new
// records with limit_exceeded, forwarded ones included, and its follower
// replicas leave their leaders' entries unwritten until it has room again
// (diskspace.go). One goroutine, watchDisk, reads the free space every
// 250 ms, until Close; the publish path reads one atomic.
//
// # Telemetry
//
// With Config.MeterProvider set, a broker records (Prometheus names, as
// served by `felix broker --admin`): felix_publish_duration_seconds{path}
// (receipt to ack, local or forwarded), felix_forward_duration_seconds{peer},
// felix_forwards_total{peer}, felix_wal_fsync_duration_seconds (shard
// logs' and replicas' fdatasyncs),
// felix_wal_fsyncs_parked_total (fdatasyncs of logs and replicas parked,
// wal.SyncGroup),
// felix_wal_batch_records (records per fsync, logs and replicas),
// felix_wal_written_bytes_total (logs and replicas),
// felix_records_in_total{source}, felix_payload_in_bytes_total{source},
// felix_records_out_total, felix_payload_out_bytes_total,
// felix_errors_total{code}, felix_limit_hits_total{limit},
// felix_connections{type}, felix_quic_streams{type} (open QUIC streams),
// felix_quic_packets_sent_total{type} and felix_quic_packets_lost_total{type}
// (quic-go's counts over the broker's client and peer connections, ended
// ones included; quicstats.go),
// felix_shards_owned, felix_map_epoch,
// felix_subscriber_lag_records{stream,shard}, and per owned shard
// felix_shard_log_size_bytes, felix_shard_next_offset and
// felix_shard_records{stream,shard} (read at scrape time from the open
// logs, bounded by Config.ShardMetrics; see shards_metrics.go), with
// felix_shard_metrics_omitted.
//
// With Config.TracerProvider set, each publish gets a server span
// ("publish <stream>", or "forward <stream>" on the owner of a forwarded
// record) under the producer's context from the record's headers; a
// forward adds a client span whose context travels to the owner in the
// felix-hop-* headers; the owner adds "append <shard>" and "fsync <shard>".
// Spans carry the messaging conventions' attributes (system, operation,
// destination, partition, message id, messaging.message.body.size, and
// messaging.client.id for a record with a producer id), a forward's client
// span server.address and server.port (the owner's address in the map),
// and a failed span error status with error.type, the wire error code's
// name (also as felix.error.code).
//
// Telemetry sits at the edges of the publish path (events.go): the path
// records what happens to a record in a pubEvents value carried with it
// (received, routed to the local log, forwarded, committed — the group
// commit that made it durable —, answered; the trace context it came
// with; its route; its offset or refusal) and hands it to one call,
// telemetry.observe, when the record is answered; every span, latency
// and count of a publish is built from those events there, as franz-go's
// hooks let kotel build its own. The routing code (publish.go,
// forward.go) holds no span and makes no tracing call: receipt takes the
// time and the trace context off the headers (telemetry.received), a
// forward asks for the headers to send (telemetry.forwardContext), an
// answer stamps the time and observes. A forward refused with NotOwner
// ends its client span there too (telemetry.rerouted) before the record
// is routed again.
//
// None of this runs between a record's receipt and its ack, beyond taking
// timestamps and parsing the trace context: counters are added at the
// answer, after its write; latencies are recorded and spans started and
// ended afterwards, with the times things happened: when the broker has
// answered the last record it held (telemetry.open drops to 0; the
// deferred runner, msgtrace.Deferred, yields once so the answer's sender
// goes first, then builds: one goroutine wake-up per idle spell, with
// telemetry on only), or under load in batches every 2 ms. Either way the
// work runs while the broker would otherwise wait, not inside the next
// record's path. A forward's span IDs are reserved before it is sent when
// the provider was built with TraceIDGenerator (its hop context in the
// felix-hop-* headers carries the reserved client span ID); otherwise
// the forward's server and client spans are started before it is sent.
// A replica's write and fdatasync (a leader's or a follower's) is queued
// for the same runner by the group's goroutine once the fdatasync has
// succeeded (telemetry.onReplicaSync): after the append, never before
// it; at light load the first one after an idle spell wakes the runner
// (measured at R=3 against the build without it, A/B in one run: direct
// p50 B/A 0.997, forwarded 1.006, CPU per record 12.07 against 11.95 µs).
package broker
