// Package client is the Go SDK of Felix: applications, felixctl and the
// bench harness publish, subscribe and manage streams through it.
//
// It owns the client side of the broker protocol: one QUIC connection per
// broker for publishes and requests, redialed with capped exponential
// backoff, and closed once unused for [WithConnIdleTimeout] or once its
// broker leaves the shard map (the home broker's is kept); publish streams with a bounded window of records in flight;
// one subscription stream per shard, attached to the shard's owner as the
// shard map says, over connections of the subscription's own (so that
// records it has not taken yet hold back no one else: subconns.go); and
// request streams for admin calls. It never computes shard ownership itself (it obeys the
// map the brokers serve) and never retries a publish on its own unless
// asked to: a record whose outcome is unknown is reported as such
// ([ErrConnectionLost]; [ErrUnavailable] or [ErrTimeout] whose message
// says so), except by an idempotent client
// ([WithIdempotence]), whose publishers send such records again, with the
// same producer id and sequence, so that each is committed exactly once
// and in order (see "Idempotent publishing" below).
//
// # Usage
//
// One import serves: the types and error sentinels an application needs
// ([StreamConfig], [ErrUnknownStream], [ErrUnavailable], ...) are in this
// package (see types.go).
//
//	c, err := client.Connect(ctx, "localhost:7100", client.WithCAFile("ca.crt"),
//		client.WithClientCertFile("admin.crt", "admin.key"))
//	if err != nil {
//		return err // says what to check: the address, the CA, the certificate
//	}
//	defer c.Close()
//
//	err = c.CreateStream(ctx, client.StreamConfig{Name: "orders", Shards: 8})
//	if err != nil && !errors.Is(err, client.ErrStreamExists) {
//		return err
//	}
//	ack, err := c.Publish(ctx, "orders", []byte("customer-42"), []byte("hello"))
//	if err != nil {
//		return err
//	}
//	fmt.Printf("offset %d on %s/%d, owner %s, via %s\n", ack.Offset, ack.Stream, ack.Shard, ack.Owner, ack.Via)
//
//	sub, err := c.Subscribe(ctx, "orders", client.Earliest())
//	if err != nil {
//		return err
//	}
//	defer sub.Stop()
//	for rec, err := range sub.Records(ctx) {
//		if err != nil {
//			return err
//		}
//		fmt.Printf("%s/%d@%d %s\n", rec.Stream, rec.Shard, rec.Offset, rec.Value)
//	}
//
// [ConnectFile] connects with the file `felix dev` writes
// (felix-cluster.json: the brokers, the CA and a client certificate).
//
// # Publishing
//
// Any broker accepts any publish and forwards it to the shard's owner; the
// [Ack] comes once the owner has fsynced the record, and says which broker
// committed it (Owner), which one received it (Via) and whether it was
// Forwarded. [Client.Publish] waits for the ack; [Client.PublishAsync]
// returns a [Future] and keeps up to [WithMaxInFlight] records in flight;
// with [OnResolved] it also calls a function with the record's outcome on
// the goroutine that reads the acks, with no hand-off in between.
// A [Publisher] is one ordered stream: its records are committed in the
// order sent (within each shard). On a replicated stream, a record the
// shard's raft group cannot commit (no majority of its replicas can write
// it) is answered with a timeout error after the broker's commit timeout
// (10 s by default): its outcome is unknown, as the entry may still be
// committed later.
// A record with few others in flight on its stream is written at once,
// on the caller's goroutine; records published while many are in flight
// are buffered and written together by the stream's flusher goroutine,
// many to a QUIC packet (as the NATS client's flusher does). So are
// records the stream's flow-control window cannot take at once (a broker
// that reads slowly, or not at all): a publish never waits on the
// network to send its record, only for its turn at the stream (while
// the flusher's write is blocked), and that wait ends with its context:
// the record was not sent (nor numbered, by an idempotent client).
// Publish and PublishAsync then fail with the context's error.
//
// # The home broker
//
// Publisher streams and admin requests go through one broker, the home:
// the one given to Connect. If it fails every dial for
// [WithHomeFailover] (10 s by default; two dials in a row or more, a dial
// cut short by its caller's context included), the client moves its home
// to another live broker of the last shard map seen (one it is connected
// to already, else the next in the map's order) and logs the move; the
// publish or request whose dial made the move goes there at once, and so
// does every publisher stream opened after it. A stream open before stays
// where it is until it fails, as any does when its broker is lost: its
// records in flight fail as of unknown outcome, or are sent again by an
// idempotent client, on a stream to the new home. A broker restarting at
// the same address within that time stays the home; the client does not
// move back. [Client.Addr] says which broker is the home.
//
// # The shard map
//
// The client keeps the newest shard map it has seen, and takes a newer
// one (of a higher epoch) from any broker's answer; an older one never
// replaces it. After a connection to a broker ended other than by the
// client's closing it, the map is fetched again before a publisher next
// picks a shard by it (a record with no key, an idempotent publisher's
// record). A map of another cluster than the one cached (its cluster ID
// differs: the cluster was rebuilt, its control plane's state lost and
// its epochs started over) is taken whatever its epoch, with a warning,
// and the client never takes a map of the cluster it left again.
//
// # Idempotent publishing
//
// With [WithIdempotence], every Publisher numbers its records (a random
// producer id per Publisher and shard, sequences from 1) and the shard's
// owner (on a replicated stream, its raft leader) writes each (producer
// id, sequence) once, across a change of leader too. A record whose outcome
// becomes unknown (lost connection, unavailable owner, broker shutting
// down, a replicated shard's commit timeout) is not failed: the Publisher sends it again on a new stream,
// before any later record, and a copy the owner had already committed is
// answered with its original ack (Ack.Duplicate). Its Future resolves
// with that ack. Only when a record has stayed unresolved for
// [WithRetryTimeout] does it fail, with an error matching
// [ErrRetriesExhausted] (and [ErrConnectionLost]): its outcome is then
// unknown.
//
// # Subscribing
//
// A subscription reads every shard of a stream (or one, with [Shard]) from
// its owner and merges them into one iterator, [Subscription.Records]: in
// offset order within a shard, resumed without gap or duplicate after a
// broker restart, with credit-based flow control so a slow application
// never makes a broker buffer more than [Credit] records per shard.
//
// A shard whose broker was lost is attached again by the shard map: the
// client asks its home broker for it, and, when that one
// cannot be reached or does not answer within [WithRequestTimeout], the
// other live brokers of the last map seen; if none answers, it reattaches
// by the map it has. No request the SDK makes on its own behalf waits
// longer than that for one broker, Connect's fetch of the map included.
//
// The iterator was chosen over a channel because delivery then happens in
// the application's goroutine: the SDK knows exactly which records the
// application has taken (for the credit it grants and the offsets
// [Subscription.Next] reports), there is no extra goroutine hand-off per
// record, and the context of the call bounds the wait.
//
// # Damaged records
//
// If a shard's owner finds records of its log damaged on disk (it serves
// every intact record around the damage), a subscription that reaches them
// ends, after every record before them, with a [*CorruptError] naming the
// stream, shard and damaged offsets (errors.Is(err, [ErrCorrupt])). It is
// not retried: the damage does not heal. Like a Kafka consumer that seeks
// past a corrupt record, the application decides whether to skip it; to
// do so, resubscribe from where it stopped with that shard moved past the
// damage:
//
//	var cerr *client.CorruptError
//	if errors.As(err, &cerr) {
//		next := sub.Next()
//		next[cerr.Shard] = cerr.To + 1
//		sub, err = c.Subscribe(ctx, stream, client.AtOffsets(next))
//	}
//
// or subscribe with [SkipCorrupt], which logs a warning with the range
// and goes on after it by itself.
//
// # Errors
//
// Errors from brokers are [*BrokerError] values (the transport package's
// Error): compare them with errors.Is against this package's sentinels
// ([ErrUnknownStream], [ErrUnavailable], [ErrUnauthorized], ...), which
// are transport's own, so comparing with either works. The SDK's own are
// [ErrClosed], [ErrWindowFull], [ErrConnectionLost] and [ErrCorrupt]; a
// failed publish is a [*PublishError] naming the record's stream, shard
// and broker, and a failed dial a [*DialError] whose message says what to
// check.
//
// An admin change ([Client.CreateStream], [Client.DeleteStream],
// [Client.Grant], ...) whose outcome is unknown fails with an error
// matching [ErrConnectionLost]: its connection was lost after it was
// sent, its context ended after it was sent and before the answer (the
// error matches the context's error too), or the broker answered
// unavailable in a way that says it may have been made (its relay to the
// control plane got no answer, or the control plane could not commit it).
// Ask the cluster (Streams, Grants, ...) to learn which.
//
// A broker refuses a connection by closing it right after the handshake
// with a wire code: limit_exceeded when the principal has as many
// connections to it as it allows (MaxConnsPerPrincipal, 64 by default:
// each Client holds one to its broker and each subscription its own to
// every broker it reads from), unauthorized for a certificate that is
// not a client's, unavailable from a broker started while the control
// plane is out of reach (it has no shard map, and serves nothing until it
// reaches the control plane). The SDK reads that code: [Connect] fails
// with a [*DialError] matching [ErrLimitExceeded], [ErrUnauthorized] or
// [ErrUnavailable];
// publishes sent on a refused connection fail with it too, and were not
// written (it does not match [ErrConnectionLost]); a subscription ends
// with it, as it does when a broker answers that code on its stream: the
// limit is not lifted by waiting, but by ending other connections of the
// principal or raising the limit. A refused connection counts as a
// failed dial, so redials of that broker back off ([WithReconnect]). A
// connection that worked and is then closed leaves the records in flight
// of unknown outcome: [ErrConnectionLost], with the broker's code in the
// chain (errors.Is(err, ErrShuttingDown) if it was shutting down).
//
// A broker stopped gracefully (SIGTERM) commits and acknowledges what it
// took in, and for a moment (about 500 ms) reads on and refuses what it
// reads, shutting_down naming itself, nothing written. On the first such
// refusal the client moves its home off it, the publisher stream takes
// no more records (the next go on a new stream, at the new home), and the
// client ends its side of the stream, so that the broker answers every
// record sent on it. Each record refused so fails with an error matching
// [ErrShuttingDown] and not [ErrConnectionLost]: not written, safe to
// publish again. [Client.Publish] sends it again through the new home,
// up to twice (a second home may be leaving too); a [Future] of [Client.PublishAsync] fails with it, and the
// caller may publish the record again (after records sent since, as any
// retried record). A shutting_down refusal relayed from the owner of a
// shard that is shutting down (a broker other than the home) also says
// not written; the home stays.
//
// # Security
//
// Brokers are verified against the cluster CA ([WithCA], [WithCAFile]).
// Every broker requires a client certificate from the cluster CA
// ([WithClientCert] or [WithClientCertFile]): its common name is the
// principal whose permissions every operation is checked against.
// [WithInsecure] turns verification of the broker off and is for
// development only.
//
// # Telemetry
//
// [WithTracerProvider] traces publishes (a producer span each, whose
// context travels with the record, is stored with it, and is the parent of
// the brokers' spans) and deliveries (a process span linked to the
// producer's); [WithMeterProvider] records publish latency and deliveries.
// Producer spans name the broker the record went to (server.address,
// server.port), its size (messaging.message.body.size) and its producer
// id (messaging.client.id, with [WithProducer] or [WithIdempotence]); a
// failed one has error.type: the broker's wire code name
// ("unavailable"), or the SDK's cause ("connection_lost", "closed").
// Neither is on by default, and the global providers are never used. Span
// ends and latency records run in batches off the publish path; with a
// tracer provider built with [TraceIDGenerator] the producer span itself
// is started after the record is sent, with its real start time.
//
// [Client.ConnStats] reads quic-go's accounting of the connection to each
// broker: round-trip times, congestion window, packets and bytes sent,
// received and declared lost, counted across redials. On loopback or a
// LAN, lost packets mean a broker (or this process) stopped reading for a
// while: quic-go drops what arrives for a connection 256 packets behind.
package client
