package replica

import (
	"errors"
	"fmt"
)

var (
	// ErrClosed is returned for appends to a Group that is closed or
	// closing: the records were never proposed.
	ErrClosed = errors.New("replica: closed")
	// ErrFailed is returned after the group's storage failed (a write or
	// fsync error) or raft panicked (*RaftPanicError): the group stopped,
	// and must be reopened from its directory, which re-reads what
	// actually reached the disk.
	ErrFailed = errors.New("replica: group failed")
	// ErrLogLost is returned by Group.Lost once the leader said this
	// replica holds committed entries its log lacks (its directory was
	// lost): it cannot catch up under its raft id; a new replica, under a
	// new id, must replace it (Config.Join, Group.Admit).
	ErrLogLost = errors.New("replica: log lost")
	// ErrNotLeader is matched (errors.Is) by a *NotLeaderError.
	ErrNotLeader = errors.New("replica: not the leader")
	// ErrUnknownOutcome is returned for records that were proposed but whose
	// fate this node cannot learn any more (it closed or failed first): they
	// may or may not be committed. Retrying is safe with idempotent publish.
	ErrUnknownOutcome = errors.New("replica: outcome unknown")
	// ErrCommitTimeout is told to the records of an entry not committed
	// within Config.CommitTimeout of its proposal: it may still be
	// committed, or be replaced; the records are told their fate again
	// once it is known.
	ErrCommitTimeout = errors.New("replica: not committed in time")
	// ErrCorrupt marks stored data that fails its checksum or format.
	ErrCorrupt = errors.New("replica: corrupt")
	// ErrBadMessage is returned by Step for a message a peer must not send.
	ErrBadMessage = errors.New("replica: bad message")
	// ErrOutOfRange is returned by Read below the first retained offset.
	ErrOutOfRange = errors.New("replica: offset out of range")
	// ErrDropped is returned for records the leader refused to propose
	// (too much uncommitted, or a leadership transfer): never committed.
	ErrDropped = errors.New("replica: proposal dropped")
	// ErrTooLarge is returned for a record larger than Config.MaxEntryBytes.
	ErrTooLarge = errors.New("replica: record too large")
)

// NotLeaderError says that records were not committed, and never will be,
// because this node is not (or is no longer) the group's leader: it dropped
// them, or another leader's entries replaced them. Leader is the leader this
// node knows of (0 if none), where the records should go instead.
type NotLeaderError struct {
	Group  string
	Leader uint64
	Term   uint64
	// Replaced is true when the records were in this node's log and another
	// leader's entries overwrote them; false when they were never appended.
	Replaced bool
}

func (e *NotLeaderError) Error() string {
	what := "dropped"
	if e.Replaced {
		what = "replaced by another leader's entries"
	}
	if e.Leader == 0 {
		return fmt.Sprintf("replica: group %q: not the leader, records %s; no leader known (term %d)", e.Group, what, e.Term)
	}
	return fmt.Sprintf("replica: group %q: not the leader, records %s; leader is %d (term %d)", e.Group, what, e.Leader, e.Term)
}

// Is reports whether target is ErrNotLeader.
func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }

// RaftPanicError is why a group failed when etcd raft panicked on its
// goroutine: raft takes its input as trusted and asserts its invariants
// with panics, which a message from a buggy or malicious peer can break.
// The group stops (as after a storage failure, ErrFailed: errors.Is
// matches it) and must be reopened; the process goes on. From and Type
// name the peer message being stepped when raft panicked, if it was one
// (From 0: raft panicked outside Step, after the messages of that round).
type RaftPanicError struct {
	Group string
	From  uint64
	Type  string
	Value any    // what raft panicked with
	Stack []byte // the panicking goroutine's stack
}

func (e *RaftPanicError) Error() string {
	if e.From == 0 {
		return fmt.Sprintf("replica: group %q: raft panicked: %v", e.Group, e.Value)
	}
	return fmt.Sprintf("replica: group %q: raft panicked stepping %s from %d: %v", e.Group, e.Type, e.From, e.Value)
}

// Is reports whether target is ErrFailed.
func (e *RaftPanicError) Is(target error) bool { return target == ErrFailed }

// Unwrap returns the panic's value if it is an error.
func (e *RaftPanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}
