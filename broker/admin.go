package broker

import (
	"github.com/felix-broker/felix/auth"

	"context"
	"errors"
	"fmt"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/transport"
)

// serveRequest answers one admin request: the shard map from this broker's
// own copy, everything else by relaying to the control plane.
//
// A relayed request carries the client's principal, and the control plane
// authorizes that principal, never this broker. A peer makes no admin
// requests; it asks only to admit its replica (opReplicaAdmit).
func (b *Broker) serveRequest(s *quic.Stream, req *transport.Request, from caller) {
	defer s.Close()
	// One request per stream: what a client sends after it is never read,
	// and must not sit in the connection's flow-control window.
	defer s.CancelRead(0)
	w := transport.NewWriter(s)
	if req.Op == opReplicaAdmit {
		b.serveAdmit(w, req, from)
		return
	}
	if from.principal == "" {
		w.Write(b.authorize(b.member.Map(), from, auth.Action(req.Op), ""))
		return
	}
	if req.Op == opReplicaSettled {
		// A broker's own request to the control plane, never a client's
		// to relay.
		w.Write(&transport.Error{Code: transport.CodeUnauthorized, Message: fmt.Sprintf("%s is a broker's own request", req.Op)})
		return
	}
	if req.Op == "map.get" {
		w.Write(&transport.Response{Map: b.member.Map().VisibleTo(from.principal)})
		return
	}
	if req.Op == opReplicaStatus {
		m := b.member.Map()
		if err := b.authorize(m, from, auth.Subscribe, req.Stream.Name); err != nil {
			w.Write(err)
			return
		}
		w.Write(&transport.Response{Replicas: b.replicaStates(req.Stream.Name)})
		return
	}
	req.Principal = from.principal
	ctx, cancel := context.WithTimeout(b.ctx, b.cfg.ForwardTimeout)
	defer cancel()
	resp, err := b.member.Request(ctx, req)
	if err != nil {
		var werr *transport.Error
		if !errors.As(err, &werr) {
			werr = &transport.Error{Code: transport.CodeUnavailable,
				Message: fmt.Sprintf("%s could not reach the control plane: %v", b.cfg.NodeID, err)}
		}
		w.Write(werr)
		return
	}
	w.Write(resp)
}
