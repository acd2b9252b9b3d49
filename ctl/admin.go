package ctl

import (
	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// Admin operations, the values of transport.Request.Op.
const (
	OpStreamCreate  = "stream.create"
	OpStreamDelete  = "stream.delete"
	OpStreamList    = "stream.list"
	OpStreamInfo    = "stream.info"
	OpMapGet        = "map.get"
	OpClusterStatus = "cluster.status"
)

// serveAdmin answers one admin request with a Response or an Error and
// closes the stream. Any certificate the cluster CA signed may ask: node
// certificates (brokers proxying their clients) and client certificates.
func (s *Server) serveAdmin(conn *quic.Conn, str *quic.Stream, w *transport.Writer, req *transport.Request) {
	defer str.Close()
	defer str.CancelRead(streamCodeDone)
	var resp *transport.Response
	var err error
	if _, idErr := transport.PeerIdentity(conn); idErr != nil {
		err = transport.Errorf(transport.CodeUnauthorized, "admin request %q needs a client or node certificate: %v", req.Op, idErr)
	} else {
		resp, err = s.handle(req)
	}
	if err != nil {
		we := wireError(err)
		if we.Epoch == 0 {
			we.Epoch = s.Map().Epoch
		}
		_ = w.Write(we)
		return
	}
	_ = w.Write(resp)
}

// handle executes an admin request.
func (s *Server) handle(req *transport.Request) (*transport.Response, error) {
	switch req.Op {
	case OpStreamCreate:
		if err := s.CreateStream(req.Stream); err != nil {
			return nil, err
		}
		st, _ := s.Map().Stream(req.Stream.Name)
		return &transport.Response{Streams: streamConfigs(st), Map: s.Map()}, nil
	case OpStreamDelete:
		if err := s.DeleteStream(req.Stream.Name); err != nil {
			return nil, err
		}
		return &transport.Response{Map: s.Map()}, nil
	case OpStreamList:
		return &transport.Response{Streams: s.Streams()}, nil
	case OpStreamInfo:
		m := s.Map()
		st, ok := m.Stream(req.Stream.Name)
		if !ok {
			return nil, transport.Errorf(transport.CodeUnknownStream, "stream %q: %w (map epoch %d)", req.Stream.Name, ErrUnknownStream, m.Epoch)
		}
		return &transport.Response{Streams: streamConfigs(st), Map: m}, nil
	case OpMapGet, OpClusterStatus:
		return &transport.Response{Map: s.Map()}, nil
	}
	return nil, transport.Errorf(transport.CodeInvalid, "unknown admin op %q (want one of %s, %s, %s, %s, %s, %s)",
		req.Op, OpStreamCreate, OpStreamDelete, OpStreamList, OpStreamInfo, OpMapGet, OpClusterStatus)
}

func streamConfigs(st *shardmap.Stream) []shardmap.StreamConfig {
	if st == nil {
		return nil
	}
	return []shardmap.StreamConfig{st.StreamConfig}
}
