package client

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/felix-broker/felix/transport"
)

// Sentinel errors of the SDK. Compare with errors.Is; errors from the
// brokers are [*BrokerError] values and compare the same way against the
// sentinels of types.go (errors.Is(err, ErrUnknownStream)).
var (
	// ErrClosed is returned by calls on a closed [Client], [Publisher] or
	// [Subscription].
	ErrClosed = errors.New("client: closed")

	// ErrWindowFull is returned by PublishAsync when the publish window
	// (WithMaxInFlight) is full and WithBlockOnFull(false) is set: wait for
	// some futures to resolve, or Flush, and try again.
	ErrWindowFull = errors.New("client: publish window full (too many records in flight; see WithMaxInFlight and WithBlockOnFull)")

	// ErrConnectionLost means the connection or stream carrying a request
	// died before its answer arrived. For a publish the outcome is unknown:
	// the record may or may not have been written. The error wraps the
	// cause: the broker's reason for closing the connection when it gave
	// one, as a [*BrokerError] (errors.Is(err, ErrShuttingDown)).
	// Publishes after the connection is back work normally. A connection
	// the broker refused (a [*DialError] carrying ErrLimitExceeded,
	// ErrUnauthorized or ErrUnavailable) is not lost: nothing sent on it was processed.
	ErrConnectionLost = errors.New("client: connection lost, outcome unknown (the record may or may not have been written)")

	// ErrCorrupt matches every [*CorruptError]: a subscription reached
	// records that are damaged in the owner's log.
	ErrCorrupt = errors.New("client: corrupt records")

	// ErrReplicasNotReady is returned by [Client.MoveReplica] when the
	// shard's other replicas are not all voters following one leader
	// among them (an election after the source went down, or a replica
	// rejoining): moving now could leave the group without a quorum. It
	// passes: ask again a little later.
	ErrReplicasNotReady = errors.New("client: the shard's other replicas are not voters under one leader yet")
)

// CorruptError ends a subscription that reached records damaged in the
// log of a shard's owner (a disk fault: a flipped bit, a cut file). From
// and To are the damaged offsets, inclusive; no record of the range can
// be delivered, and every record before From was. The records after To
// are intact: to go on past the damage, subscribe again with
// [AtOffsets] at To+1 for that shard (see the package doc), or subscribe
// with [SkipCorrupt]. Err is the broker's [*BrokerError]
// (errors.Is(err, transport.ErrCorrupt) holds too).
type CorruptError struct {
	Stream   string
	Shard    int
	From, To uint64
	Broker   string // address of the broker that reported it
	Err      error
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("client: subscription to %s/%d: records at offsets %d-%d are damaged in the owner's log (reported by %s); "+
		"they cannot be delivered: subscribe at offset %d (AtOffsets) or with SkipCorrupt to go on past them, and check the owner's disk",
		e.Stream, e.Shard, e.From, e.To, e.Broker, e.To+1)
}

// Is reports whether target is ErrCorrupt.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// Unwrap returns the broker's error.
func (e *CorruptError) Unwrap() error { return e.Err }

// PublishError is the error a publish fails with: the record's stream and
// shard, the broker it was sent through, and why. Err is a
// [*BrokerError] from the broker (errors.Is(err, [ErrUnavailable])), or
// wraps [ErrConnectionLost] or [ErrClosed] when the outcome is unknown.
type PublishError struct {
	Stream string
	Shard  int    // -1 when the broker was to pick the shard from the key
	Broker string // address the record was sent to
	Err    error
}

func (e *PublishError) Error() string {
	shard := "?"
	if e.Shard >= 0 {
		shard = strconv.Itoa(e.Shard)
	}
	return fmt.Sprintf("client: publish to %s/%s via %s: %v", e.Stream, shard, e.Broker, e.Err)
}

func (e *PublishError) Unwrap() error { return e.Err }

// DialError is returned when a broker cannot be reached, or refuses the
// connection. Its message says what to check.
//
// A broker refuses a connection by closing it right after the handshake
// with a wire code, which Err then is, as a [*BrokerError]:
// [ErrLimitExceeded] when the client's principal has as many connections
// to the broker as it allows (MaxConnsPerPrincipal, 64 by default; every
// [Client] holds one to its broker, and each subscription holds its own:
// see [Client.Subscribe]) or the broker has its most (MaxConns), and
// [ErrUnauthorized] for a certificate that is not a client's or that the
// cluster revoked (its message says "certificate revoked"), and
// [ErrUnavailable] from a broker that has no shard map (started while
// the control plane is out of reach; the home stays, and redials back
// off as after any refusal). Nothing
// sent on a refused connection was processed: a publish that fails with
// it was not written (errors.Is(err, ErrConnectionLost) is false).
type DialError struct {
	Addr string
	Err  error
}

func (e *DialError) Error() string {
	var werr *transport.Error
	if errors.As(e.Err, &werr) {
		return fmt.Sprintf("client: connect to broker %s: the broker refused the connection: %v", e.Addr, e.Err)
	}
	return fmt.Sprintf("client: connect to broker %s: %v (is the broker running and reachable at that address? is TLS configured with the cluster CA (WithCA/WithCAFile)?)", e.Addr, e.Err)
}

func (e *DialError) Unwrap() error { return e.Err }

// Timeout reports whether the dial failed because it ran out of time.
func (e *DialError) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.Is(e.Err, errDialTimeout) || errors.As(e.Err, &t) && t.Timeout()
}

var errDialTimeout = errors.New("dial timed out")

// lost returns an error wrapping both ErrConnectionLost and cause.
func lost(cause error) error {
	if cause == nil {
		return ErrConnectionLost
	}
	return fmt.Errorf("%w: %w", ErrConnectionLost, cause)
}
