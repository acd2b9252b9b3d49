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
//   - Subscribe: one shard of one stream, from earliest, latest or an offset.
//     A broker that does not own the shard answers NotOwner naming the owner
//     (a redirect the SDK follows).
//   - Request: one admin request and its Response; map.get is answered from
//     the broker's map, the rest are relayed to the control plane.
//
// Peers (other brokers, ALPN felix-peer/1, mTLS with node certificates) open
// publisher streams to forward records; the owner treats them like a client
// stream except that it checks the forwarder's map epoch (fencing).
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
// action and stream.
//
// # Limits
//
// What one client can make a broker hold is bounded (see the limit
// fields of [Config]): connections in total and per principal, streams
// and subscriptions per connection, the first frame's deadline, credit
// and bytes per subscription and per principal, unanswered records per
// publisher stream and publish bytes per principal, header count and
// size, one record size (with the frame limit derived from it), the
// in-memory tail per shard, and shard logs open at once and owned.
// Past a bound the client gets a typed error or flow control holds it
// back; each hit is counted in felix_limit_hits_total{limit} and logged
// once per principal and limit. Peers count against none of them.
//
// # Telemetry
//
// With Config.MeterProvider set, a broker records (Prometheus names, as
// served by `felix broker --admin`): felix_publish_duration_seconds{path}
// (receipt to ack, local or forwarded), felix_forward_duration_seconds{peer},
// felix_forwards_total{peer}, felix_wal_fsync_duration_seconds,
// felix_wal_batch_records (records per fsync), felix_wal_written_bytes_total,
// felix_records_in_total{source}, felix_payload_in_bytes_total{source},
// felix_records_out_total, felix_payload_out_bytes_total,
// felix_errors_total{code}, felix_limit_hits_total{limit},
// felix_connections{type}, felix_quic_streams{type} (open QUIC streams),
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
// None of this runs between a record's receipt and its ack, beyond taking
// timestamps and parsing the trace context: latencies are recorded and
// spans started and ended after the ack is written, in batches a couple of
// milliseconds later (with the times things happened), where the cost of
// a span on a cold cache does not delay the next record. A forward's span
// IDs are reserved before it is sent when the provider was built with
// TraceIDGenerator.
package broker
