package shardmap

import (
	"github.com/felix-broker/felix/auth"

	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
)

// ErrUnknownStream is returned by lookups of a stream the map does not have.
var ErrUnknownStream = errors.New("shardmap: unknown stream")

// ErrNoShard is returned by lookups of a shard number a stream does not have.
var ErrNoShard = errors.New("shardmap: no such shard")

// Node is one member of the cluster.
type Node struct {
	ID   string `msgpack:"id"`
	Addr string `msgpack:"addr"` // advertised QUIC address, host:port
	// Admin is the node's HTTP admin address (metrics, health), if any.
	Admin string `msgpack:"admin,omitempty"`
	// Live reports whether the node's lease with the control plane is
	// current. It decides availability, never ownership.
	Live bool `msgpack:"live"`
	// Features are what the node's build supports, as it advertised them
	// when it last registered (transport.Features), sorted; none for a
	// node of an earlier version. The control plane keeps them while
	// the node is down, and a registration replaces them. A decoder of
	// an earlier version skips the field.
	Features []string `msgpack:"features,omitempty"`
}

// Supports reports whether n advertised feature.
func (n Node) Supports(feature string) bool { return slices.Contains(n.Features, feature) }

// StreamConfig is what a stream is created with.
type StreamConfig struct {
	Name   string `msgpack:"name"`
	Shards int    `msgpack:"shards"`
	// RetentionBytes bounds each shard's log size; 0 means unlimited. A
	// replicated shard's replicas drop whole segments while the rest of
	// the log holds at least this much (package replica). A shard of
	// replication factor 1 drops records, also from a log its broker
	// closed to stay under its open-log budget (as it closes).
	RetentionBytes int64 `msgpack:"retention_bytes,omitempty"`
	// RetentionAge bounds the age of each shard's records; 0 means
	// unlimited. A replicated shard's replicas drop a segment once its
	// newest record is older. A shard of replication factor 1 drops
	// records; a log its broker closed to stay under its open-log budget
	// is opened again for it once its oldest segment has expired whole.
	RetentionAge time.Duration `msgpack:"retention_age,omitempty"`
	// Replicas is the replication factor: 1 (0 means 1), each shard on
	// one broker, acknowledged once it has fsynced the record; or 3, each
	// shard a raft group on three brokers, acknowledged once a majority
	// has fsynced it. Fixed for the stream's life. A stream of factor 1
	// is stored and sent with 0, as by versions before replication.
	Replicas int `msgpack:"replicas,omitempty"`
}

// Factor returns c's replication factor: Replicas, or 1 for 0.
func (c StreamConfig) Factor() int { return max(c.Replicas, 1) }

// ErrTooFewMembers is matched by the error creating a stream whose
// replication factor is larger than the cluster's membership.
var ErrTooFewMembers = errors.New("shardmap: fewer members than the replication factor")

// Validate reports whether c can be created.
func (c StreamConfig) Validate() error {
	if err := ValidateStreamName(c.Name); err != nil {
		return err
	}
	if c.Shards < 1 || c.Shards > MaxShards {
		return fmt.Errorf("shardmap: stream %q: shards must be 1..%d, got %d", c.Name, MaxShards, c.Shards)
	}
	if c.RetentionBytes < 0 || c.RetentionAge < 0 {
		return fmt.Errorf("shardmap: stream %q: retention must not be negative", c.Name)
	}
	if c.Replicas != 0 && c.Replicas != 1 && c.Replicas != 3 {
		return fmt.Errorf("shardmap: stream %q: replicas must be 1 or 3, got %d", c.Name, c.Replicas)
	}
	return nil
}

// MaxShards is the largest shard count a stream may have.
const MaxShards = 4096

// MaxStreamName is the longest stream name, in bytes.
const MaxStreamName = 128

// ErrInvalidStreamName is matched by every error [ValidateStreamName]
// returns.
var ErrInvalidStreamName = errors.New("shardmap: invalid stream name")

// ValidateStreamName reports whether name can name a stream: 1 to
// [MaxStreamName] ASCII letters, digits, '-', '_' and '.', not starting
// with '.'.
//
// A stream name is used as one path element of the brokers' data
// directories (see package broker), so the rules make every valid name a
// plain, visible directory name on any filesystem: no separator ('/' or
// '\'), no NUL or control character, never "." or ".." (nor anything
// else starting with '.', which also leaves dot-names free for the
// brokers' own files), at most 128 bytes (far below NAME_MAX).
func ValidateStreamName(name string) error {
	if name == "" || len(name) > MaxStreamName {
		return fmt.Errorf("%w: must be 1..%d characters, got %d", ErrInvalidStreamName, MaxStreamName, len(name))
	}
	if name[0] == '.' {
		return fmt.Errorf("%w %q: must not start with '.'", ErrInvalidStreamName, name)
	}
	for _, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '_' || c == '.'
		if !ok {
			return fmt.Errorf("%w %q: character %q not allowed (use letters, digits, '-', '_', '.')", ErrInvalidStreamName, name, c)
		}
	}
	return nil
}

// Stream is a stream in a map with the placement of its shards.
type Stream struct {
	StreamConfig `msgpack:",inline"`
	// Placement says which node owns each shard (the "owners" field of
	// earlier versions, encoded as it was).
	Placement Placement `msgpack:"owners"`
	// Created is the epoch of the first map that held the stream: with
	// the name, it tells this stream from one of the same name deleted
	// before it (epochs never repeat), as Kafka's topic ids do. A broker
	// that finds data of another incarnation under the name (the stream
	// was deleted and created again while the broker was down, or in maps
	// it never saw) removes it instead of serving it as the new stream's.
	// 0 for a stream created by a control plane older than the field.
	Created uint64 `msgpack:"created,omitempty"`
}

// Map is one version of the cluster's shard map. A Map is immutable once
// built: share it freely, never modify it.
type Map struct {
	Epoch   uint64   `msgpack:"epoch"`
	Nodes   []Node   `msgpack:"nodes"`   // sorted by ID
	Streams []Stream `msgpack:"streams"` // sorted by Name
	// ACL is the authorization policy in force at this epoch; nil in a
	// map shown to a client (see [Map.VisibleTo]).
	ACL *auth.Policy `msgpack:"acl,omitempty"`
	// Cluster is the cluster's ID, made once when its control plane
	// first stored its state, as Kafka's cluster.id: a broker keeps the
	// ID of the maps it took with its data and refuses a map of another
	// cluster (a control plane that lost its state, or another one)
	// rather than apply it to data it never described. "" from a control
	// plane older than the field.
	Cluster string `msgpack:"cluster,omitempty"`
}

// VisibleTo returns the map as principal may see it: without the policy,
// and with only the streams principal may see (see [auth.Policy.Sees]),
// unless it may read the whole cluster. The result shares m's streams;
// like m, it must not be modified.
func (m *Map) VisibleTo(principal string) *Map {
	v := *m
	v.ACL = nil
	if m.ACL.Allows(principal, auth.ClusterRead, "") {
		return &v
	}
	v.Streams = nil
	for _, st := range m.Streams {
		if m.ACL.Sees(principal, st.Name) {
			v.Streams = append(v.Streams, st)
		}
	}
	return &v
}

// Build computes the map at epoch for the member nodes and streams given.
// Nodes and streams are copied and sorted; ownership is computed by
// rendezvous hashing over all member nodes, live or not.
func Build(epoch uint64, nodes []Node, streams []StreamConfig) *Map {
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.ID
	}
	assigned := make([]Stream, len(streams))
	for i, c := range streams {
		assigned[i] = Stream{StreamConfig: c, Placement: PlaceReplicas(c.Name, c.Shards, c.Factor(), sortedIDs(ids), Placement{})}
	}
	return Assemble(epoch, nodes, assigned)
}

func sortedIDs(ids []string) []string {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	return ids
}

// Assemble returns the map at epoch with the nodes and the streams,
// placements included, as given: the control plane uses it when owners
// were assigned earlier and must not move (see package ctl). Nodes and
// streams are copied and sorted (placements are immutable, so shared).
func Assemble(epoch uint64, nodes []Node, streams []Stream) *Map {
	m := &Map{Epoch: epoch, Nodes: slices.Clone(nodes), Streams: make([]Stream, len(streams))}
	slices.SortFunc(m.Nodes, func(a, b Node) int { return strings.Compare(a.ID, b.ID) })
	copy(m.Streams, streams)
	slices.SortFunc(m.Streams, func(a, b Stream) int { return strings.Compare(a.Name, b.Name) })
	return m
}

// Owner returns the node among nodeIDs with the highest rendezvous weight
// for shard of stream, or "" when nodeIDs is empty. Ties (astronomically
// unlikely) go to the smaller id so the result never depends on order.
func Owner(stream string, shard int, nodeIDs []string) string {
	best, bestW := "", uint64(0)
	for _, id := range nodeIDs {
		w := weight(stream, shard, id)
		if best == "" || w > bestW || w == bestW && id < best {
			best, bestW = id, w
		}
	}
	return best
}

// weight is the rendezvous weight of node id for shard of stream.
func weight(stream string, shard int, id string) uint64 {
	var buf [160]byte
	b := strconv.AppendInt(append(append(buf[:0], stream...), '/'), int64(shard), 10)
	return xxhash.Sum64(append(b, id...))
}

func compareStrings(a, b string) int { return strings.Compare(a, b) }

// ShardFor returns the shard of a stream with shards shards that key maps
// to: xxhash(key) mod shards.
func ShardFor(key []byte, shards int) int {
	if shards <= 1 {
		return 0
	}
	return int(xxhash.Sum64(key) % uint64(shards))
}

// Stream returns the stream named name.
func (m *Map) Stream(name string) (*Stream, bool) {
	i, ok := slices.BinarySearchFunc(m.Streams, name, func(s Stream, n string) int { return strings.Compare(s.Name, n) })
	if !ok {
		return nil, false
	}
	return &m.Streams[i], true
}

// Node returns the node with id.
func (m *Map) Node(id string) (Node, bool) {
	i, ok := slices.BinarySearchFunc(m.Nodes, id, func(n Node, id string) int { return strings.Compare(n.ID, id) })
	if !ok {
		return Node{}, false
	}
	return m.Nodes[i], true
}

// Owner returns the node owning shard of stream.
func (m *Map) Owner(stream string, shard int) (Node, error) {
	s, ok := m.Stream(stream)
	if !ok {
		return Node{}, fmt.Errorf("%w %q (map epoch %d)", ErrUnknownStream, stream, m.Epoch)
	}
	if shard < 0 || shard >= s.Placement.Len() {
		return Node{}, fmt.Errorf("%w: stream %q has %s, numbered from 0; there is no shard %d", ErrNoShard, stream, shardCount(s.Placement.Len()), shard)
	}
	owner := s.Placement.Owner(shard)
	n, ok := m.Node(owner)
	if !ok {
		// Build never produces this; a hand-made or corrupt map might.
		return Node{}, fmt.Errorf("shardmap: shard %s/%d owned by %q, which is not a member (map epoch %d)", stream, shard, owner, m.Epoch)
	}
	return n, nil
}

// shardCount says "1 shard" or "n shards".
func shardCount(n int) string {
	if n == 1 {
		return "1 shard"
	}
	return strconv.Itoa(n) + " shards"
}

// Route returns the shard key maps to in stream and the node owning it.
func (m *Map) Route(stream string, key []byte) (int, Node, error) {
	s, ok := m.Stream(stream)
	if !ok {
		return 0, Node{}, fmt.Errorf("%w %q (map epoch %d)", ErrUnknownStream, stream, m.Epoch)
	}
	shard := ShardFor(key, s.Shards)
	n, err := m.Owner(stream, shard)
	return shard, n, err
}

// OwnedBy returns every shard owned by node id, ordered by stream and shard.
func (m *Map) OwnedBy(id string) []ShardID {
	var out []ShardID
	for _, s := range m.Streams {
		for _, shard := range s.Placement.OwnedBy(id) {
			out = append(out, ShardID{Stream: s.Name, Shard: shard})
		}
	}
	return out
}

// ReplicatedBy returns every shard of which node id holds a replica
// (owner or not), ordered by stream and shard: for streams of replication
// factor 1, the shards it owns.
func (m *Map) ReplicatedBy(id string) []ShardID {
	var out []ShardID
	for _, s := range m.Streams {
		for _, shard := range s.Placement.ReplicatedBy(id) {
			out = append(out, ShardID{Stream: s.Name, Shard: shard})
		}
	}
	return out
}

// NewerThan reports whether m supersedes other: a nil other is superseded
// by any map.
func (m *Map) NewerThan(other *Map) bool {
	return other == nil || m.Epoch > other.Epoch
}

// ShardID names one shard of one stream.
type ShardID struct {
	Stream string
	Shard  int
}

func (s ShardID) String() string { return s.Stream + "/" + strconv.Itoa(s.Shard) }

// Move is one change between two maps: a shard that changed owner, or
// that appeared (From == "") or disappeared (To == ""); one whose replica
// set changed with its owner kept (From == To, FromReplicas and
// ToReplicas set); or one whose stream was deleted and created again
// (Recreated: another shard of the same name).
type Move struct {
	ShardID
	From, To                 string
	FromReplicas, ToReplicas []string // set when the replica sets differ
	Recreated                bool
}

// Diff returns the shards whose owner, replica set or stream differs
// between old and new, ordered by stream and shard. A nil old is an empty
// map.
func Diff(old, new *Map) []Move {
	type placed struct {
		replicas []string // owner first
		created  uint64
	}
	shards := func(m *Map) map[ShardID]placed {
		out := map[ShardID]placed{}
		if m == nil {
			return out
		}
		for _, s := range m.Streams {
			for shard := range s.Placement.Len() {
				out[ShardID{s.Name, shard}] = placed{s.Placement.Replicas(shard), s.Created}
			}
		}
		return out
	}
	owner := func(p placed) string {
		if len(p.replicas) == 0 {
			return ""
		}
		return p.replicas[0]
	}
	a, b := shards(old), shards(new)
	var moves []Move
	for id, from := range a {
		to, ok := b[id]
		mv := Move{ShardID: id, From: owner(from), To: owner(to), Recreated: ok && to.created != from.created}
		if ok && !slices.Equal(from.replicas, to.replicas) && (len(from.replicas) > 1 || len(to.replicas) > 1) {
			mv.FromReplicas, mv.ToReplicas = from.replicas, to.replicas
		}
		if mv.From != mv.To || mv.Recreated || mv.FromReplicas != nil {
			moves = append(moves, mv)
		}
	}
	for id, to := range b {
		if _, ok := a[id]; !ok {
			moves = append(moves, Move{ShardID: id, To: owner(to)})
		}
	}
	slices.SortFunc(moves, func(x, y Move) int {
		if c := strings.Compare(x.Stream, y.Stream); c != 0 {
			return c
		}
		return x.Shard - y.Shard
	})
	return moves
}
