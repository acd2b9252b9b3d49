package broker

import (
	"context"
	"errors"
	"fmt"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/transport"
)

// serveRequest answers one admin request: the shard map from this broker's
// own copy, everything else by relaying to the control plane.
func (b *Broker) serveRequest(s *quic.Stream, req *transport.Request) {
	defer s.Close()
	w := transport.NewWriter(s)
	if req.Op == "map.get" {
		w.Write(&transport.Response{Map: b.member.Map()})
		return
	}
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
