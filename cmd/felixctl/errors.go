package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// Exit codes a script can rely on.
const (
	exitOK        = 0
	exitFailure   = 1 // the command failed
	exitUsage     = 2 // the command line is wrong
	exitUnhealthy = 3 // the cluster answered but is not healthy (a broker is down)
)

// errUnhealthy is returned by `cluster status` when a member is down; the
// status itself has been printed.
type errUnhealthy struct{ down []string }

func (e *errUnhealthy) Error() string {
	if len(e.down) == 1 {
		return fmt.Sprintf("the cluster is unhealthy: %s is down, and its shards are unavailable until it is back", e.down[0])
	}
	return fmt.Sprintf("the cluster is unhealthy: %s are down, and their shards are unavailable until they are back", andList(e.down))
}

// andList joins items as "a, b and c".
func andList(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}

// noFileError is a connection file that does not exist.
type noFileError struct {
	path   string
	source string // "" for the default file, else "--cluster" or "FELIX_CLUSTER"
	err    error
}

func (e *noFileError) Error() string { return e.err.Error() }
func (e *noFileError) Unwrap() error { return e.err }

// usageError is a command line that parses but makes no sense.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// brokerError says which broker an error happened on, by id when known.
type brokerError struct {
	ID   string // "" when the broker was given by address
	Addr string
	Err  error

	// What the rest of the cluster said, when this broker could not be
	// reached (whyNot): the broker that answered instead, and whether
	// its map knows this one and has it live.
	othersUp    string
	known, live bool
}

func (e *brokerError) Error() string { return e.name() + ": " + e.Err.Error() }
func (e *brokerError) Unwrap() error { return e.Err }

func (e *brokerError) name() string {
	if e.ID == "" {
		return "the broker at " + e.Addr
	}
	return fmt.Sprintf("%s (%s)", e.ID, e.Addr)
}

// noBrokerError is returned when no broker of the cluster answered.
type noBrokerError struct {
	source string // where the brokers came from: "felix-cluster.json", "--broker"
	errs   []*brokerError
}

func (e *noBrokerError) Error() string {
	var names []string
	for _, b := range e.errs {
		names = append(names, b.name())
	}
	return fmt.Sprintf("no broker listed in %s is reachable (%s)", e.source, strings.Join(names, ", "))
}

func (e *noBrokerError) Unwrap() []error {
	errs := make([]error, len(e.errs))
	for i, b := range e.errs {
		errs[i] = b
	}
	return errs
}

// streamError says which stream an operation was about.
type streamError struct {
	Stream string
	Err    error
}

func (e *streamError) Error() string { return e.Err.Error() }
func (e *streamError) Unwrap() error { return e.Err }

// explain turns err into a sentence that says what happened and what to
// do, and the exit code. It is the one place where SDK and wire errors are
// mapped to words; commands only wrap errors with what they were doing to
// what (brokerError, streamError).
func explain(err error) (string, int) {
	var (
		usage     *usageError
		unhealthy *errUnhealthy
		noBroker  *noBrokerError
		noFile    *noFileError
		bErr      *brokerError
		sErr      *streamError
		pubErr    *client.PublishError
		dialErr   *client.DialError
		wire      *transport.Error
	)
	errors.As(err, &bErr)
	errors.As(err, &sErr)
	stream := ""
	if sErr != nil {
		stream = sErr.Stream
	}
	if errors.As(err, &pubErr) && stream == "" {
		stream = pubErr.Stream
	}
	where := "the broker"
	if bErr != nil {
		where = bErr.name()
	}

	switch {
	case errors.As(err, &usage):
		return usage.msg + " (see `felixctl --help`)", exitUsage
	case errors.As(err, &unhealthy):
		if len(unhealthy.down) == 1 {
			id := unhealthy.down[0]
			return unhealthy.Error() + fmt.Sprintf(": restart it (or, if it is lost for good, move its replicas with `felixctl cluster drain %s` and then `felixctl cluster remove %s`)", id, id), exitUnhealthy
		}
		return unhealthy.Error() + ": restart them (or, for one lost for good, `felixctl cluster drain ID` and then `felixctl cluster remove ID`)", exitUnhealthy
	case errors.As(err, &noFile):
		what := "there is no " + client.DefaultClusterFile + " in this directory"
		if noFile.source != "" {
			what = fmt.Sprintf("the connection file %s (%s) does not exist", noFile.path, noFile.source)
		}
		return "no cluster to talk to: " + what + ". Start a local cluster in this directory with `felix dev` (`go run ./cmd/felix dev`), " +
			"or point felixctl at one with --cluster FILE (FELIX_CLUSTER) or --broker ADDR --ca FILE (FELIX_BROKER, FELIX_CA)", exitFailure
	case errors.Is(err, client.ErrNoClusterFile):
		return "no cluster to talk to: " + plainError(err), exitFailure
	case errors.As(err, &noBroker):
		if len(noBroker.errs) == 1 || refusedAll(noBroker.errs) {
			// Every broker refused alike (a revoked certificate): the
			// first says why.
			return explainDial(noBroker.errs[0]), exitFailure
		}
		if tlsProblem(err) {
			return noBroker.Error() + ": their certificates do not verify against the CA; is it the cluster's?", exitFailure
		}
		return noBroker.Error() + ": is `felix dev` running?", exitFailure
	case errors.As(err, &dialErr):
		if bErr == nil {
			bErr = &brokerError{Addr: dialErr.Addr, Err: err}
		}
		return explainDial(bErr), exitFailure
	case errors.Is(err, transport.ErrUnknownStream):
		if stream == "" {
			return "no such stream: list them with `felixctl stream ls`", exitFailure
		}
		return fmt.Sprintf("stream %q does not exist: create it with `felixctl stream create %s --shards N`, or list them with `felixctl stream ls`", stream, stream), exitFailure
	case errors.Is(err, transport.ErrStreamExists):
		return fmt.Sprintf("stream %q already exists: see `felixctl stream info %s`", stream, stream), exitFailure
	case errors.As(err, &wire) && wire.Code == transport.CodeUnavailable:
		owner := "its owner"
		if wire.Owner != "" {
			owner = wire.Owner + ", its owner,"
		}
		return fmt.Sprintf("%s could not write to %s: %s is down or unreachable, and nothing was written. Check `felixctl cluster status`", where, shardName(stream, pubErr), owner), exitFailure
	case errors.As(err, &wire) && wire.Code == transport.CodePayloadTooLarge:
		msg := wire.Message
		if msg == "" {
			msg = "the record is too large"
		}
		return fmt.Sprintf("%s refused the record: %s. A record (key, value, headers and producer id) may be at most the broker's --max-record-bytes, 1 MiB unless the cluster was started with another", where, msg), exitFailure
	case errors.Is(err, shardmap.ErrNoShard):
		return fmt.Sprintf("%s: see the stream's shards with `felixctl stream info %s`", plainError(err), stream), exitFailure
	case errors.Is(err, client.ErrConnectionLost):
		return fmt.Sprintf("the connection to %s was lost before it answered: a record in flight may or may not have been written (check with `felixctl sub`); is the broker still running?", where), exitFailure
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("%s did not answer in time (--timeout): is the cluster healthy? try `felixctl cluster status`", where), exitFailure
	case errors.Is(err, context.Canceled):
		return "interrupted", exitFailure
	case errors.As(err, &wire):
		msg := internalPrefix.ReplaceAllString(wire.Message, "")
		if msg == "" {
			msg = wire.Code.String()
		}
		return fmt.Sprintf("%s refused the request: %s", where, msg), exitFailure
	}
	return plainError(err), exitFailure
}

// internalPrefix matches the package prefixes of Felix's errors
// ("client: ", "shardmap: "...), which mean nothing to a person at a shell.
var internalPrefix = regexp.MustCompile(`\b(client|shardmap|transport|broker|ctl|auth|wal|stats|cluster|bench|telemetry|servercmd|demo): `)

// plainError is err's message without internal package prefixes.
func plainError(err error) string {
	return internalPrefix.ReplaceAllString(err.Error(), "")
}

// explainDial says that broker b could not be reached, and why: the
// broker refused the connection (a revoked certificate, say), TLS, a
// name that does not resolve here, the broker down while the others
// answer, or nothing answering at all.
func explainDial(b *brokerError) string {
	var dialErr *client.DialError
	if !errors.As(b, &dialErr) {
		// Nothing was dialed: the client could not be set up (a CA file
		// that is not a certificate, say).
		return fmt.Sprintf("cannot connect to %s: %s", b.name(), plainError(b.Err))
	}
	if refusal := refusalOf(b); refusal != nil {
		msg := refusal.Message
		if msg == "" {
			msg = refusal.Code.String()
		}
		if refusal.Code == transport.CodeUnauthorized {
			return fmt.Sprintf("%s refused the connection: %s: authenticate with a client certificate of the cluster that is not revoked (--cert, --cert-key; `felix certs client` issues one)", b.name(), msg)
		}
		return fmt.Sprintf("%s refused the connection: %s", b.name(), msg)
	}
	if tlsProblem(b) {
		return fmt.Sprintf("%s did not pass TLS verification: is the CA (--ca, or the connection file's) the one that signed this cluster's certificates?", b.name())
	}
	if d := dnsProblem(b); d != nil {
		return fmt.Sprintf("cannot resolve %s from this host, so %s cannot be reached: give the broker an advertised address reachable from here (felix broker --advertise HOST:PORT, FELIX_ADVERTISE)", d.Name, b.name())
	}
	switch {
	case b.othersUp != "" && b.known && !b.live:
		return fmt.Sprintf("%s is down or unreachable; the other brokers answer (%s did), and the control plane has %s down: restart it (under felix dev: `felixctl dev restart %s`)", b.name(), b.othersUp, b.ID, b.ID)
	case b.othersUp != "" && b.known:
		return fmt.Sprintf("%s is not reachable from this host, though the control plane has it live and the other brokers answer (%s did): is its advertised address %s reachable from here (felix broker --advertise)?", b.name(), b.othersUp, b.Addr)
	case b.othersUp != "":
		return fmt.Sprintf("%s is down or unreachable; the other brokers answer (%s did)", b.name(), b.othersUp)
	case b.ID == "":
		return fmt.Sprintf("%s is not reachable: is it running, and is --broker right?", b.name())
	}
	return fmt.Sprintf("%s is not reachable: is `felix dev` running?", b.name())
}

// refusalOf returns the reason broker b gave for refusing the
// connection (it answered, closing it with a wire code: a revoked
// certificate or one of another role, a limit, no map yet), or nil.
func refusalOf(b *brokerError) *transport.Error {
	var dialErr *client.DialError
	var refusal *transport.Error
	if errors.As(b, &dialErr) && errors.As(dialErr.Err, &refusal) {
		return refusal
	}
	return nil
}

// refusedAll reports whether every broker of errs refused the connection
// with the same code.
func refusedAll(errs []*brokerError) bool {
	first := refusalOf(errs[0])
	for _, b := range errs {
		if r := refusalOf(b); r == nil || first == nil || r.Code != first.Code {
			return false
		}
	}
	return true
}

// tlsProblem reports whether err comes from certificate verification.
func tlsProblem(err error) bool {
	var (
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		invalid x509.CertificateInvalidError
		host    x509.HostnameError
	)
	return errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &invalid) || errors.As(err, &host)
}

func shardName(stream string, pubErr *client.PublishError) string {
	switch {
	case stream == "":
		return "the shard"
	case pubErr != nil && pubErr.Shard >= 0:
		return fmt.Sprintf("%s/%d", stream, pubErr.Shard)
	}
	return stream
}

// negativeValue matches the parser's complaint about a value that starts
// with '-' ("--from: expected string value but got "-5" (short flag)...").
var negativeValue = regexp.MustCompile(`^--([a-z-]+): expected \w+ value but got "(-[^"]*)" \(short flag\)`)

// parseMessage is the sentence for an error of the command line parser.
func parseMessage(err error) string {
	if m := negativeValue.FindStringSubmatch(err.Error()); m != nil {
		switch m[1] {
		case "from":
			return fmt.Sprintf("--from must be earliest, latest or an offset (0 or more), got %s", m[2])
		case "shard":
			return fmt.Sprintf("--shard must be a shard number (0 or more), got %s", m[2])
		}
		return fmt.Sprintf("--%s %s: a value starting with '-' reads as a flag; if you mean it, write --%s=%s", m[1], m[2], m[1], m[2])
	}
	return err.Error()
}
