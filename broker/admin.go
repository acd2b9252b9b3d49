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
	// An answer may carry the whole map (map.get, and stream.create,
	// stream.info, stream.move, cluster.status... from the control
	// plane), which outgrows the default frame limit long before the
	// control plane's own limit on maps.
	w.SetMaxFrame(transport.MaxMapFrame)
	b.answer(w, req, from, b.adminAnswer(req, from))
}

// adminAnswer returns the answer to an admin request, a Response or an
// Error: see serveRequest.
func (b *Broker) adminAnswer(req *transport.Request, from caller) transport.Frame {
	if from.principal == "" {
		if err := b.authorize(b.member.Map(), from, auth.Action(req.Op), ""); err != nil {
			b.tel.countError(err.Code)
			return err
		}
	}
	if req.Op == opReplicaSettled {
		// A broker's own request to the control plane, never a client's
		// to relay.
		return &transport.Error{Code: transport.CodeUnauthorized, Message: fmt.Sprintf("%s is a broker's own request", req.Op)}
	}
	if req.Op == "map.get" {
		return &transport.Response{Map: b.member.Map().VisibleTo(from.principal)}
	}
	if req.Op == opReplicaStatus {
		if err := checkStreamName(req.Stream.Name); err != nil {
			b.tel.countError(err.Code)
			return err
		}
		m := b.member.Map()
		if err := b.authorize(m, from, auth.Subscribe, req.Stream.Name); err != nil {
			b.tel.countError(err.Code)
			return err
		}
		return &transport.Response{Replicas: b.replicaStates(req.Stream.Name)}
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
		return werr
	}
	return resp
}

// answer writes f, the answer to req. An answer that does not encode
// (over transport.MaxMapFrame: a map larger than the control plane
// sends) is logged and replaced by an Error saying so, with the code the
// Writer gave (frame_too_large), so that the client learns why and,
// for a change, that the control plane made it. A stream that fails (the
// client gone) is logged only.
func (b *Broker) answer(w *transport.Writer, req *transport.Request, from caller, f transport.Frame) {
	err := w.Write(f)
	if err == nil {
		return
	}
	var werr *transport.Error
	if !errors.As(err, &werr) {
		b.log.Debug("admin answer not sent", "op", req.Op, "principal", from.principal, "err", err)
		return
	}
	b.log.Warn("admin answer too large to send; answered with an error", "op", req.Op, "principal", from.principal, "err", err)
	what := "the answer"
	if _, ok := f.(*transport.Response); ok && req.Op != "map.get" && req.Op != opReplicaStatus {
		what = "the control plane's answer (for a change: it was made)"
	}
	if err := w.Write(&transport.Error{Code: werr.Code, Message: fmt.Sprintf("%s: %s could not send %s: %s", req.Op, b.cfg.NodeID, what, werr.Message)}); err != nil {
		b.log.Debug("admin answer not sent", "op", req.Op, "principal", from.principal, "err", err)
	}
}
