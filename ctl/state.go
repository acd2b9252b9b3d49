package ctl

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// Errors of the deterministic core. The server turns them into wire error
// codes (see errorCode); callers of Server methods can also match them.
var (
	// ErrStreamExists is returned when creating a stream whose name is taken.
	ErrStreamExists = errors.New("ctl: stream exists")
	// ErrUnknownStream is returned for a stream the registry does not hold.
	ErrUnknownStream = errors.New("ctl: unknown stream")
	// ErrUnknownGrant is returned when revoking a grant the policy does not
	// hold.
	ErrUnknownGrant = errors.New("ctl: no such grant")
	// ErrLimitExceeded is returned for a change that would pass a limit
	// of the cluster: Config.MaxShardsTotal, Config.MaxGrants, or the
	// size of the map (MapTooLargeError); on the wire it is
	// CodeLimitExceeded.
	ErrLimitExceeded = errors.New("ctl: limit exceeded")
	// ErrInvalid is returned for a request that can never succeed as sent.
	ErrInvalid = errors.New("ctl: invalid request")
	// ErrTooFewMembers is returned when creating a stream whose
	// replication factor is larger than the number of members; on the
	// wire it is CodeReplicationFactor. It matches
	// shardmap.ErrTooFewMembers too.
	ErrTooFewMembers = fmt.Errorf("ctl: %w", shardmap.ErrTooFewMembers)
)

// state is the control plane's deterministic core: members with their
// liveness, the stream registry and the current map. It has no goroutines,
// locks, clocks or I/O, and every change that alters the map bumps the
// epoch and rebuilds the map (bump; bumpPolicy for the policy alone)
// before returning true, so the caller knows to commit and push. Leases are not its business: etcd keeps them (see
// live.go), and the leader tells the core when one begins (register) or
// ends (end).
//
// A registration is identified by a session number chosen by the caller
// (the create revision of its live/ key), so that the end of a
// registration that a newer one of the same node replaced is ignored.
type state struct {
	epoch   uint64
	members map[string]*member
	// streams holds each stream's config and its shards' owners. An owner
	// is assigned by rendezvous hashing over the members when the shard is
	// first placed and then stays: a member that joins later does not take
	// shards that already have an owner, because moving a shard means
	// moving its log (a planned change with handoff, not a side effect of
	// a broker starting). A shard placed while there were no members has
	// owner "" until the first member joins.
	streams map[string]shardmap.Stream
	// policy is who may do what: the persisted grants plus the superusers
	// of the configuration; it rides in every map (versioned by epoch).
	policy *auth.Policy
	cur    *shardmap.Map
	stateLimits
	// sizer measures the map's frame (checkMapSize).
	sizer mapSizer
	// requests are the admin changes made for requests with an ID, oldest
	// first, at most maxRequests: committed with the state, so that a
	// request sent again after its answer was lost is answered, by this
	// leader or the next, as the first one was (see answered). Never
	// changed in place (remember copies), so a checkpoint may share it.
	requests []appliedRequest
	// clusterID is the cluster's ID, in every map (shardmap.Map.Cluster).
	clusterID string
}

// stateLimits are the limits of the cluster the core enforces; 0 means
// the default of each.
type stateLimits struct {
	// maxShardsTotal bounds the shards of all streams together (see
	// Config.MaxShardsTotal); 0 means DefaultMaxShardsTotal.
	maxShardsTotal int
	// maxGrants bounds the grants of the policy (Config.MaxGrants); 0
	// means DefaultMaxGrants.
	maxGrants int
	// maxMapBytes bounds the map's frame an admin change may make
	// (Knobs.MaxMapBytes, checkMapSize); 0 means defaultMaxMapBytes.
	maxMapBytes int
}

// appliedRequest is an admin change made for a request with an ID
// (transport.Request.ID).
type appliedRequest struct {
	ID string
	// What is the request it was made for (requestWhat): the same ID
	// with another request is refused, not taken for a retry.
	What string
	// Result is what the change decided that the request did not say:
	// the broker a replica moved to ("" for other changes).
	Result string
	// Epoch is the epoch the change made.
	Epoch uint64
}

// maxRequests bounds the requests the state remembers; the oldest are
// forgotten first. Admin changes come at human rates: a thousand covers
// far more than the minutes in which a request is sent again.
const maxRequests = 1024

// member is one registered node. A member that goes down keeps its place
// (and its shards) and is only marked not Live; it leaves only when an
// operator removes it, down and holding nothing (removeMember).
type member struct {
	node    shardmap.Node // Live: its lease is current
	session uint64        // current registration; 0 when none
	// report is the replica report of the current registration (its
	// live/ key's), nil until the broker sends one; never persisted.
	report *transport.ReplicaReport
}

// newState returns the core restored from snap: all members not Live until
// they register again, and the epoch bumped once past the persisted one so
// that the first map this incarnation publishes supersedes every map a
// previous one may have pushed.
func newState(snap snapshot, superusers []string) *state {
	s := &state{
		epoch:   snap.Epoch + 1,
		members: make(map[string]*member, len(snap.Members)),
		streams: make(map[string]shardmap.Stream, len(snap.Streams)),
		policy:  auth.NewPolicy(superusers, snap.Grants),
		// The snapshot's slice is shared: remember never changes it in place.
		requests:  snap.Requests,
		clusterID: snap.ClusterID,
	}
	for _, n := range snap.Members {
		n.Live = false
		s.members[n.ID] = &member{node: n}
	}
	for _, st := range snap.Streams {
		s.streams[st.Name] = st
	}
	s.rebuild()
	return s
}

// snapshot returns what is committed to etcd: everything the map is made
// of, so that every ctl builds the same map from it (members with their
// liveness, which the leader derives from the broker leases).
func (s *state) snapshot() snapshot {
	snap := snapshot{Epoch: s.epoch, Grants: s.policy.Grants, Superusers: append([]string{}, s.policy.Superusers...), Requests: s.requests, ClusterID: s.clusterID}
	for _, id := range slices.Sorted(maps.Keys(s.members)) {
		snap.Members = append(snap.Members, s.members[id].node)
	}
	for _, name := range slices.Sorted(maps.Keys(s.streams)) {
		snap.Streams = append(snap.Streams, s.streams[name])
	}
	return snap
}

// Map returns the current map. It is immutable; share it freely.
func (s *state) Map() *shardmap.Map { return s.cur }

// bump advances the epoch and rebuilds the map. Every visible change goes
// through here, so epochs strictly increase.
func (s *state) bump() {
	s.epoch++
	s.rebuild()
}

// bumpPolicy advances the epoch for a change of the policy alone: the
// new map shares the nodes and streams of the last one (a grant places
// nothing), so that its size is measured from its grants alone
// (mapSizer).
func (s *state) bumpPolicy() {
	s.epoch++
	m := *s.cur
	m.Epoch, m.ACL = s.epoch, s.policy
	s.cur = &m
}

func (s *state) rebuild() {
	ids := slices.Sorted(maps.Keys(s.members))
	nodes := make([]shardmap.Node, 0, len(ids))
	for _, id := range ids {
		nodes = append(nodes, s.members[id].node)
	}
	streams := make([]shardmap.Stream, 0, len(s.streams))
	for _, name := range slices.Sorted(maps.Keys(s.streams)) {
		st := s.place(s.streams[name], ids)
		s.streams[name] = st
		streams = append(streams, st)
	}
	s.cur = shardmap.Assemble(s.epoch, nodes, streams)
	s.cur.ACL = s.policy
	s.cur.Cluster = s.clusterID
}

// place returns st with an owner for every shard that has none (or whose
// owner is no longer a member), assigned by rendezvous over ids, the
// members' sorted ids ([shardmap.Place]). Owners already placed stay. A
// replicated stream's shards get the top Replicas nodes by rendezvous
// and keep them ([shardmap.PlaceReplicas]).
// Placements are immutable, so checkpoints keep theirs.
func (s *state) place(st shardmap.Stream, ids []string) shardmap.Stream {
	st.Placement = shardmap.PlaceReplicas(st.Name, st.Shards, st.Factor(), ids, st.Placement)
	return st
}

// register records a registration of node under session: a new member
// joins, a known one comes back Live, possibly at a new address, with
// the features it registers with in place of those it had (n.Features,
// as featureSet leaves them). A registration that changes neither
// liveness, address nor features (the same one seen again, or one
// replacing it) only makes session current. It reports whether the map
// changed and whether the node is a new member.
func (s *state) register(n shardmap.Node, session uint64) (changed, joined bool, err error) {
	if n.ID == "" || n.Addr == "" {
		return false, false, fmt.Errorf("%w: registration needs a node id and an address (got id %q, addr %q)", ErrInvalid, n.ID, n.Addr)
	}
	if session == 0 {
		return false, false, fmt.Errorf("%w: registration session 0", ErrInvalid)
	}
	m, ok := s.members[n.ID]
	if !ok {
		m = &member{node: shardmap.Node{ID: n.ID}}
		s.members[n.ID] = m
		joined = true
	}
	features := featureSet(n.Features)
	changed = joined || !m.node.Live || m.node.Addr != n.Addr || m.node.Admin != n.Admin || !slices.Equal(m.node.Features, features)
	m.node.Addr, m.node.Admin, m.node.Live, m.node.Features = n.Addr, n.Admin, true, features
	if m.session != session {
		m.report = nil // the last registration's
	}
	m.session = session
	if changed {
		s.bump()
	}
	return changed, joined, nil
}

// registerLive records the registration a live/ key holds (register),
// with the replica report it carries. It reports whether the map changed.
func (s *state) registerLive(e liveEntry) (changed bool, err error) {
	changed, _, err = s.register(e.node, e.session)
	if err == nil {
		s.members[e.node.ID].report = e.report
	}
	return changed, err
}

// featureSet returns the features fs names, sorted, each once, in a new
// slice (nil for none), as a member's are kept: so that the same features
// registered in another order change nothing.
func featureSet(fs []string) []string {
	if len(fs) == 0 {
		return nil
	}
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = strings.Clone(f) // not the registration frame's bytes
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// end records that node id's registration session ended (its stream
// closed, or its lease ran out). The node goes not Live at once unless a
// newer registration replaced this one. It reports whether the map
// changed.
func (s *state) end(id string, session uint64) (changed bool) {
	m, ok := s.members[id]
	if !ok || m.session != session || session == 0 {
		return false
	}
	m.session = 0
	if !m.node.Live {
		return false
	}
	m.node.Live = false
	s.bump()
	return true
}

// holdLive keeps member id Live with no registration (session 0): a new
// leader does so for a member Live in the map it took over whose lease
// is gone, which ran out while no ctl was there to renew it (see
// takeOver). It stays Live until it registers, which makes it an
// ordinary registration, or endHeld ends the hold. It reports whether
// the map changed.
func (s *state) holdLive(id string) bool {
	m, ok := s.members[id]
	if !ok || m.node.Live {
		return false
	}
	m.node.Live, m.session = true, 0
	s.bump()
	return true
}

// hold turns member id's registration session into a hold, as
// holdLive: it stays Live with no registration. It reports whether it
// did (session is its current registration and it is Live); the map does
// not change.
func (s *state) hold(id string, session uint64) bool {
	m, ok := s.members[id]
	if !ok || session == 0 || m.session != session || !m.node.Live {
		return false
	}
	m.session = 0
	return true
}

// endHeld marks down every member holdLive or hold kept that has not registered
// since, and returns their ids, sorted.
func (s *state) endHeld() []string {
	var ids []string
	for _, id := range slices.Sorted(maps.Keys(s.members)) {
		if m := s.members[id]; m.node.Live && m.session == 0 {
			m.node.Live = false
			ids = append(ids, id)
		}
	}
	if len(ids) > 0 {
		s.bump()
	}
	return ids
}

// createStream adds c to the registry. It refuses a name that differs
// from an existing stream's only in case: the brokers name each stream's
// directory after it, and on a case-insensitive filesystem the two would
// share one. It refuses a stream whose shards would take the total past
// maxShardsTotal.
func (s *state) createStream(c shardmap.StreamConfig) error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if _, ok := s.streams[c.Name]; ok {
		return fmt.Errorf("create stream %q: %w", c.Name, ErrStreamExists)
	}
	total := 0
	for name, st := range s.streams {
		if strings.EqualFold(name, c.Name) {
			// Not named: the caller may be allowed the name it asked for
			// and not the existing one (grant patterns are case-sensitive).
			return fmt.Errorf("%w: stream %q differs from an existing stream only in case (stream names must differ in more than case: each is a directory on the brokers' disks)", ErrInvalid, c.Name)
		}
		total += st.Shards
	}
	limit := s.maxShardsTotal
	if limit <= 0 {
		limit = DefaultMaxShardsTotal
	}
	if total+c.Shards > limit {
		return fmt.Errorf("%w: stream %q with %d shards would bring the cluster to %d shards, over its limit of %d (ctl --max-shards-total); delete streams or create fewer shards",
			ErrLimitExceeded, c.Name, c.Shards, total+c.Shards, limit)
	}
	if c.Replicas <= 1 {
		c.Replicas = 0 // factor 1 is stored as by versions before replication
	} else if len(s.members) < c.Replicas {
		return fmt.Errorf("%w: stream %q with %d replicas per shard needs at least %d members, the cluster has %d; add brokers or create it with --replicas 1",
			ErrTooFewMembers, c.Name, c.Replicas, c.Replicas, len(s.members))
	}
	s.streams[c.Name] = shardmap.Stream{StreamConfig: c, Created: s.epoch + 1}
	s.bump() // places the new stream's shards over the current members, in the map of epoch Created
	return nil
}

// deleteStream removes the stream named name from the registry.
func (s *state) deleteStream(name string) error {
	if _, ok := s.streams[name]; !ok {
		return fmt.Errorf("delete stream %q: %w", name, ErrUnknownStream)
	}
	delete(s.streams, name)
	s.bump()
	return nil
}

// grant adds g to the policy. Granting what is already granted changes
// nothing and reports false. It refuses a grant that would take the
// policy past maxGrants.
func (s *state) grant(g auth.Grant) (changed bool, err error) {
	if err := g.Validate(); err != nil {
		return false, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	p := s.policy.With(g)
	if p == s.policy {
		return false, nil
	}
	limit := s.maxGrants
	if limit <= 0 {
		limit = DefaultMaxGrants
	}
	if len(p.Grants) > limit {
		return false, fmt.Errorf("%w: granting %q would bring the cluster to %d grants, over its limit of %d (ctl --max-grants): every grant is in the map sent to every broker; revoke grants, or grant a pattern that covers several streams",
			ErrLimitExceeded, g.String(), len(p.Grants), limit)
	}
	s.policy = p
	s.bumpPolicy()
	return true, nil
}

// revoke removes g from the policy; it fails with ErrUnknownGrant when
// the policy does not hold it.
func (s *state) revoke(g auth.Grant) error {
	p, ok := s.policy.Without(g)
	if !ok {
		return fmt.Errorf("revoke %q: %w", g.String(), ErrUnknownGrant)
	}
	s.policy = p
	s.bumpPolicy()
	return nil
}

// stream returns the config of the stream named name.
func (s *state) stream(name string) (shardmap.StreamConfig, error) {
	st, ok := s.streams[name]
	if !ok {
		return shardmap.StreamConfig{}, fmt.Errorf("stream %q: %w", name, ErrUnknownStream)
	}
	return st.StreamConfig, nil
}

// checkpoint is the part of the state an admin change alters: what
// rollback puts back when the change could not be persisted. members is
// the set of members, not their liveness: an admin change removes a
// member (removeMember) but never changes one.
type checkpoint struct {
	epoch    uint64
	members  map[string]*member
	streams  map[string]shardmap.Stream
	policy   *auth.Policy
	cur      *shardmap.Map
	requests []appliedRequest
}

func (s *state) checkpoint() checkpoint {
	return checkpoint{epoch: s.epoch, members: maps.Clone(s.members), streams: maps.Clone(s.streams), policy: s.policy, cur: s.cur, requests: s.requests}
}

// rollback undoes the admin changes made since cp (streams, grants, a
// member removed), epoch included, as if they never happened. Only valid
// if nothing else changed in between (the server holds its lock across
// change, persist and rollback).
func (s *state) rollback(cp checkpoint) {
	s.epoch, s.members, s.streams, s.policy, s.cur, s.requests = cp.epoch, cp.members, cp.streams, cp.policy, cp.cur, cp.requests
}

// answered returns the change made for the request with ID id, if the
// state remembers one.
func (s *state) answered(id string) (appliedRequest, bool) {
	for i := len(s.requests) - 1; i >= 0; i-- {
		if s.requests[i].ID == id {
			return s.requests[i], true
		}
	}
	return appliedRequest{}, false
}

// remember records r, made at the current epoch, forgetting the oldest
// beyond maxRequests. It copies: a checkpoint's slice stays as it was.
func (s *state) remember(r appliedRequest) {
	r.Epoch = s.epoch
	keep := s.requests[max(0, len(s.requests)-(maxRequests-1)):]
	s.requests = append(slices.Clip(keep), r)
}

// liveIDs returns the ids of the Live members, sorted; for logs.
func (s *state) liveIDs() string {
	var ids []string
	for _, n := range s.cur.Nodes {
		if n.Live {
			ids = append(ids, n.ID)
		}
	}
	return strings.Join(ids, ",")
}
