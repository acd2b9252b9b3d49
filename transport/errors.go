package transport

import (
	"errors"
	"fmt"
	"strconv"
)

// ErrorCode classifies an [Error]. Codes are part of the wire format: never
// renumber one, only add.
type ErrorCode uint16

// Error codes.
const (
	CodeMalformed       ErrorCode = 1  // a frame could not be decoded
	CodeFrameTooLarge   ErrorCode = 2  // a frame's length is over the maximum
	CodeUnknownFrame    ErrorCode = 3  // a frame type this peer does not know
	CodeUnknownStream   ErrorCode = 4  // no such stream (or shard)
	CodePayloadTooLarge ErrorCode = 5  // a record is over the stream's limit
	CodeInvalid         ErrorCode = 6  // a well-formed frame with invalid content
	CodeNotOwner        ErrorCode = 7  // this node does not own the shard (see Epoch, Owner)
	CodeUnavailable     ErrorCode = 8  // the owner cannot be reached now (see Owner)
	CodeShuttingDown    ErrorCode = 9  // the node is shutting down; retry elsewhere
	CodeInternal        ErrorCode = 10 // a bug or an unexpected local failure
	CodeStreamExists    ErrorCode = 11 // stream.create of an existing stream
	CodeUnauthorized    ErrorCode = 12 // the peer lacks the identity this needs
	CodeTimeout         ErrorCode = 13 // the operation did not finish in time
	CodeOutOfRange      ErrorCode = 14 // an offset outside the shard's log
	CodeUnexpectedFrame ErrorCode = 15 // a known frame type where it is not allowed
	CodeLimitExceeded   ErrorCode = 16 // a resource limit of the node is reached (connections, streams, subscriptions, credit, headers)

	// CodeOutOfOrderSequence: an idempotent publish (ProducerID and
	// ProducerSeq > 0) skipped a sequence number of its producer on the
	// shard; nothing was written. Sending the missing records first, in
	// order, makes it succeed. The Error's From, when set, is the
	// sequence the owner expects next of the producer: nothing from it on
	// was written (0: a sequence older than the owner remembers, whose
	// outcome it does not know).
	CodeOutOfOrderSequence ErrorCode = 17
	// CodeDuplicateSequence: an idempotent publish repeated a sequence
	// number its producer committed on the shard longer ago than the owner
	// remembers acks for; nothing was written again (the record is in the
	// log once), but its original offset is no longer known.
	CodeDuplicateSequence ErrorCode = 18
	// CodeCorrupt: records of the shard's log are damaged on disk; the
	// Error's From and To give the damaged offsets (inclusive). The
	// records after To are intact: subscribe at To+1 to skip the damage.
	CodeCorrupt ErrorCode = 19
	// CodeReplicationFactor: stream.create of a stream whose replication
	// factor is larger than the cluster's number of members (as Kafka's
	// INVALID_REPLICATION_FACTOR); add brokers or create it with fewer
	// replicas.
	CodeReplicationFactor ErrorCode = 20
	// CodeUnknownProducer: an idempotent publish sent a sequence past 1
	// for a producer the shard does not know (it was forgotten: expired,
	// evicted, or not found after a restart; or its first record was
	// refused); nothing was written. Like Kafka's UNKNOWN_PRODUCER_ID: the
	// client goes on under a new producer id, from sequence 1.
	CodeUnknownProducer ErrorCode = 21
	// CodeReplaced: ctl ended a broker's registration because a newer
	// registration of the same node id replaced it: another process runs
	// as that node (an old one not stopped beside its replacement, or a
	// copy of its configuration). A member registers again only after its
	// longest backoff. An earlier member reads it as an unknown code and
	// re-registers, as it did on the stream's end before.
	CodeReplaced ErrorCode = 22
)

var codeNames = [...]string{
	CodeMalformed:       "malformed",
	CodeFrameTooLarge:   "frame_too_large",
	CodeUnknownFrame:    "unknown_frame",
	CodeUnknownStream:   "unknown_stream",
	CodePayloadTooLarge: "payload_too_large",
	CodeInvalid:         "invalid",
	CodeNotOwner:        "not_owner",
	CodeUnavailable:     "unavailable",
	CodeShuttingDown:    "shutting_down",
	CodeInternal:        "internal",
	CodeStreamExists:    "stream_exists",
	CodeUnauthorized:    "unauthorized",
	CodeTimeout:         "timeout",
	CodeOutOfRange:      "out_of_range",
	CodeUnexpectedFrame: "unexpected_frame",
	CodeLimitExceeded:   "limit_exceeded",

	CodeOutOfOrderSequence: "out_of_order_sequence",
	CodeDuplicateSequence:  "duplicate_sequence",
	CodeCorrupt:            "corrupt",
	CodeReplicationFactor:  "replication_factor",
	CodeUnknownProducer:    "unknown_producer",
	CodeReplaced:           "replaced",
}

// String returns the snake-case name of c, such as "not_owner", or
// "code_<n>" for a code this version does not know.
func (c ErrorCode) String() string {
	if int(c) < len(codeNames) && codeNames[c] != "" {
		return codeNames[c]
	}
	return "code_" + strconv.Itoa(int(c))
}

// Sentinels to compare wire errors with: errors.Is(err, ErrNotOwner) is true
// for any [*Error] with [CodeNotOwner], whatever its other fields.
var (
	ErrMalformed       = &Error{Code: CodeMalformed}
	ErrFrameTooLarge   = &Error{Code: CodeFrameTooLarge}
	ErrUnknownFrame    = &Error{Code: CodeUnknownFrame}
	ErrUnknownStream   = &Error{Code: CodeUnknownStream}
	ErrPayloadTooLarge = &Error{Code: CodePayloadTooLarge}
	ErrInvalid         = &Error{Code: CodeInvalid}
	ErrNotOwner        = &Error{Code: CodeNotOwner}
	ErrUnavailable     = &Error{Code: CodeUnavailable}
	ErrShuttingDown    = &Error{Code: CodeShuttingDown}
	ErrInternal        = &Error{Code: CodeInternal}
	ErrStreamExists    = &Error{Code: CodeStreamExists}
	ErrUnauthorized    = &Error{Code: CodeUnauthorized}
	ErrTimeout         = &Error{Code: CodeTimeout}
	ErrOutOfRange      = &Error{Code: CodeOutOfRange}
	ErrUnexpectedFrame = &Error{Code: CodeUnexpectedFrame}
	ErrLimitExceeded   = &Error{Code: CodeLimitExceeded}

	ErrOutOfOrderSequence = &Error{Code: CodeOutOfOrderSequence}
	ErrDuplicateSequence  = &Error{Code: CodeDuplicateSequence}
	ErrCorrupt            = &Error{Code: CodeCorrupt}
	ErrReplicationFactor  = &Error{Code: CodeReplicationFactor}
	ErrUnknownProducer    = &Error{Code: CodeUnknownProducer}
	ErrReplaced           = &Error{Code: CodeReplaced}
)

// Error is both a frame (sent either way on a stream) and the Go error type
// for errors that cross the wire. Seq echoes the [Publish.Seq] the error
// answers, 0 when it answers none.
type Error struct {
	Seq     uint64
	Code    ErrorCode
	Message string
	Epoch   uint64 // with CodeNotOwner: the refusing node's map epoch
	Owner   string // with CodeNotOwner/CodeUnavailable: the owner node id if known
	From    uint64 // with CodeCorrupt: the first damaged offset; with CodePayloadTooLarge ending a subscription: the record's offset; with CodeOutOfOrderSequence: the sequence expected next
	To      uint64 // with CodeCorrupt: the last damaged offset (inclusive); with CodePayloadTooLarge ending a subscription: From

	// cause is the local error behind this one, for Unwrap; it is not sent.
	cause error
}

// Errorf returns an *Error with code and a formatted message. A %w verb in
// format makes the wrapped error available to errors.Is and errors.As on
// this side of the wire; only the message text is sent.
func Errorf(code ErrorCode, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	return &Error{Code: code, Message: err.Error(), cause: errors.Unwrap(err)}
}

// ErrorFrom returns err as a wire *Error: err itself (or the *Error it
// wraps) if it is one, otherwise a [CodeInternal] error with err's text. It
// returns nil for a nil err.
func ErrorFrom(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: CodeInternal, Message: err.Error(), cause: err}
}

// Type implements [Frame].
func (*Error) Type() FrameType { return FrameError }

// Error returns "felix: <code name>: <message>".
func (e *Error) Error() string {
	if e.Message == "" {
		return "felix: " + e.Code.String()
	}
	return "felix: " + e.Code.String() + ": " + e.Message
}

// Is reports whether target is an *Error with the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t != nil && t.Code == e.Code
}

// Unwrap returns the local cause of e, if any (for example
// io.ErrUnexpectedEOF for a truncated frame). Causes are not sent.
func (e *Error) Unwrap() error { return e.cause }

// Timeout reports whether e is a [CodeTimeout] error.
func (e *Error) Timeout() bool { return e.Code == CodeTimeout }

func (e *Error) appendBody(b []byte) ([]byte, error) {
	if e == nil {
		return b, errNilFrame(FrameError)
	}
	// From and To are trailing fields, sent only when set: an older peer
	// skips them, and every other error encodes as before.
	fields := 5
	if e.From != 0 || e.To != 0 {
		fields = 7
	}
	b = appendArrayHeader(b, fields)
	b = appendUint(b, e.Seq)
	b = appendUint(b, uint64(e.Code))
	b = appendStr(b, e.Message)
	b = appendUint(b, e.Epoch)
	b = appendStr(b, e.Owner)
	if fields == 7 {
		b = appendUint(b, e.From)
		b = appendUint(b, e.To)
	}
	return b, nil
}

func (e *Error) decode(d *decoder) {
	n := d.arrayHeader(5)
	e.Seq = d.uint64()
	e.Code = ErrorCode(d.uint16())
	e.Message = d.str()
	e.Epoch = d.uint64()
	e.Owner = d.str()
	if n >= 7 {
		e.From = d.uint64()
		e.To = d.uint64()
		n -= 2
	}
	d.skipN(n - 5)
}

// malformed returns a CodeMalformed error with a formatted message.
func malformed(format string, args ...any) *Error {
	return &Error{Code: CodeMalformed, Message: fmt.Sprintf(format, args...)}
}

func errNilFrame(t FrameType) *Error {
	return &Error{Code: CodeInvalid, Message: "nil " + t.String() + " frame"}
}
