package client

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// Request ops, as the broker knows them.
const (
	opStreamCreate  = "stream.create"
	opStreamDelete  = "stream.delete"
	opStreamList    = "stream.list"
	opStreamInfo    = "stream.info"
	opStreamMove    = "stream.move"
	opMapGet        = "map.get"
	opClusterStatus = "cluster.status"
	opClusterRemove = "cluster.remove"
	opACLGrant      = "acl.grant"
	opACLRevoke     = "acl.revoke"
	opACLList       = "acl.list"
	opReplicaStatus = "replica.status"
)

// createWait bounds how long CreateStream waits for the broker it is
// connected to to see the new stream in its shard map.
const createWait = 5 * time.Second

// CreateStream creates a stream with cfg.Name, cfg.Shards shards and the
// retention given. It fails with an error matching
// [ErrStreamExists] if the stream exists.
//
// It returns once the broker the client is connected to has the stream in
// its shard map (or after a few seconds if it does not see it yet), so that
// a Publish or Subscribe right after finds it.
func (c *Client) CreateStream(ctx context.Context, cfg StreamConfig) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("client: create stream %q: %w", cfg.Name, err)
	}
	if _, err := c.change(ctx, &transport.Request{Op: opStreamCreate, Stream: cfg}); err != nil {
		return fmt.Errorf("client: create stream %q: %w", cfg.Name, err)
	}
	// Wait for the new stream to reach this broker's map. Not finding it is
	// not an error: the stream was created.
	wctx, cancel := context.WithTimeout(ctx, createWait)
	defer cancel()
	for delay := 5 * time.Millisecond; ; delay = min(delay*2, 200*time.Millisecond) {
		m, err := c.fetchMap(wctx, c.homeConn())
		if err == nil {
			c.storeMap(m)
			if _, ok := m.Stream(cfg.Name); ok {
				return nil
			}
		}
		if !sleep(wctx, delay) {
			return nil
		}
	}
}

// DeleteStream deletes the stream named name and its records.
func (c *Client) DeleteStream(ctx context.Context, name string) error {
	req := &transport.Request{Op: opStreamDelete, Stream: StreamConfig{Name: name}}
	if _, err := c.change(ctx, req); err != nil {
		return fmt.Errorf("client: delete stream %q: %w", name, err)
	}
	return nil
}

// Streams lists the streams of the cluster.
func (c *Client) Streams(ctx context.Context) ([]StreamConfig, error) {
	resp, err := c.homeRequest(ctx, &transport.Request{Op: opStreamList})
	if err != nil {
		return nil, fmt.Errorf("client: list streams: %w", err)
	}
	return resp.Streams, nil
}

// StreamInfo returns the configuration of the stream named name; it fails
// with an error matching [ErrUnknownStream] if there is none.
func (c *Client) StreamInfo(ctx context.Context, name string) (StreamConfig, error) {
	req := &transport.Request{Op: opStreamInfo, Stream: StreamConfig{Name: name}}
	resp, err := c.homeRequest(ctx, req)
	if err != nil {
		return StreamConfig{}, fmt.Errorf("client: stream info %q: %w", name, err)
	}
	if len(resp.Streams) == 0 {
		return StreamConfig{}, fmt.Errorf("client: stream info %q: %w", name, &transport.Error{Code: transport.CodeUnknownStream, Message: "empty answer"})
	}
	return resp.Streams[0], nil
}

// MovedReplica is what [Client.MoveReplica] did: the replica of shard
// Shard of Stream that broker From held is broker To's in the shard map
// of epoch Epoch, where the shard's replica set is Replicas (the owner,
// the preferred leader, first).
type MovedReplica struct {
	Stream   string
	Shard    int
	From, To string
	Epoch    uint64
	Replicas []string
}

// MoveReplica moves the replica of shard of a replicated stream
// (replication factor 3) that the broker from holds to the broker to, or,
// with to "", to the live broker without a replica of the shard that the
// control plane chooses (the one rendezvous hashing ranks highest for the
// shard, as it places shards). It needs cluster.admin.
//
// It is for a broker lost for good: from must be down (its lease with
// the control plane lapsed). The control plane refuses, with an error
// matching [ErrInvalid] that says why, a from that is live (stop it
// first: its replica would leave the shard's group at once, and moving a
// live replica without lowering the shard's redundancy meanwhile is not
// supported yet), a from that holds no replica of the shard, a to that is
// down, not a member or already holds one, a shard the stream does not
// have and a stream of replication factor 1; a stream that does not
// exist fails with [ErrUnknownStream].
//
// The move is made when MoveReplica returns: the map of the returned
// epoch names to in from's place. To's replica starts empty, joins the
// shard's raft group and catches up from the group's leader: a learner
// until it has, then a voter in from's place. Follow its progress with
// [Client.ReplicaStatus], where to's [ReplicaState].Member goes
// "joining", "learner", "voter" (`felixctl stream info` shows it, and
// `felixctl stream move` waits for it). Should from come back, it removes
// its replica.
func (c *Client) MoveReplica(ctx context.Context, stream string, shard int, from, to string) (MovedReplica, error) {
	fail := func(err error) (MovedReplica, error) {
		return MovedReplica{}, fmt.Errorf("client: move %s's replica of %s/%d: %w", from, stream, shard, err)
	}
	if err := shardmap.ValidateStreamName(stream); err != nil {
		return fail(err)
	}
	switch {
	case shard < 0:
		return fail(fmt.Errorf("%w: shards are numbered from 0", ErrNoShard))
	case from == "":
		return fail(&transport.Error{Code: transport.CodeInvalid, Message: "name the broker whose replica moves"})
	}
	if err := c.checkMovable(ctx, stream, shard, from); err != nil {
		return fail(err)
	}
	req := &transport.Request{Op: opStreamMove, Stream: StreamConfig{Name: stream}, Move: &transport.ReplicaMove{Shard: shard, From: from, To: to}}
	resp, err := c.change(ctx, req)
	if err != nil {
		return fail(err)
	}
	if resp.Moved == nil || resp.Map == nil {
		return fail(&transport.Error{Code: transport.CodeInternal, Message: "the answer does not say where the replica moved (a control plane of an earlier version?)"})
	}
	c.storeMap(resp.Map)
	mv := MovedReplica{Stream: stream, Shard: resp.Moved.Shard, From: resp.Moved.From, To: resp.Moved.To, Epoch: resp.Map.Epoch}
	if st, ok := resp.Map.Stream(stream); ok {
		mv.Replicas = slices.Clone(st.Placement.Replicas(mv.Shard))
	}
	return mv, nil
}

// checkMovable asks the shard's other replicas where they stand in its
// raft group before from's replica moves: each must answer, as a voter,
// and all must follow one leader among them (else ErrReplicasNotReady).
// A live broker may hold a replica that is not (yet) a voter, a lost one
// rejoining, say: moving from's replica then would leave the group
// without the quorum that admits the new one, and from's broker, when it
// comes back, without its copy. The control plane refuses such a move
// too, from the brokers' replica reports (as of their last heartbeat,
// and only brokers that send them); this check adds the leader, and
// says why in the SDK's own error. A stream, shard
// or source the map does not know is left to the control plane to
// refuse.
func (c *Client) checkMovable(ctx context.Context, stream string, shard int, from string) error {
	states, err := c.ReplicaStatus(ctx, stream)
	if err != nil {
		if errors.Is(err, ErrUnknownStream) {
			return nil
		}
		return err
	}
	m := c.cachedMap()
	st, ok := m.Stream(stream)
	if !ok || !st.Placement.IsReplica(shard, from) || st.Factor() == 1 {
		return nil
	}
	if n, ok := m.Node(from); ok && n.Live {
		// Never sent unchecked: the control plane may already see it down
		// while this map, a lease behind, does not.
		return &transport.Error{Code: transport.CodeInvalid, Message: fmt.Sprintf(
			"%s is live: stop it first (the map of epoch %d shows it live; a broker that stopped stays live until its lease runs out, a few seconds: ask again then)", from, m.Epoch)}
	}
	leader := ""
	for _, n := range st.Placement.Replicas(shard) {
		if n == from {
			continue
		}
		i := slices.IndexFunc(states, func(s ReplicaState) bool { return s.Shard == shard && s.Node == n })
		var why string
		switch {
		case i < 0:
			why = "did not say where its replica stands"
		case states[i].Err != "":
			why = "answered with an error: " + states[i].Err
		case states[i].Member != "voter":
			why = fmt.Sprintf("holds a replica that is not a voter of the group (%s)", cmp.Or(states[i].Member, "unknown"))
		case states[i].Leader == "" || states[i].Leader == from || (leader != "" && states[i].Leader != leader):
			why = fmt.Sprintf("follows no leader among the shard's other replicas (it knows %q)", states[i].Leader)
		default:
			leader = states[i].Leader
			continue
		}
		return fmt.Errorf("%w: %s, another replica of %s/%d, %s: the move would leave the group without the quorum that admits the new replica, and %s's copy may be one the shard needs; "+
			"wait until the shard's other replicas are voters under one leader (felixctl stream info %s)", ErrReplicasNotReady, n, stream, shard, why, from, stream)
	}
	return nil
}

// RemoveBroker removes the broker id from the cluster's members: the shard
// map no longer lists it, and `felixctl cluster status` no longer counts
// it down. It needs cluster.admin.
//
// It is for a broker lost for good, after its replicas have moved to
// other brokers ([Client.MoveReplica] for each, or `felixctl cluster
// drain`): the control plane refuses, with an error matching
// [ErrInvalid] that says why, a broker that is not a member, one that is
// live (stop it first: a live broker registers again at once), one that
// owns a shard of a stream of replication factor 1 (its shards would be
// placed anew on other brokers with empty logs), one that still holds
// a replica of a replicated stream's shard, and one whose replica's move
// is still pending (the new replica not yet a voter in its place: the
// shard's raft group may still count the broker's copy; the error names
// the moves). Removing a broker changes no
// shard's placement. Should it start again, it joins as a new member,
// holding nothing.
func (c *Client) RemoveBroker(ctx context.Context, id string) error {
	if id == "" {
		return fmt.Errorf("client: remove broker: %w", &transport.Error{Code: transport.CodeInvalid, Message: "name the broker to remove"})
	}
	resp, err := c.change(ctx, &transport.Request{Op: opClusterRemove, NodeID: id})
	if err != nil {
		return fmt.Errorf("client: remove broker %s: %w", id, err)
	}
	if resp.Map != nil {
		c.storeMap(resp.Map)
	}
	return nil
}

// Map returns the shard map of the broker the client is connected to
// (falling back to the other brokers of the last map seen when it is
// down). The client keeps the newest map it has seen to route
// subscriptions.
func (c *Client) Map(ctx context.Context) (*Map, error) {
	return c.refreshMap(ctx)
}

// ReplicaStatus asks every broker that holds a replica of a replicated
// stream's shards, and that the current shard map (fetched for the call)
// has live, what its replicas know: the leader and term it sees, and the
// offsets it has committed ([ReplicaState.Next]; a replica behind the
// leader has a smaller one). The brokers are asked at once; one that does
// not answer within the request timeout ([WithRequestTimeout]) gets one
// state per shard it holds, with Err saying why. If ctx ends first, the
// call fails with its error. A stream of
// replication factor 1 has no replicas to report.
func (c *Client) ReplicaStatus(ctx context.Context, stream string) ([]ReplicaState, error) {
	// A fresh map, not the cached one: a status must not name a broker
	// down (and leave it unasked) because the cache was taken while it
	// was, as a Docker nemesis run once saw for a minute after a restart.
	m, err := c.refreshMap(ctx)
	if err != nil {
		return nil, fmt.Errorf("client: replica status of %q: %w", stream, err)
	}
	st, ok := m.Stream(stream)
	if !ok {
		return nil, fmt.Errorf("client: replica status: %w", unknownStream(stream, m.Epoch))
	}
	nodes := map[string][]int{}
	for shard := range st.Shards {
		if set := st.Placement.Replicas(shard); len(set) > 1 {
			for _, n := range set {
				nodes[n] = append(nodes[n], shard)
			}
		}
	}
	// The brokers at once, each for no longer than the request timeout:
	// one that does not answer holds back neither the others nor the call.
	var (
		mu  sync.Mutex
		out []ReplicaState
		wg  sync.WaitGroup
	)
	for id, shards := range nodes {
		wg.Go(func() {
			n, ok := m.Node(id)
			var resp *transport.Response
			err := fmt.Errorf("%s is down in the shard map", id)
			if ok && n.Live && n.Addr != "" {
				var b *brokerConn
				if b, err = c.conn(n.Addr); err == nil {
					resp, err = c.boundedRequest(ctx, b, &transport.Request{Op: opReplicaStatus, Stream: StreamConfig{Name: stream}})
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				for _, s := range shards {
					out = append(out, ReplicaState{Shard: s, Node: id, Err: err.Error()})
				}
				return
			}
			out = append(out, resp.Replicas...)
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("client: replica status of %q: %w", stream, err)
	}
	slices.SortFunc(out, func(a, b ReplicaState) int {
		if a.Shard != b.Shard {
			return a.Shard - b.Shard
		}
		return strings.Compare(a.Node, b.Node)
	})
	return out, nil
}

// ClusterStatus returns the control plane's view of the cluster: members,
// their liveness, and the shard map.
func (c *Client) ClusterStatus(ctx context.Context) (*Map, error) {
	resp, err := c.homeRequest(ctx, &transport.Request{Op: opClusterStatus})
	if err != nil {
		return nil, fmt.Errorf("client: cluster status: %w", err)
	}
	if resp.Map == nil {
		return nil, fmt.Errorf("client: cluster status: %w", &transport.Error{Code: transport.CodeInternal, Message: "response carries no map"})
	}
	c.storeMap(resp.Map)
	return resp.Map, nil
}

// ControlPlane lists the control plane's members: each ctl, whether it is
// the elected leader, and the health of its etcd member. It needs
// cluster.read, as ClusterStatus. A control plane of a version that does
// not report its members returns none.
func (c *Client) ControlPlane(ctx context.Context) ([]CtlMember, error) {
	resp, err := c.homeRequest(ctx, &transport.Request{Op: opClusterStatus})
	if err != nil {
		return nil, fmt.Errorf("client: control plane status: %w", err)
	}
	if resp.Map != nil {
		c.storeMap(resp.Map)
	}
	return resp.Ctl, nil
}

// Grant gives a principal a permission; it needs cluster.admin. Granting
// what is already granted succeeds. The broker the client is connected to
// enforces it as soon as the control plane's next map reaches it.
func (c *Client) Grant(ctx context.Context, g Grant) error {
	if err := g.Validate(); err != nil {
		return fmt.Errorf("client: grant: %w", err)
	}
	if _, err := c.change(ctx, &transport.Request{Op: opACLGrant, Grant: g}); err != nil {
		return fmt.Errorf("client: grant %s: %w", g, err)
	}
	return nil
}

// Revoke takes a permission back; it needs cluster.admin and fails with an
// error matching [ErrInvalid] when the grant does not exist.
func (c *Client) Revoke(ctx context.Context, g Grant) error {
	if _, err := c.change(ctx, &transport.Request{Op: opACLRevoke, Grant: g}); err != nil {
		return fmt.Errorf("client: revoke %s: %w", g, err)
	}
	return nil
}

// Grants lists the permissions in force; it needs cluster.read.
// Superusers are configuration of the control plane and not listed.
func (c *Client) Grants(ctx context.Context) ([]Grant, error) {
	resp, err := c.homeRequest(ctx, &transport.Request{Op: opACLList})
	if err != nil {
		return nil, fmt.Errorf("client: list grants: %w", err)
	}
	return resp.Grants, nil
}

// changeRetryFor bounds how long an admin change is sent again while its
// answers leave its outcome unknown.
const changeRetryFor = 15 * time.Second

// change makes an admin change through the broker the client is connected
// to. The request gets a random ID, and while an answer leaves the
// outcome unknown or says to retry (changeRetriable) it is sent again
// with the same ID, for up to changeRetryFor within ctx, backing off from
// 50 ms to 1 s. The control plane answers a change it made already as it
// did the first time, so a retry is never made twice, nor refused as done
// already (a stream that "exists"). It retries only while the cluster
// passes IDs on (retryChanges); otherwise it sends the change once, as
// before. When it stops with an error after an attempt whose outcome was
// unknown, the error also matches ErrConnectionLost: the connection was
// lost after the request was sent, ctx ended after it was sent (the error
// matches ctx's too), or the answer says the change may have been made
// (mayHaveBeenMade).
func (c *Client) change(ctx context.Context, req *transport.Request) (*transport.Response, error) {
	req.ID = rand.Text()
	retry := c.retryChanges()
	deadline := time.Now().Add(changeRetryFor)
	var unknown error // the first answer that left the outcome unknown
	for attempt, delay := 1, 50*time.Millisecond; ; attempt, delay = attempt+1, min(2*delay, time.Second) {
		resp, sent, home, err := c.homeRoundTrip(ctx, req)
		if err == nil {
			return resp, nil
		}
		if sent && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			// The broker may have relayed it, and the control plane made it.
			err = fmt.Errorf("%w: %s was sent to %s, and ctx ended before its answer came: %w", ErrConnectionLost, req.Op, home.addr, err)
		}
		if unknown == nil && (errors.Is(err, ErrConnectionLost) || mayHaveBeenMade(err)) {
			unknown = err
		}
		if !retry || !changeRetriable(err) || time.Now().Add(delay).After(deadline) || !sleep(ctx, delay) {
			switch {
			case unknown == nil || errors.Is(err, ErrConnectionLost):
				return nil, err
			case attempt == 1:
				return nil, fmt.Errorf("%w: the answer says the change may have been made: %w", ErrConnectionLost, err)
			}
			return nil, fmt.Errorf("%w: sent %d times with one request ID, and an attempt's outcome was unknown (%v); the last answer: %w", ErrConnectionLost, attempt, unknown, err)
		}
	}
}

// mayHaveBeenMade reports whether err is an answer unavailable that
// leaves an admin change's outcome unknown. The wire error carries no
// field that says so, only its message: a broker's relay to the control
// plane that failed after sending the request ("read response", from
// ctlclient.Request: the ctl may have made the change and its answer
// timed out or was lost, which a follower ctl forwarding to the leader
// reports the same way), or a ctl that could not commit the change to
// etcd ("may have been made"). A broker that could not reach the control
// plane (not connected, no stream opened) or a ctl that lost its
// leadership and rolled the change back made nothing.
func mayHaveBeenMade(err error) bool {
	var werr *transport.Error
	if !errors.As(err, &werr) || werr.Code != transport.CodeUnavailable {
		return false
	}
	return strings.Contains(werr.Message, "read response") || strings.Contains(werr.Message, "may have been made")
}

// retryChanges reports whether an admin change is sent again with its
// ID: only while the client's map names the cluster (a control plane
// that answers a change sent again as done) and every broker in it
// advertises transport.FeatureRequestIDs (none drops the ID when it
// relays the request). Otherwise a retry of a change that was made would
// be refused as done already (or, a delete, made again after another
// client created the stream anew).
func (c *Client) retryChanges() bool {
	m := c.cachedMap()
	if m == nil || m.Cluster == "" {
		return false
	}
	for _, n := range m.Nodes {
		if !n.Supports(transport.FeatureRequestIDs) {
			return false
		}
	}
	return true
}

// changeRetriable reports whether an admin change that failed with err is
// sent again: its outcome is unknown (the connection lost, or a control
// plane that could not commit it answered unavailable), or it was not
// made and may be on a retry (the broker restarting, the control plane
// between leaders).
func changeRetriable(err error) bool {
	if errors.Is(err, ErrClosed) {
		return false
	}
	var werr *transport.Error
	if errors.As(err, &werr) {
		return werr.Code == transport.CodeUnavailable || werr.Code == transport.CodeShuttingDown
	}
	var derr *DialError
	return errors.As(err, &derr) || errors.Is(err, ErrConnectionLost)
}

// request runs one request stream on the broker b: one Request out, one
// Response or *transport.Error back. A broker error is returned as the
// *transport.Error, as is an answer over transport.MaxMapFrame
// (frame_too_large); a stream that dies first yields an error wrapping
// ErrConnectionLost.
func (c *Client) request(ctx context.Context, b *brokerConn, req *transport.Request) (*transport.Response, error) {
	resp, _, err := c.roundTrip(ctx, b, req)
	return resp, err
}

// roundTrip is request, also reporting whether req was written whole
// (the broker may have acted on it, whatever the error).
func (c *Client) roundTrip(ctx context.Context, b *brokerConn, req *transport.Request) (_ *transport.Response, sent bool, _ error) {
	l, err := b.hold(ctx)
	if err != nil {
		return nil, false, err
	}
	defer b.release()
	str, err := l.conn.OpenStreamSync(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, false, ctx.Err()
		}
		return nil, false, c.streamErr(ctx, l, fmt.Errorf("opening stream to %s: %w", b.addr, err))
	}
	stop := context.AfterFunc(ctx, func() { cancelStream(str) })
	defer stop()
	defer cancelStream(str)

	w := transport.NewWriter(str)
	w.SetMaxFrame(c.maxFrame())
	if err := w.Write(req); err != nil {
		var werr *transport.Error
		if errors.As(err, &werr) {
			return nil, false, err // it did not encode; nothing was sent
		}
		return nil, false, c.streamErr(ctx, l, err)
	}
	_ = str.Close() // no more frames from us
	// An answer may carry the whole shard map, up to the limit the
	// control plane and brokers write maps with: a reply this client
	// asked for, which the Reader buffers only as it arrives.
	r := transport.NewReader(str, max(c.maxFrame(), transport.MaxMapFrame))
	for {
		f, err := r.Read()
		if err != nil {
			var werr *transport.Error
			if errors.As(err, &werr) && werr.Code == transport.CodeFrameTooLarge {
				// The broker answered, more than this client reads: not an
				// outcome unknown, nor one a retry changes.
				return nil, true, fmt.Errorf("request %s to %s: the answer is larger than this client reads (a broker of a later version?): %w", req.Op, b.addr, err)
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, true, c.streamErr(ctx, l, err)
		}
		l.answer()
		switch f := f.(type) {
		case *transport.Response:
			return f, true, nil
		case *transport.Error:
			return nil, true, f
		case *transport.MapUpdate:
			c.storeMap(f.Map)
		default:
			return nil, true, fmt.Errorf("request %s to %s: %w", req.Op, b.addr, &transport.Error{Code: transport.CodeUnexpectedFrame, Message: "got a " + f.Type().String() + " frame"})
		}
	}
}

// streamErr turns the error of a stream on l that died into the caller's
// context error, ErrClosed, the broker's refusal of the connection (a
// *DialError), or an error wrapping ErrConnectionLost (link.failure).
func (c *Client) streamErr(ctx context.Context, l *link, err error) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case c.closed.Load():
		return ErrClosed
	}
	err = l.failure(err)
	if errors.Is(err, ErrConnectionLost) {
		return fmt.Errorf("stream to broker %s: %w", l.b.addr, err)
	}
	return err
}

func (c *Client) maxFrame() int { return c.cfg.transport.WithDefaults().MaxFrame }

// cancelStream abandons both directions of a stream.
func cancelStream(str *quic.Stream) {
	str.CancelRead(0)
	str.CancelWrite(0)
}
