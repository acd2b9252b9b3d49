package broker

import (
	"errors"
	"fmt"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// authorize returns nil when from may do action on stream under the policy
// of map m, and an unauthorized wire error otherwise, logged once per
// principal, action and stream. Peers are authorized for nothing a client
// may ask: they only forward, which the publish path checks by itself.
//
// Authorization happens here, at the broker the client is connected to,
// before anything is routed or forwarded; the owner trusts its peer's
// check (the peer is authenticated by its node certificate).
func (b *Broker) authorize(m *shardmap.Map, from caller, action auth.Action, stream string) *transport.Error {
	err := m.ACL.Check(from.principal, action, stream)
	if err == nil {
		return nil
	}
	var denied *auth.Denied
	if errors.As(err, &denied) && from.principal == "" {
		err = fmt.Errorf("peer %q may not %s: peers only forward", from.peerID, action)
	}
	// Callers refused a stream name no stream can have (checkStreamName)
	// already; clipped all the same, so that what the denial set keeps
	// and the log writes stays small whatever a caller passes.
	act, name := clipped(string(action)), clipped(stream)
	if b.denials.First(from.principal + "\x00" + from.peerID + "\x00" + act + "\x00" + name) {
		b.log.Warn("denied", "principal", from.principal, "peer", from.peerID, "action", act, "stream", name)
	}
	// Not counted in felix_errors_total here: the caller counts the
	// answer it writes (once).
	return transport.Errorf(transport.CodeUnauthorized, "%w", err)
}

// checkStreamName refuses, as invalid, a stream name no stream can have
// (shardmap.ValidateStreamName: at most MaxStreamName bytes of letters,
// digits, '-', '_' and '.'). Publish, subscribe and replica status call it
// before they authorize: a refusal names the stream in its message, and
// the denial is remembered and logged once per stream name (up to 4096 of
// them), so a name of a megabyte, a new one each time, was kept, logged
// and echoed back whole. The message quotes at most MaxStreamName bytes
// of it.
func checkStreamName(name string) *transport.Error {
	if err := shardmap.ValidateStreamName(name); err != nil {
		// ValidateStreamName quotes no name over MaxStreamName bytes.
		return transport.Errorf(transport.CodeInvalid, "%v", err)
	}
	return nil
}

// clipped returns s, cut to MaxStreamName bytes (with its length said)
// when longer: how a string a client sent is logged or echoed.
func clipped(s string) string {
	if len(s) <= shardmap.MaxStreamName {
		return s
	}
	return fmt.Sprintf("%s... (%d bytes)", s[:shardmap.MaxStreamName], len(s))
}
