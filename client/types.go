package client

import (
	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// The types an application meets through the SDK, so that one import
// serves: they are aliases, identical to the types of the packages that
// define them (shardmap, transport), which an application need not import.
type (
	// ReplicaState is what one broker's replica of one shard of a
	// replicated stream knows ([Client.ReplicaStatus]).
	ReplicaState = transport.ReplicaState
	// StreamConfig is what a stream is created with ([Client.CreateStream])
	// and what [Client.StreamInfo] and [Client.Streams] return: its name,
	// its number of shards (fixed at creation) and its retention.
	StreamConfig = shardmap.StreamConfig

	// Map is one version of the cluster's shard map ([Client.Map],
	// [Client.ClusterStatus]): its epoch, the brokers and which one owns
	// each shard. It is shared: never modify it.
	Map = shardmap.Map

	// CtlMember is one member of the control plane ([Client.ControlPlane]):
	// its name and QUIC address, its role ("leader" or "follower"), and
	// the client URL and health of its etcd member.
	CtlMember = transport.CtlMember

	// BrokerError is the error a broker answers with: a wire error code
	// (Code, whose String is its name, such as "unavailable"), a message,
	// and fields a caller can act on (Owner, Epoch; From and To for
	// damaged records). Compare it with errors.Is against the sentinels
	// below; errors.As(err, &berr) with berr a *BrokerError gets the fields.
	BrokerError = transport.Error

	// ErrorCode is a wire error code: the Code of a [BrokerError].
	ErrorCode = transport.ErrorCode

	// Grant authorizes a principal (a client certificate's common name)
	// to do an Action on the streams a pattern matches ([Client.Grant]).
	Grant = auth.Grant

	// Action is an operation a [Grant] authorizes: [ActionPublish],
	// [ActionSubscribe], [ActionStreamAdmin], [ActionClusterRead],
	// [ActionClusterAdmin].
	Action = auth.Action
)

// The actions a [Grant] can authorize.
const (
	ActionPublish      = auth.Publish
	ActionSubscribe    = auth.Subscribe
	ActionStreamAdmin  = auth.StreamAdmin  // create and delete streams
	ActionClusterRead  = auth.ClusterRead  // status, map, grants
	ActionClusterAdmin = auth.ClusterAdmin // grant and revoke
)

// Sentinels for the errors brokers answer with. Each is the transport
// package's sentinel itself, so errors.Is(err, client.ErrUnavailable) and
// errors.Is(err, transport.ErrUnavailable) agree: a [*BrokerError] matches
// the sentinel with its code, whatever its other fields. (Damaged records
// end a subscription with a [*CorruptError], which matches the SDK's own
// [ErrCorrupt] and, through its Unwrap, transport's.)
var (
	// ErrUnknownStream: no such stream. Create it first, check the name,
	// or ask for a grant on it: a principal sees only the streams it has
	// a permission on. (A shard number the stream does not have is
	// [ErrNoShard] where the SDK checks it against its map, [ErrInvalid]
	// from a broker.)
	ErrUnknownStream = transport.ErrUnknownStream
	// ErrStreamExists: CreateStream of a stream that exists.
	ErrStreamExists = transport.ErrStreamExists
	// ErrUnauthorized: the client's principal lacks the permission; the
	// message names the principal, the operation and the stream.
	ErrUnauthorized = transport.ErrUnauthorized
	// ErrPayloadTooLarge: a record (key, value, headers and producer id)
	// is over the brokers' record limit (--max-record-bytes, 1 MiB by
	// default). A subscription ends with it at a stored record too large
	// for the broker to send (stored while the limit was larger); the
	// [BrokerError]'s From is its offset.
	ErrPayloadTooLarge = transport.ErrPayloadTooLarge
	// ErrUnavailable: the shard's owner cannot take the record now (it is
	// down, its log stopped taking writes, or no leader of a replicated
	// shard was found in time). Its message says whether a publish that
	// got it may have been written: not when the owner is down in the
	// map or no leader was found ("nothing was written"); perhaps when a
	// log failed a write or fsync, or an owner or leader was lost before
	// its ack ("may or may not have been written", "outcome unknown").
	// That outcome is unknown, and an idempotent client sends the record
	// again itself.
	ErrUnavailable = transport.ErrUnavailable
	// ErrLimitExceeded: a limit is reached, and what would pass it is
	// refused (a publish: not written). A broker's: client connections (in all, or the principal's), open
	// streams per connection, subscriptions per connection, subscription
	// credit, the shard logs subscriptions keep open; a record to a shard
	// the broker writes while its disk is below its free-space bound
	// (--min-free-bytes), or for an idempotent producer when the shard's
	// producer table is full (MaxProducers producers, each with records
	// in flight). The control plane's: shards or grants in the cluster,
	// the size of the map, a write etcd refused (no space, too large).
	// Records and bytes in flight are held back by flow control, not
	// refused; too many headers is [ErrInvalid], too many header bytes
	// [ErrPayloadTooLarge].
	ErrLimitExceeded = transport.ErrLimitExceeded
	// ErrReplicationFactor: CreateStream of a stream with more replicas
	// per shard (StreamConfig.Replicas) than the cluster has brokers.
	ErrReplicationFactor = transport.ErrReplicationFactor
	// ErrInvalid: a well-formed request the broker or control plane
	// refuses as invalid (for example Revoke of a grant that does not
	// exist).
	ErrInvalid = transport.ErrInvalid
	// ErrTimeout: the broker did not finish the operation in time. For a
	// publish (a replicated shard that did not commit the record within
	// the commit timeout) the outcome is unknown: the record may still be
	// committed. An idempotent client sends it again itself, and it is
	// written once.
	ErrTimeout = transport.ErrTimeout
	// ErrShuttingDown: the broker is shutting down; try another.
	ErrShuttingDown = transport.ErrShuttingDown
	// ErrOutOfRange: an offset outside the shard's log.
	ErrOutOfRange = transport.ErrOutOfRange
	// ErrOutOfOrderSequence: an idempotent publish skipped a sequence
	// number (see [WithIdempotence]).
	ErrOutOfOrderSequence = transport.ErrOutOfOrderSequence
	// ErrDuplicateSequence: a record was written once before, longer ago
	// than the owner remembers its offset.
	ErrDuplicateSequence = transport.ErrDuplicateSequence
	// ErrNoShard: a shard number the stream does not have ([Shard] past
	// the stream's shard count).
	ErrNoShard = shardmap.ErrNoShard
	// ErrInvalidStreamName: a stream name the SDK refuses before sending
	// anything (1 to 128 letters, digits, '-', '_', '.'; not starting with
	// '.').
	ErrInvalidStreamName = shardmap.ErrInvalidStreamName
)
