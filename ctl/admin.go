package ctl

import (
	"fmt"
	"strings"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// ctlPrincipal is who a change forwarded by another ctl for itself acts
// as: the control plane, allowed everything. It cannot be a certificate's
// name (a NUL byte), and is never sent: a forwarding ctl sends no
// principal.
const ctlPrincipal = "\x00ctl"

// memberPrincipal is who a broker's own map.get acts as (no principal
// relayed: ctlclient.Member.Refresh asking for a map newer than its
// registration stream brought): a member of the cluster, which reads the
// whole map, ACL included, as the registration stream pushes it. It
// allows nothing else, and only a broker that advertises
// transport.FeatureMemberMapGet has it (see memberMapGet). Like
// ctlPrincipal, no certificate can name it and it is never sent.
const memberPrincipal = "\x00member"

// Admin operations, the values of transport.Request.Op. OpStreamMove
// moves a replica of a replicated shard from a broker that is down to
// another (transport.Request.Move, see moves.go); OpClusterRemove
// removes a broker that is down and holds nothing from the members
// (transport.Request.NodeID, see remove.go). Both need cluster.admin.
const (
	OpStreamCreate  = "stream.create"
	OpStreamDelete  = "stream.delete"
	OpStreamList    = "stream.list"
	OpStreamInfo    = "stream.info"
	OpStreamMove    = "stream.move"
	OpMapGet        = "map.get"
	OpClusterStatus = "cluster.status"
	OpClusterRemove = "cluster.remove"
	OpACLGrant      = "acl.grant"
	OpACLRevoke     = "acl.revoke"
	OpACLList       = "acl.list"
	// OpReplicaSettled is a broker saying that its replica moved in by a
	// move (transport.Request.Move: To the broker, ID the move) is a
	// voter in its slot's place; only that broker may say so.
	OpReplicaSettled = "replica.settled"
)

// serveAdmin answers one admin request with a Response or an Error and
// closes the stream. The request is authorized for its principal: the
// client certificate's name on a client's own connection, or, on a
// broker's connection (node certificate), the principal the broker relays
// for its client. A broker is never a principal itself; with no principal
// relayed it may only read the map it is pushed (map.get), as a member,
// if it advertises transport.FeatureMemberMapGet.
func (s *Server) serveAdmin(conn *quic.Conn, str *quic.Stream, w *transport.Writer, req *transport.Request) {
	defer str.Close()
	defer str.CancelRead(streamCodeDone)
	if req.Op == OpReplicaSettled {
		s.serveSettled(conn, w, req)
		return
	}
	var resp *transport.Response
	principal, err := s.requestPrincipal(conn, req)
	if err == nil {
		resp, err = s.handle(principal, req)
	}
	if err != nil {
		we := wireError(err)
		if we.Epoch == 0 {
			we.Epoch = s.Map().Epoch
		}
		if we.Code == transport.CodeUnauthorized && s.denials.First(principal+"\x00"+req.Op) {
			s.log.Warn("admin request denied", "principal", principal, "op", req.Op, "err", we.Message)
		}
		_ = w.Write(we)
		return
	}
	_ = w.Write(resp)
}

// requestPrincipal returns who an admin request on conn acts for.
func (s *Server) requestPrincipal(conn *quic.Conn, req *transport.Request) (string, error) {
	id, err := transport.PeerIdentity(conn)
	if err != nil {
		return "", transport.Errorf(transport.CodeUnauthorized, "admin request %q needs a node or ctl certificate: %v", req.Op, err)
	}
	// A client certificate's connection was refused (connRefusal): a
	// client's requests come relayed by a broker, for its principal.
	switch id.Role {
	case transport.RoleCtl:
		// Another ctl forwarding a change to the leader: for its client's
		// principal, or for itself (an in-process call on that ctl).
		if req.Principal == "" {
			return ctlPrincipal, nil
		}
		return req.Principal, nil
	case transport.RoleNode:
		switch p := req.Principal; {
		case p == "" && req.Op == OpMapGet && s.memberMapGet(conn, id.Name):
			// The broker's own request (Member.Refresh): the map its
			// registration would be pushed.
			return memberPrincipal, nil
		case p == "":
			return "", transport.Errorf(transport.CodeUnauthorized,
				"broker %q relayed admin request %q without its client's principal; a broker's certificate is not a principal", id.Name, req.Op)
		case strings.ContainsRune(p, 0) || len(p) > transport.MaxNameLen:
			// No certificate names such a principal
			// (transport.CertIdentity); ctlPrincipal and memberPrincipal
			// are such.
			return "", transport.Errorf(transport.CodeUnauthorized, "broker %q relayed admin request %q for a principal no certificate can name", id.Name, req.Op)
		}
		return req.Principal, nil
	}
	return "", transport.Errorf(transport.CodeUnauthorized, "a %s certificate (%q) cannot make admin requests", id.Role, id.Name)
}

// memberMapGet reports whether node's own map.get on conn is answered:
// conn carries the node's registration with this ctl, made with
// transport.FeatureMemberMapGet (the features of the registration on the
// same connection are those of the process asking). A broker of an
// earlier version asks map.get again at once whenever it is answered
// (its Refresh loop), so it is refused, as earlier ctls refused it, and
// waits its poll interval.
func (s *Server) memberMapGet(conn *quic.Conn, node string) bool {
	v, ok := s.mapGetConns.Load(conn)
	return ok && v.(*session).node == node
}

// handle executes an admin request for principal.
func (s *Server) handle(principal string, req *transport.Request) (*transport.Response, error) {
	if !transport.ValidID(req.ID) {
		return nil, transport.Errorf(transport.CodeInvalid, "%s: request id %.80q: want up to %d letters, digits, '-' and '_'", req.Op, req.ID, transport.MaxIDLen)
	}
	o := origin{principal: principal, id: req.ID}
	m := s.Map()
	need := func(a auth.Action, stream string) error {
		if principal == ctlPrincipal {
			return nil // the control plane itself, forwarding its own change
		}
		if err := m.ACL.Check(principal, a, stream); err != nil {
			return transport.Errorf(transport.CodeUnauthorized, "%w", err)
		}
		return nil
	}
	switch req.Op {
	case OpStreamList, OpStreamInfo, OpMapGet, OpClusterStatus, OpACLList:
		if err := s.cutOffErr(); err != nil {
			// A read answers from this ctl's map, which may be stale;
			// another ctl's is not. (A change is forwarded to the leader.)
			return nil, transport.Errorf(transport.CodeUnavailable, "%v: its map (epoch %d) may be stale; ask another ctl", err, m.Epoch)
		}
	}
	switch req.Op {
	case OpStreamCreate:
		if err := need(auth.StreamAdmin, req.Stream.Name); err != nil {
			return nil, err
		}
		if err := s.createStream(o, req.Stream); err != nil {
			return nil, err
		}
		m = s.Map()
		st, _ := m.Stream(req.Stream.Name)
		return &transport.Response{Streams: streamConfigs(st), Map: m.VisibleTo(principal)}, nil
	case OpStreamDelete:
		if err := need(auth.StreamAdmin, req.Stream.Name); err != nil {
			return nil, err
		}
		if err := s.deleteStream(o, req.Stream.Name); err != nil {
			return nil, err
		}
		return &transport.Response{Map: s.Map().VisibleTo(principal)}, nil
	case OpStreamMove:
		// Cluster-wide: it decides which brokers hold a stream's data.
		if err := need(auth.ClusterAdmin, ""); err != nil {
			return nil, err
		}
		if req.Move == nil {
			return nil, wireError(fmt.Errorf("%w: %s of stream %q names no shard or broker to move from (the request carries no move)", ErrInvalid, req.Op, req.Stream.Name))
		}
		mv, err := s.moveReplica(o, req.Stream.Name, req.Move.Shard, req.Move.From, req.Move.To)
		if err != nil {
			return nil, err
		}
		m = s.Map()
		st, _ := m.Stream(req.Stream.Name)
		return &transport.Response{Streams: streamConfigs(st), Map: m.VisibleTo(principal), Moved: &mv}, nil
	case OpClusterRemove:
		if err := need(auth.ClusterAdmin, ""); err != nil {
			return nil, err
		}
		if err := s.removeBroker(o, req.NodeID); err != nil {
			return nil, err
		}
		// The map tells a follower that forwarded the request which epoch
		// to wait for before it answers (forward).
		return &transport.Response{Map: s.Map().VisibleTo(principal)}, nil
	case OpReplicaSettled:
		// Reaches handle only from a ctl that forwarded a broker's report
		// and became the leader meanwhile (serveSettled checked the
		// broker); never for a client.
		if principal != ctlPrincipal {
			return nil, transport.Errorf(transport.CodeUnauthorized, "%s is sent by brokers only", req.Op)
		}
		if req.Move == nil || req.Move.ID == 0 {
			return nil, transport.Errorf(transport.CodeInvalid, "%s names no move", req.Op)
		}
		if err := s.settleMove(req.Stream.Name, req.Move.Shard, req.Move.To, req.Move.ID); err != nil {
			return nil, err
		}
		return &transport.Response{Map: s.Map()}, nil
	case OpStreamList:
		var out []shardmap.StreamConfig
		for _, st := range m.VisibleTo(principal).Streams {
			out = append(out, st.StreamConfig)
		}
		return &transport.Response{Streams: out}, nil
	case OpStreamInfo:
		if !m.ACL.Sees(principal, req.Stream.Name) {
			return nil, need(auth.ClusterRead, "") // says what would be needed
		}
		st, ok := m.Stream(req.Stream.Name)
		if !ok {
			return nil, transport.Errorf(transport.CodeUnknownStream, "stream %q: %w (map epoch %d)", req.Stream.Name, ErrUnknownStream, m.Epoch)
		}
		return &transport.Response{Streams: streamConfigs(st), Map: m.VisibleTo(principal)}, nil
	case OpMapGet:
		if principal == memberPrincipal {
			return &transport.Response{Map: m}, nil
		}
		return &transport.Response{Map: m.VisibleTo(principal)}, nil
	case OpClusterStatus:
		if err := need(auth.ClusterRead, ""); err != nil {
			return nil, err
		}
		return &transport.Response{Map: m.VisibleTo(principal), Ctl: s.ctlMembers()}, nil
	case OpACLList:
		if err := need(auth.ClusterRead, ""); err != nil {
			return nil, err
		}
		return &transport.Response{Grants: m.ACL.Grants}, nil
	case OpACLGrant, OpACLRevoke:
		if err := need(auth.ClusterAdmin, ""); err != nil {
			return nil, err
		}
		var err error
		if req.Op == OpACLGrant {
			err = s.grant(o, req.Grant)
		} else {
			err = s.revoke(o, req.Grant)
		}
		if err != nil {
			return nil, err
		}
		// The map, as for a stream change, tells a follower that forwarded
		// the request which epoch to wait for before it answers (forward).
		m = s.Map()
		return &transport.Response{Grants: m.ACL.Grants, Map: m.VisibleTo(principal)}, nil
	}
	return nil, transport.Errorf(transport.CodeInvalid, "unknown admin op %q (want one of %s)", req.Op,
		strings.Join([]string{OpStreamCreate, OpStreamDelete, OpStreamList, OpStreamInfo, OpStreamMove, OpMapGet, OpClusterStatus, OpClusterRemove, OpACLGrant, OpACLRevoke, OpACLList}, ", "))
}

func streamConfigs(st *shardmap.Stream) []shardmap.StreamConfig {
	if st == nil {
		return nil
	}
	return []shardmap.StreamConfig{st.StreamConfig}
}
