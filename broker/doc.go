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
package broker
