package transport

import (
	"fmt"
	"slices"
	"time"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/shardmap"
	"github.com/vmihailenco/msgpack/v5"
)

// Request is an admin or control request; the answer is a [Response] or an
// [*Error].
type Request struct {
	// Op is one of "stream.create", "stream.delete", "stream.list",
	// "stream.info", "stream.move", "map.get", "cluster.status",
	// "cluster.remove", "acl.grant", "acl.revoke", "acl.list",
	// "replica.status" (answered by the broker itself, as map.get),
	// "replica.admit" (a broker to another), "replica.settled" (a broker
	// to the control plane).
	Op string
	// Stream is the stream to create (stream.create), or names the stream
	// (Stream.Name) for stream.delete, stream.info and stream.move.
	Stream shardmap.StreamConfig
	// Grant is the permission to add (acl.grant) or remove (acl.revoke).
	Grant auth.Grant
	// Principal is set by a broker relaying a client's request to the
	// control plane: the principal the client authenticated as, which the
	// control plane authorizes instead of the broker. The control plane
	// ignores it on a request from a client's own connection.
	Principal string
	// Admit, with Op "replica.admit" (a broker to the leader of a
	// replicated shard), asks that the sender's new replica join the
	// shard's group in place of the one it lost. Sent only when set (or
	// as nil when a later field is).
	Admit *ReplicaAdmit
	// Move, with Op "stream.move" (a client to the control plane), asks
	// that a replica of a shard of Request.Stream move to another
	// broker. Sent only when set (or as nil when NodeID is).
	Move *ReplicaMove
	// NodeID, with Op "cluster.remove" (a client to the control plane),
	// is the broker to remove from the cluster's members. Sent only when
	// set.
	NodeID string
	// ID names one admin change (stream.create, stream.delete,
	// stream.move, cluster.remove, acl.grant, acl.revoke) for as long as
	// the control plane remembers it: a request sent again with the same
	// ID after its answer was lost (a connection that died, a ctl leader
	// that stopped) is answered as the first one was, never applied
	// twice nor refused as already done. Up to MaxIDLen bytes of
	// letters, digits, '-' and '_'; "" for none. Sent only when set.
	ID string
}

// MaxIDLen bounds the length of an ID: [Request.ID], [Register.Cluster]
// and a map's cluster (shardmap.Map.Cluster).
const MaxIDLen = 64

// ValidID reports whether id may be such an ID: "" (none), or up to
// MaxIDLen letters, digits, '-' and '_'.
func ValidID(id string) bool {
	if len(id) > MaxIDLen {
		return false
	}
	for _, c := range []byte(id) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// ReplicaAdmit names a shard of Request.Stream and the raft id of the
// sender's replica of it that joins the group.
type ReplicaAdmit struct {
	Shard int    `msgpack:"shard"`
	ID    uint64 `msgpack:"id"`
}

// ReplicaMove names a shard of Request.Stream, the broker whose replica
// of it moves (From) and the broker it moves to (To; "" asks the control
// plane to choose one). In a [Response] to stream.move, To is the broker
// the replica moved to.
type ReplicaMove struct {
	Shard int    `msgpack:"shard"`
	From  string `msgpack:"from"`
	To    string `msgpack:"to"`
	// ID, with Op "replica.settled" (a broker to the control plane), is
	// the id of the move whose target (To, the sender) is now a voter.
	ID uint64 `msgpack:"id,omitempty"`
}

// requestFields is the number of fields this version decodes; Admit,
// Move, NodeID and ID are sent only when set (each earlier one as nil or
// "" when a later one is), so other requests encode as before.
const requestFields = 8

// Type implements [Frame].
func (*Request) Type() FrameType { return FrameRequest }

func (r *Request) appendBody(b []byte) ([]byte, error) {
	if r == nil {
		return b, errNilFrame(FrameRequest)
	}
	fields := requestFields
	if r.ID == "" {
		fields--
		if r.NodeID == "" {
			fields--
			if r.Move == nil {
				fields--
				if r.Admit == nil {
					fields--
				}
			}
		}
	}
	b = appendArrayHeader(b, fields)
	b = appendStr(b, r.Op)
	b, err := appendMsgpack(b, FrameRequest, r.Stream)
	if err != nil {
		return b, err
	}
	if b, err = appendMsgpack(b, FrameRequest, r.Grant); err != nil {
		return b, err
	}
	b = appendStr(b, r.Principal)
	if fields < 5 {
		return b, nil
	}
	// A nil Admit or Move encodes as msgpack nil, holding the position
	// of the fields after it.
	if b, err = appendMsgpack(b, FrameRequest, r.Admit); err != nil || fields < 6 {
		return b, err
	}
	if b, err = appendMsgpack(b, FrameRequest, r.Move); err != nil || fields < 7 {
		return b, err
	}
	if b = appendStr(b, r.NodeID); fields < 8 {
		return b, nil
	}
	return appendStr(b, r.ID), nil
}

func (r *Request) decode(d *decoder) {
	n := d.arrayHeader(2)
	r.Op = d.str()
	d.msgpack(&r.Stream)
	read := 2 // an older peer sends only Op and Stream
	if n >= 4 {
		d.msgpack(&r.Grant)
		r.Principal = d.str()
		read = 4
	}
	if n >= 5 {
		d.msgpack(&r.Admit)
		read = 5
	}
	if n >= 6 {
		d.msgpack(&r.Move)
		read = 6
	}
	if n >= 7 {
		r.NodeID = d.str()
		read = 7
	}
	if n >= 8 {
		r.ID = d.str()
		read = 8
	}
	d.skipN(n - read)
}

// Response answers a [Request]. Which fields are set depends on the Op.
type Response struct {
	Streams []shardmap.StreamConfig
	Map     *shardmap.Map
	Grants  []auth.Grant // acl.list
	Ctl     []CtlMember  // cluster.status: the control plane's members
	// Replicas is what a broker says of its replicas of a replicated
	// stream's shards (replica.status, answered by the broker itself).
	Replicas []ReplicaState
	// Moved, in the answer to stream.move, is the move made: To is the
	// broker the replica moved to, the one the control plane chose when
	// the request named none.
	Moved *ReplicaMove
}

// ReplicaState is one broker's replica of one shard of a replicated stream,
// as it sees it.
type ReplicaState struct {
	Shard int    `msgpack:"shard"`
	Node  string `msgpack:"node"`
	// Leader is the leader this replica knows ("" during an election),
	// Term the raft term it is at.
	Leader string `msgpack:"leader,omitempty"`
	Term   uint64 `msgpack:"term"`
	// Next is the offset the next record it commits will get: every
	// record before it is committed and readable here.
	Next uint64 `msgpack:"next"`
	// First is the first offset it still holds: retention dropped the
	// records before it (0 from a broker of an earlier version).
	First uint64 `msgpack:"first,omitempty"`
	// Err says why its group stopped, "" while it runs.
	Err string `msgpack:"err,omitempty"`
	// Member is the replica's place in the group's configuration as it
	// applied it: "voter", "learner", or "joining" (a replica that
	// replaces a lost one, not admitted yet).
	Member string `msgpack:"member,omitempty"`
}

// CtlMember is one control plane member as cluster.status reports it.
type CtlMember struct {
	Name string `msgpack:"name"`
	Addr string `msgpack:"addr"` // its QUIC address
	Role string `msgpack:"role"` // "leader", "follower", or "down" (an etcd member no live ctl runs)
	// Etcd is the client URL of the member's embedded etcd ("" when ctl
	// uses an external etcd); EtcdHealthy whether it answered a status
	// request, EtcdLeader whether it is etcd's raft leader, and EtcdError
	// why it did not answer.
	Etcd        string `msgpack:"etcd,omitempty"`
	EtcdHealthy bool   `msgpack:"etcd_healthy"`
	EtcdLeader  bool   `msgpack:"etcd_leader,omitempty"`
	EtcdError   string `msgpack:"etcd_error,omitempty"`
}

// responseFields is the number of fields this version decodes; the Ctl,
// Replicas and Moved fields are sent only when set (each, empty, when a
// later one is), so responses without them encode as before.
const responseFields = 6

// Type implements [Frame].
func (*Response) Type() FrameType { return FrameResponse }

func (r *Response) appendBody(b []byte) ([]byte, error) {
	if r == nil {
		return b, errNilFrame(FrameResponse)
	}
	fields := responseFields
	if r.Moved == nil {
		fields--
		if len(r.Replicas) == 0 {
			fields--
			if len(r.Ctl) == 0 {
				fields--
			}
		}
	}
	b = appendArrayHeader(b, fields)
	b, err := appendMsgpack(b, FrameResponse, r.Streams)
	if err != nil {
		return b, err
	}
	if b, err = appendMsgpack(b, FrameResponse, r.Map); err != nil {
		return b, err
	}
	if b, err = appendMsgpack(b, FrameResponse, r.Grants); err != nil || fields < 4 {
		return b, err
	}
	if b, err = appendMsgpack(b, FrameResponse, r.Ctl); err != nil || fields < 5 {
		return b, err
	}
	if b, err = appendMsgpack(b, FrameResponse, r.Replicas); err != nil || fields < 6 {
		return b, err
	}
	return appendMsgpack(b, FrameResponse, r.Moved)
}

func (r *Response) decode(d *decoder) {
	n := d.arrayHeader(2)
	d.msgpack(&r.Streams)
	d.msgpack(&r.Map)
	read := 2 // an older peer sends only Streams and Map
	if n >= 3 {
		d.msgpack(&r.Grants)
		read = 3
	}
	if n >= 4 {
		d.msgpack(&r.Ctl)
		read = 4
	}
	if n >= 5 {
		d.msgpack(&r.Replicas)
		read = 5
	}
	if n >= 6 {
		d.msgpack(&r.Moved)
		read = 6
	}
	d.skipN(n - read)
	// appendBody leaves out empty trailing fields, which then decode as
	// nil: so does an empty one that was sent, so that a frame decodes
	// the same whichever way it was written.
	if len(r.Replicas) == 0 {
		r.Replicas = nil
		if len(r.Ctl) == 0 {
			r.Ctl = nil
		}
	}
}

// MapUpdate pushes a shard map: ctl to brokers, brokers to clients.
type MapUpdate struct {
	Map *shardmap.Map
	// Features are what the sending ctl's build supports (see
	// [Features]), on a broker's registration stream: a broker expects
	// answers to its heartbeats only from a ctl with
	// FeatureHeartbeatAcks. Sent only when not empty (or when LeaseTTL
	// is sent): an earlier ctl sends none, and an earlier broker skips
	// the field.
	Features []string
	// LeaseTTL is the broker lease of the sending ctl (ctl.Config.LeaseTTL,
	// felix ctl --lease-ttl), on a broker's registration stream: the
	// broker heartbeats by it instead of its own (see
	// ctlclient.MemberConfig.LeaseTTL). Sent only when set: an earlier
	// ctl sends none (the broker keeps its own), and an earlier broker
	// skips the field.
	LeaseTTL time.Duration
}

// mapUpdateFields is the number of fields this version decodes; Features
// and LeaseTTL are sent only when set, so a MapUpdate without them
// encodes as the one field of earlier versions, which every decoder
// requires.
const mapUpdateFields = 3

// Type implements [Frame].
func (*MapUpdate) Type() FrameType { return FrameMap }

func (m *MapUpdate) appendBody(b []byte) ([]byte, error) {
	if m == nil {
		return b, errNilFrame(FrameMap)
	}
	fields := mapUpdateFields
	if m.LeaseTTL == 0 {
		fields--
		if len(m.Features) == 0 {
			fields--
		}
	}
	b = appendArrayHeader(b, fields)
	b, err := appendMsgpack(b, FrameMap, m.Map)
	if err != nil || fields < 2 {
		return b, err
	}
	if b = appendStrs(b, m.Features); fields < 3 {
		return b, nil
	}
	return appendInt(b, int64(m.LeaseTTL)), nil
}

func (m *MapUpdate) decode(d *decoder) {
	n := d.arrayHeader(1) // an earlier peer sends no Features
	d.msgpack(&m.Map)
	read := 1
	if n >= 2 {
		m.Features = d.strs()
		read = 2
	}
	if n >= 3 {
		m.LeaseTTL = time.Duration(d.int64())
		read = 3
	}
	d.skipN(n - read)
	// appendBody leaves out an empty Features, which then decodes as nil:
	// so does an empty one that was sent.
	if len(m.Features) == 0 {
		m.Features = nil
	}
}

// Register is the first frame a broker sends on its long-lived
// registration stream to ctl.
type Register struct {
	NodeID string
	Addr   string // advertised QUIC address, host:port
	Admin  string // HTTP admin address, if any
	// Features are what the broker's build supports (the Feature
	// constants, see [Features]): the control plane makes a change that
	// brokers of an earlier version could not take only once every live
	// broker advertises it. Sent only when not empty: a broker of an
	// earlier version sends none, and an earlier ctl skips the field.
	Features []string
	// Cluster is the ID of the cluster the broker's data belongs to
	// (shardmap.Map.Cluster), "" if it knows none: a control plane of
	// another cluster refuses the registration before it records the
	// broker. Sent only when set (Features then as an empty list if it
	// has none).
	Cluster string
}

// registerFields is the number of fields this version decodes; Features
// and Cluster are sent only when set, so a Register without them encodes
// as the three fields of earlier versions, which every decoder requires.
const registerFields = 5

// Type implements [Frame].
func (*Register) Type() FrameType { return FrameRegister }

func (r *Register) appendBody(b []byte) ([]byte, error) {
	if r == nil {
		return b, errNilFrame(FrameRegister)
	}
	fields := registerFields
	if r.Cluster == "" {
		fields--
		if len(r.Features) == 0 {
			fields--
		}
	}
	b = appendArrayHeader(b, fields)
	b = appendStr(b, r.NodeID)
	b = appendStr(b, r.Addr)
	b = appendStr(b, r.Admin)
	if fields < 4 {
		return b, nil
	}
	if b = appendStrs(b, r.Features); fields < 5 {
		return b, nil
	}
	return appendStr(b, r.Cluster), nil
}

func (r *Register) decode(d *decoder) {
	n := d.arrayHeader(3) // an earlier peer sends no Features
	r.NodeID = d.str()
	r.Addr = d.str()
	r.Admin = d.str()
	read := 3
	if n >= 4 {
		r.Features = d.strs()
		read = 4
	}
	if n >= 5 {
		r.Cluster = d.str()
		read = 5
	}
	d.skipN(n - read)
	// appendBody leaves out an empty Features, which then decodes as nil:
	// so does an empty one that was sent.
	if len(r.Features) == 0 {
		r.Features = nil
	}
}

// Heartbeat renews a broker's lease on the registration stream. A ctl
// with FeatureHeartbeatAcks answers each heartbeat of a broker that
// advertises it with a Heartbeat of its own (NodeID the broker's, Epoch
// that of the last map it sent on the stream, no Replicas).
type Heartbeat struct {
	NodeID string
	Epoch  uint64 // the map epoch the broker holds (in ctl's answer: the last one sent)
	// Replicas is where the broker's replicas of replicated shards
	// stand, which the control plane checks before it moves a replica
	// (see package ctl); nil from a broker of an earlier version, which
	// registers without FeatureReplicaReports, and sent only when set.
	Replicas *ReplicaReport
}

// heartbeatFields is the number of fields this version decodes; Replicas
// is sent only when set, so a Heartbeat without it encodes as the two
// fields of earlier versions, which every decoder requires.
const heartbeatFields = 3

// ReplicaReport is a broker's account of its replicas of replicated
// shards, as of the last shard map it applied.
type ReplicaReport struct {
	// Applied is the epoch of the last map whose replicas the broker has
	// opened since it started: those that open are then voters of their
	// groups or listed in Unready.
	Applied uint64 `msgpack:"applied" json:"applied"`
	// Unready are shards of that map of which the broker holds a replica
	// that is not a working voter of its group: one joining in place of
	// a lost replica or moved in, one that failed or did not open. At
	// most MaxUnreadyReported, in the map's order.
	Unready []shardmap.ShardID `msgpack:"unready" json:"unready,omitempty"`
	// More says the broker has more unready replicas than Unready lists.
	More bool `msgpack:"more" json:"more,omitempty"`
}

// MaxUnreadyReported bounds ReplicaReport.Unready; a decoded report with
// more is malformed.
const MaxUnreadyReported = 256

// Has reports whether r counts the replica of shard id as unready: it
// lists it, or lists fewer than there are.
func (r *ReplicaReport) Has(id shardmap.ShardID) bool {
	return r.More || slices.Contains(r.Unready, id)
}

// Equal reports whether r and o say the same.
func (r *ReplicaReport) Equal(o *ReplicaReport) bool {
	if r == nil || o == nil {
		return r == o
	}
	return r.Applied == o.Applied && r.More == o.More && slices.Equal(r.Unready, o.Unready)
}

// Type implements [Frame].
func (*Heartbeat) Type() FrameType { return FrameHeartbeat }

func (h *Heartbeat) appendBody(b []byte) ([]byte, error) {
	if h == nil {
		return b, errNilFrame(FrameHeartbeat)
	}
	fields := heartbeatFields
	if h.Replicas == nil {
		fields--
	}
	b = appendArrayHeader(b, fields)
	b = appendStr(b, h.NodeID)
	b = appendUint(b, h.Epoch)
	if h.Replicas == nil {
		return b, nil
	}
	return appendMsgpack(b, FrameHeartbeat, h.Replicas)
}

func (h *Heartbeat) decode(d *decoder) {
	n := d.arrayHeader(2) // an earlier broker sends no Replicas
	h.NodeID = d.str()
	h.Epoch = d.uint64()
	read := 2
	if n >= 3 {
		d.msgpack(&h.Replicas)
		read = 3
		if r := h.Replicas; r != nil && len(r.Unready) > MaxUnreadyReported {
			d.fail("replica report lists %d unready replicas, more than %d", len(r.Unready), MaxUnreadyReported)
		}
	}
	d.skipN(n - read)
}

// appendMsgpack appends v encoded by msgpack reflection (structs as maps
// keyed by their msgpack tags).
func appendMsgpack(b []byte, t FrameType, v any) ([]byte, error) {
	enc, err := msgpack.Marshal(v)
	if err != nil {
		return b, &Error{Code: CodeInvalid, Message: fmt.Sprintf("encoding %s frame: %v", t, err), cause: err}
	}
	return append(b, enc...), nil
}

// msgpack decodes the next value into v by reflection. The value's extent
// is found, and every length in it checked against the body, before the
// library sees it, so a declared length cannot make it allocate more than
// the body justifies, and nesting is bounded.
func (d *decoder) msgpack(v any) {
	raw := d.value()
	if d.err != nil {
		return
	}
	if err := unmarshal(raw, v); err != nil {
		d.fail("%v", err)
	}
}

func unmarshal(raw []byte, v any) (err error) {
	defer func() {
		// The input is validated, so a panic here is a library bug; it
		// must still not take the process down on a peer's bytes.
		if p := recover(); p != nil {
			err = fmt.Errorf("msgpack decoder panicked: %v", p)
		}
	}()
	return msgpack.Unmarshal(raw, v)
}
