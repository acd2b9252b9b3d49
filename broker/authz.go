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
	if b.denials.First(from.principal + "\x00" + from.peerID + "\x00" + string(action) + "\x00" + stream) {
		b.log.Warn("denied", "principal", from.principal, "peer", from.peerID, "action", action, "stream", stream)
	}
	b.tel.countError(transport.CodeUnauthorized)
	return transport.Errorf(transport.CodeUnauthorized, "%w", err)
}
