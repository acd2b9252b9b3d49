package ctl

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// # Moving a replica
//
// A replicated shard's replica set is fixed when the shard is placed. A
// move (stream.move) gives one broker's replica of one shard to another
// broker, for a broker lost for good: the map that makes it names the
// target in the source's place and raft slot ([shardmap.Placement.Move]),
// the target opens an empty replica and joins the shard's group (a
// learner caught up from the leader, then a voter in the source's slot),
// and the source, should it ever come back, removes its replica (package
// broker does both).
//
// The source's replica leaves the group as soon as the map changes, while
// the group's configuration still counts it until the target replaces it,
// and the source's broker removes its copy when it comes back. So a move
// is made only when the group can do without the source's copy:
//   - the source is down (its lease lapsed): a live one is refused, as
//     moving it would lower the shard's redundancy while the target
//     catches up;
//   - the shard's other replicas are live, and voters of the group:
//     they are the quorum that admits the target, and between them they
//     hold every committed record (each is on a majority of the three).
//     A lease says only that a broker runs; whether its replica votes
//     (it may be rejoining, in place of one lost with its data) the
//     broker says with its heartbeats (transport.ReplicaReport, kept in
//     its live/ key), and a broker that advertises
//     transport.FeatureReplicaReports and has not reported since it
//     registered counts as not a voter (state.notVoter);
//   - no other replica of the shard is being moved: a move is pending
//     until its target, a voter, says so (replica.settled, which only the
//     target may send); until then only the pending slot itself moves
//     again, should its target be lost too. Two slots whose old members
//     the group still counts while their brokers dropped out would leave
//     one replica to hold the shard.
// The target must be a live member that holds no replica of the shard.
//
// A moved placement is encoded in a shape that versions before moves
// cannot decode: a broker of such a version fails to decode every map
// from the first that holds one, so its registration fails over and over,
// its lease lapses, and all its shards (replicated or not) go
// unavailable; a ctl of such a version can no longer load the state from
// etcd, nor lead. So during a rolling upgrade, a move is refused until
// every live broker has registered with transport.FeatureReplicaMoves
// (shardmap.Node.Features) and every running ctl advertises it in its
// ctl/ entry (ctlInfo.Features). A member that is down is not checked (the
// broker moved from is, typically): one of an earlier version that comes
// back after a move cannot read the map until it is upgraded.

// moveReplica gives from's replica of shard of the stream named name to
// to, and returns to: when to is "", the live member without a replica of
// the shard that rendezvous hashing ranks highest for it
// ([shardmap.Top]). It refuses (ErrInvalid) a shard the stream does not
// have, a stream of replication factor 1, a from that holds no replica of
// the shard or is live, and a to that holds one, is not a member or is
// not live; the refusals of the placement itself also match
// shardmap.ErrBadMove. It refuses (ErrInvalid) any move while a live
// member has not registered with transport.FeatureReplicaMoves, naming
// them: a broker of an earlier version cannot read the map the move
// makes (see "Moving a replica" above). Down members are not checked: one
// of an earlier version that comes back cannot read the map until it is
// upgraded.
func (s *state) moveReplica(name string, shard int, from, to string) (string, error) {
	st, ok := s.streams[name]
	if !ok {
		return "", fmt.Errorf("move a replica of stream %q: %w", name, ErrUnknownStream)
	}
	id := shardmap.ShardID{Stream: name, Shard: shard}
	set := st.Placement.Replicas(shard)
	switch {
	case shard < 0 || shard >= st.Shards:
		return "", fmt.Errorf("%w: %w: stream %q has %s, numbered from 0; there is no shard %d",
			ErrInvalid, shardmap.ErrBadMove, name, shardCount(st.Shards), shard)
	case st.Factor() == 1:
		return "", fmt.Errorf("%w: %w: stream %q has replication factor 1: a shard's only replica cannot move (its log would have to be copied); only the replicas of a stream of replication factor 3 move",
			ErrInvalid, shardmap.ErrBadMove, name)
	case from == "":
		return "", fmt.Errorf("%w: move a replica of %s: name the broker whose replica moves (its replicas are %s)", ErrInvalid, id, orNone(set))
	case !slices.Contains(set, from):
		return "", fmt.Errorf("%w: %w: %s holds no replica of %s (its replicas are %s)", ErrInvalid, shardmap.ErrBadMove, from, id, orNone(set))
	case s.live(from) && !s.registered(from):
		return "", fmt.Errorf("%w: move %s's replica of %s: %s is live: the ctl leader that took over holds it live until it registers again or the takeover's registration grace ends; "+
			"if it is stopped, move its replica once the grace is over and it is down", ErrInvalid, from, id, from)
	case s.live(from):
		return "", fmt.Errorf("%w: move %s's replica of %s: %s is live: stop it first (its replica leaves the shard's group as soon as the move is made; "+
			"moving a live broker's replica without lowering the shard's redundancy meanwhile is not supported yet)", ErrInvalid, from, id, from)
	}
	if old := s.liveWithout(transport.FeatureReplicaMoves); len(old) > 0 {
		return "", fmt.Errorf("%w: move %s's replica of %s: %s: upgrade %s first (%s would drop out of the cluster, with all %s shards)",
			ErrInvalid, from, id, earlierVersion(old), plural(old, "it", "them"), plural(old, "it", "they"), plural(old, "its", "their"))
	}
	for _, n := range set {
		if n == from {
			continue
		}
		// Registered now, not held live after a takeover: a member held
		// live may be a process that died with the old leader.
		if !s.registered(n) {
			return "", fmt.Errorf("%w: move %s's replica of %s: %s, another of its replicas, is down: a move needs the shard's other replicas live "+
				"(the replica moved leaves the group at once, and the new one is admitted only by a quorum of the others: with one of them down, the moved replica's copy may be one the shard needs); bring %s back first",
				ErrInvalid, from, id, n, n)
		}
		if why := s.notVoter(n, id, st.Created); why != "" {
			return "", fmt.Errorf("%w: move %s's replica of %s: %s, another of its replicas, %s: a move needs the shard's other replicas voters of its group "+
				"(the new replica is admitted only by a quorum of the others, and the moved replica's copy may be one the shard needs); wait until they are (felixctl stream info %s)",
				ErrInvalid, from, id, n, why, name)
		}
	}
	candidates := s.moveTargets(id, st.Placement)
	if to == "" {
		if len(candidates) == 0 {
			return "", fmt.Errorf("%w: move %s's replica of %s: no live broker without a replica of %s to move it to (live brokers: %s); start one, then move again",
				ErrInvalid, from, id, id, orNone(s.liveIDList()))
		}
		to = candidates[0]
	}
	p, err := st.Placement.Move(shard, from, to, s.epoch+1) // the epoch of the map bump makes
	if err != nil {
		return "", fmt.Errorf("%w: move a replica of %s: %w", ErrInvalid, id, err)
	}
	if _, member := s.members[to]; !member || !s.live(to) {
		what := "is down"
		if !member {
			what = "is not a member of the cluster"
		}
		return "", fmt.Errorf("%w: move %s's replica of %s to %s: %s %s; move it to a live broker without a replica of it (%s)",
			ErrInvalid, from, id, to, to, what, orNone(candidates))
	}
	st.Placement = p
	s.streams[name] = st
	s.bump()
	return to, nil
}

// notVoter says why member n's replica of shard id (of a stream created
// at epoch created) may not be a voter of its group, as n's replica
// reports say (transport.ReplicaReport), "" if they say it is one. A
// broker of an earlier version reports nothing and is not checked: the
// client's check before it asks for a move is all there is then
// (client.Client.MoveReplica).
func (s *state) notVoter(n string, id shardmap.ShardID, created uint64) string {
	m := s.members[n]
	if m == nil || !slices.Contains(m.node.Features, transport.FeatureReplicaReports) {
		return ""
	}
	switch r := m.report; {
	case r == nil:
		return "has not yet said where its replicas stand since it registered (its first report comes within a heartbeat; a control plane of an earlier version holding its registration drops them)"
	case r.Applied < created:
		return fmt.Sprintf("has not yet reported on the stream's replicas (its last report is of the map of epoch %d, the stream's first is %d)", r.Applied, created)
	case slices.Contains(r.Unready, id):
		return "holds a replica that is not a voter of the group: joining in place of one lost with its data, or failed"
	case r.More:
		return fmt.Sprintf("reports more than %d replicas that are not voters of their groups", transport.MaxUnreadyReported)
	}
	return ""
}

// settleMove records that node, the target of shard's pending move id of
// the stream named name, is a voter in its slot's place, so that another
// replica of the shard may move. A report of a move that is not the
// pending one (settled already, or replaced by a later move) changes
// nothing.
func (s *state) settleMove(name string, shard int, node string, id uint64) error {
	st, ok := s.streams[name]
	if !ok {
		return fmt.Errorf("settle a move of stream %q: %w", name, ErrUnknownStream)
	}
	if n, pending := st.Placement.Pending(shard); pending == 0 || pending != id || n != node {
		return nil
	}
	st.Placement = st.Placement.Settle(shard, id)
	s.streams[name] = st
	s.bump()
	return nil
}

// registered reports whether id is a live member with a registration
// this leader counts (not one held live after a takeover until it
// registers again).
func (s *state) registered(id string) bool {
	m, ok := s.members[id]
	return ok && m.node.Live && m.session != 0
}

// live reports whether id is a member whose lease is current.
func (s *state) live(id string) bool {
	m, ok := s.members[id]
	return ok && m.node.Live
}

// liveIDList returns the ids of the live members, sorted.
func (s *state) liveIDList() []string {
	var ids []string
	for _, id := range slices.Sorted(maps.Keys(s.members)) {
		if s.members[id].node.Live {
			ids = append(ids, id)
		}
	}
	return ids
}

// liveWithout returns the ids of the live members that did not register
// with feature, sorted.
func (s *state) liveWithout(feature string) []string {
	var ids []string
	for _, id := range s.liveIDList() {
		if !s.members[id].node.Supports(feature) {
			ids = append(ids, id)
		}
	}
	return ids
}

// earlierVersion says that the members named run a version that cannot
// read a moved placement.
func earlierVersion(names []string) string {
	return fmt.Sprintf("%s %s a version that cannot read a moved placement", strings.Join(names, ", "), plural(names, "runs", "run"))
}

// plural returns one for a single name, many for several.
func plural(names []string, one, many string) string {
	if len(names) == 1 {
		return one
	}
	return many
}

// moveTargets returns the live members that hold no replica of id and
// that its placement p lets the shard's move go to (not back where a
// pending move came from: Placement.MayMoveTo), the one rendezvous
// hashing ranks highest for the shard first.
func (s *state) moveTargets(id shardmap.ShardID, p shardmap.Placement) []string {
	live, set := s.liveIDList(), p.Replicas(id.Shard)
	var out []string
	for _, n := range shardmap.Top(id.Stream, id.Shard, len(live), live) {
		if !slices.Contains(set, n) && p.MayMoveTo(id.Shard, n) {
			out = append(out, n)
		}
	}
	return out
}

// orNone joins ids with ", ", or says "none".
func orNone(ids []string) string {
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, ", ")
}

// shardCount says "1 shard" or "n shards".
func shardCount(n int) string {
	if n == 1 {
		return "1 shard"
	}
	return fmt.Sprintf("%d shards", n)
}

// MoveReplica gives from's replica of shard of stream to the broker to
// ("" lets the control plane choose: the live broker without a replica of
// the shard that rendezvous hashing ranks highest for it), persists the
// change and pushes the new map, in which to holds the replica in from's
// place: to opens an empty replica and joins the shard's raft group,
// caught up from its leader. From must not be live (a broker down, or
// lost for good): a live one is refused, to be stopped first, and so is
// any move while a live broker or a running ctl is of a version that
// cannot read the map the move makes (see "Moving a replica" in
// moves.go). Errors are *transport.Error values (CodeUnknownStream,
// CodeInvalid, CodeUnavailable, CodeInternal) that also match
// ErrUnknownStream and ErrInvalid, and, for a move the placement
// refuses, shardmap.ErrBadMove. On a follower the change is made by the
// leader.
func (s *Server) MoveReplica(stream string, shard int, from, to string) error {
	_, err := s.moveReplica(origin{principal: ctlPrincipal}, stream, shard, from, to)
	return err
}

// moveReplica is MoveReplica for principal, and returns the move made,
// with the broker the replica moved to.
func (s *Server) moveReplica(o origin, stream string, shard int, from, to string) (transport.ReplicaMove, error) {
	mv := transport.ReplicaMove{Shard: shard, From: from, To: to}
	// The ctl making the change checks its peers (a follower too, before
	// it forwards: the leader checks again). Read before the lock is
	// taken; a ctl of an earlier version that starts after the read is
	// no different from one that starts after the move.
	old, err := s.ctlsWithout(transport.FeatureReplicaMoves)
	if err != nil {
		return transport.ReplicaMove{}, transport.Errorf(transport.CodeUnavailable, "replica move: cannot check the versions of the control plane's members: %v", err)
	}
	if len(old) > 0 {
		return transport.ReplicaMove{}, wireError(fmt.Errorf("%w: move %s's replica of %s/%d: control plane member %s: upgrade %s first (%s could no longer load the cluster's state from etcd, nor lead)",
			ErrInvalid, from, stream, shard, earlierVersion(old), plural(old, "it", "them"), plural(old, "it", "they")))
	}
	req := &transport.Request{Op: OpStreamMove, Stream: shardmap.StreamConfig{Name: stream}, Move: &mv, Principal: o.principal, ID: o.id}
	moved := to
	resp, err := s.changeOrForward("replica moved", req, func(st *state) (err error) {
		moved, err = st.moveReplica(stream, shard, from, to)
		req.Move.To = moved // what the request's ID remembers
		return err
	})
	if err != nil {
		return transport.ReplicaMove{}, err
	}
	if resp != nil { // the leader made it, and says where to
		if resp.Moved == nil {
			return transport.ReplicaMove{}, transport.Errorf(transport.CodeInternal, "replica moved: the ctl leader's answer does not say where to (is it of an earlier version?)")
		}
		moved = resp.Moved.To
	}
	mv.To = moved
	s.log.Info("replica moved", "stream", stream, "shard", shard, "from", from, "to", moved, "epoch", s.Map().Epoch)
	return mv, nil
}

// serveSettled answers a broker's replica.settled: the sender's node
// certificate must name the move's target (a ctl forwarding it for a
// broker it checked is trusted).
func (s *Server) serveSettled(conn *quic.Conn, w *transport.Writer, req *transport.Request) {
	id, err := transport.PeerIdentity(conn)
	switch {
	case err != nil:
		err = transport.Errorf(transport.CodeUnauthorized, "%s needs a node certificate: %v", OpReplicaSettled, err)
	case req.Principal != "":
		// Relayed by a broker for one of its clients: only a broker's own
		// request may settle a move (a client relayed it and was answered
		// with the whole map, ACL included).
		err = transport.Errorf(transport.CodeUnauthorized, "%s is a broker's own request; %q may not make it", OpReplicaSettled, req.Principal)
	case req.Move == nil || req.Move.ID == 0:
		err = transport.Errorf(transport.CodeInvalid, "%s names no move", OpReplicaSettled)
	case id.Role == transport.RoleCtl:
	case id.Role != transport.RoleNode || id.Name != req.Move.To:
		err = transport.Errorf(transport.CodeUnauthorized, "%s %q cannot settle a move to %q: only the broker moved to can", id.Role, id.Name, req.Move.To)
	}
	if err == nil {
		err = s.settleMove(req.Stream.Name, req.Move.Shard, req.Move.To, req.Move.ID)
	}
	if err != nil {
		_ = w.Write(wireError(err))
		return
	}
	_ = w.Write(&transport.Response{Map: s.Map()})
}

// settleMove records that node, the target of move id of shard of
// stream, is a voter (see state.settleMove), persists it and pushes the
// map.
func (s *Server) settleMove(stream string, shard int, node string, id uint64) error {
	req := &transport.Request{Op: OpReplicaSettled, Stream: shardmap.StreamConfig{Name: stream},
		Move: &transport.ReplicaMove{Shard: shard, To: node, ID: id}}
	before := s.Map().Epoch
	err := s.change("replica move settled", req, func(st *state) error { return st.settleMove(stream, shard, node, id) })
	if err == nil && s.Map().Epoch != before {
		s.log.Info("replica move settled: the replica moved is a voter", "stream", stream, "shard", shard, "node", node, "move", id, "epoch", s.Map().Epoch)
	}
	return err
}
