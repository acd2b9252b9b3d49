package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// fakeCluster is brokers speaking the client protocol over real QUIC, with
// one shared in-memory log per shard. Shard s of a stream is owned by
// node s mod len(nodes), so tests know who owns what.
type fakeCluster struct {
	t       testing.TB
	cfg     transport.Config // the brokers' listeners'
	dir     string
	ca      *x509.CertPool
	brokers []*fakeBroker

	mu struct {
		sync.Mutex
		m       *shardmap.Map
		logs    map[shardmap.ShardID][]transport.Record
		changed chan struct{}                  // closed and replaced on every append
		damaged map[shardmap.ShardID][2]uint64 // offsets served as corrupt (see damage)
	}
	// joining, when set, is a broker whose replicas report themselves
	// joining rather than voters (replica.status).
	joining atomic.Pointer[string]
	// revoked, when set, is a stream the client's principal lost its
	// grants on: map.get answers leave it out (as a broker's map for a
	// principal does), and a subscription to it is refused unauthorized.
	revoked atomic.Pointer[string]
	// staleGets makes this many map.get answers carry stale instead.
	staleGets atomic.Int32
	stale     atomic.Pointer[shardmap.Map]
	// requests counts the admin change requests received with each
	// request ID; a change whose ID was seen is answered as done, as the
	// control plane answers one sent again.
	requests struct {
		sync.Mutex
		seen map[string]int
	}
}

// revoke takes the client's principal's grants on stream away, in a map
// of a new epoch (see revoked).
func (fc *fakeCluster) revoke(stream string) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	m := *fc.mu.m
	m.Epoch++
	fc.mu.m = &m
	fc.revoked.Store(&stream)
}

// sawRequest counts a change request with ID id and reports whether one
// came before it ("" is never seen).
func (fc *fakeCluster) sawRequest(id string) bool {
	if id == "" {
		return false
	}
	fc.requests.Lock()
	defer fc.requests.Unlock()
	if fc.requests.seen == nil {
		fc.requests.seen = map[string]int{}
	}
	fc.requests.seen[id]++
	return fc.requests.seen[id] > 1
}

func newFakeCluster(t testing.TB, n int) *fakeCluster {
	t.Helper()
	return newFakeClusterWith(t, n, transport.Config{})
}

// newFakeClusterWith is newFakeCluster with the brokers' listeners
// configured by cfg (small receive windows, to make a client block).
func newFakeClusterWith(t testing.TB, n int, cfg transport.Config) *fakeCluster {
	t.Helper()
	fc := &fakeCluster{t: t, dir: t.TempDir(), cfg: cfg}
	fc.mu.logs = map[shardmap.ShardID][]transport.Record{}
	fc.mu.changed = make(chan struct{})
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "broker-" + string(rune('0'+i))
	}
	if err := transport.GenerateDevCerts(fc.dir, ids...); err != nil {
		t.Fatal(err)
	}
	ca, err := transport.LoadCA(filepath.Join(fc.dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	fc.ca = ca
	var nodes []shardmap.Node
	for _, id := range ids {
		cert, err := transport.LoadKeyPair(filepath.Join(fc.dir, id+".crt"), filepath.Join(fc.dir, id+".key"))
		if err != nil {
			t.Fatal(err)
		}
		b := &fakeBroker{fc: fc, id: id, cert: cert}
		b.start(t, "127.0.0.1:0")
		fc.brokers = append(fc.brokers, b)
		nodes = append(nodes, shardmap.Node{ID: id, Addr: b.addr, Live: true, Features: transport.Features()})
	}
	fc.mu.Lock()
	fc.mu.m = &shardmap.Map{Epoch: 1, Nodes: nodes, Cluster: fakeClusterID}
	fc.mu.Unlock()
	t.Cleanup(fc.close)
	return fc
}

// fakeClusterID is the fake cluster's ID, in its every map.
const fakeClusterID = "FAKECLUSTER"

func (fc *fakeCluster) close() {
	for _, b := range fc.brokers {
		b.stop()
	}
}

func (fc *fakeCluster) clientOpts(extra ...Opt) []Opt {
	return append([]Opt{WithCA(fc.ca), WithClientCertFile(filepath.Join(fc.dir, "admin.crt"), filepath.Join(fc.dir, "admin.key")), WithReconnect(10*time.Millisecond, 100*time.Millisecond), WithDialTimeout(5 * time.Second)}, extra...)
}

func (fc *fakeCluster) currentMap() *shardmap.Map {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return fc.mu.m
}

// createStream adds a stream to the map under a new epoch.
func (fc *fakeCluster) createStream(cfg shardmap.StreamConfig) error {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	old := fc.mu.m
	if _, ok := old.Stream(cfg.Name); ok {
		return &transport.Error{Code: transport.CodeStreamExists, Message: cfg.Name}
	}
	m := &shardmap.Map{Cluster: old.Cluster, Epoch: old.Epoch + 1, Nodes: old.Nodes, Streams: append([]shardmap.Stream(nil), old.Streams...)}
	owners := make([]string, cfg.Shards)
	sets := make([][]string, cfg.Shards)
	for s := range cfg.Shards {
		owners[s] = old.Nodes[s%len(old.Nodes)].ID
		for r := range min(cfg.Replicas, len(old.Nodes)) {
			sets[s] = append(sets[s], old.Nodes[(s+r)%len(old.Nodes)].ID)
		}
	}
	st := shardmap.Stream{StreamConfig: cfg, Placement: shardmap.NewPlacement(owners...)}
	if cfg.Replicas > 1 {
		st.Placement = shardmap.NewReplicatedPlacement(sets...)
	}
	m.Streams = append(m.Streams, st)
	// keep sorted by name
	for i := len(m.Streams) - 1; i > 0 && m.Streams[i].Name < m.Streams[i-1].Name; i-- {
		m.Streams[i], m.Streams[i-1] = m.Streams[i-1], m.Streams[i]
	}
	fc.mu.m = m
	return nil
}

// clearFeatures serves a newer map whose first broker advertises no
// features (an earlier version's broker).
func (fc *fakeCluster) clearFeatures() {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	old := fc.mu.m
	nodes := slices.Clone(old.Nodes)
	nodes[0].Features = nil
	fc.mu.m = &shardmap.Map{Cluster: old.Cluster, Epoch: old.Epoch + 1, Nodes: nodes, Streams: old.Streams}
}

// moveReplica moves a replica as the control plane does
// (shardmap.Placement.Move, under a new epoch), refusing a live source
// and, with no target named, taking the first live broker without a
// replica of the shard (in id order, where ctl ranks by rendezvous).
func (fc *fakeCluster) moveReplica(stream string, mv transport.ReplicaMove) (transport.ReplicaMove, error) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	old := fc.mu.m
	st, ok := old.Stream(stream)
	if !ok {
		return mv, &transport.Error{Code: transport.CodeUnknownStream, Message: stream}
	}
	if n, _ := old.Node(mv.From); n.Live {
		return mv, &transport.Error{Code: transport.CodeInvalid, Message: mv.From + " is live: stop it first"}
	}
	for _, n := range old.Nodes {
		if mv.To == "" && n.Live && !st.Placement.IsReplica(mv.Shard, n.ID) {
			mv.To = n.ID
		}
	}
	p, err := st.Placement.Move(mv.Shard, mv.From, mv.To, old.Epoch+1)
	if err != nil {
		return mv, &transport.Error{Code: transport.CodeInvalid, Message: err.Error()}
	}
	m := &shardmap.Map{Cluster: old.Cluster, Epoch: old.Epoch + 1, Nodes: old.Nodes, Streams: slices.Clone(old.Streams)}
	for i := range m.Streams {
		if m.Streams[i].Name == stream {
			m.Streams[i].Placement = p
		}
	}
	fc.mu.m = m
	return mv, nil
}

// removeBroker removes broker id from the map's nodes, under a new
// epoch, as the control plane does: refusing one that is not a node, is
// live, or holds a shard or replica.
func (fc *fakeCluster) removeBroker(id string) error {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	old := fc.mu.m
	n, ok := old.Node(id)
	switch {
	case id == "":
		return &transport.Error{Code: transport.CodeInvalid, Message: "name the broker to remove"}
	case !ok:
		return &transport.Error{Code: transport.CodeInvalid, Message: id + " is not a member of the cluster"}
	case n.Live:
		return &transport.Error{Code: transport.CodeInvalid, Message: id + " is live: stop it first"}
	case len(old.ReplicatedBy(id)) > 0:
		return &transport.Error{Code: transport.CodeInvalid, Message: id + " holds replicas: move them first"}
	}
	m := &shardmap.Map{Cluster: old.Cluster, Epoch: old.Epoch + 1, Streams: old.Streams}
	for _, n := range old.Nodes {
		if n.ID != id {
			m.Nodes = append(m.Nodes, n)
		}
	}
	fc.mu.m = m
	return nil
}

// setLive marks broker id live or down in the map, under a new epoch.
func (fc *fakeCluster) setLive(id string, live bool) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	old := fc.mu.m
	m := &shardmap.Map{Cluster: old.Cluster, Epoch: old.Epoch + 1, Nodes: slices.Clone(old.Nodes), Streams: old.Streams}
	for i := range m.Nodes {
		if m.Nodes[i].ID == id {
			m.Nodes[i].Live = live
		}
	}
	fc.mu.m = m
}

// append commits a record and returns its offset.
func (fc *fakeCluster) append(id shardmap.ShardID, p *transport.Publish) (uint64, int64) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	off := uint64(len(fc.mu.logs[id]))
	ts := time.Now().UnixNano()
	fc.mu.logs[id] = append(fc.mu.logs[id], transport.Record{
		Offset: off, Timestamp: ts, Key: p.Key, Value: p.Value, Headers: p.Headers,
		ProducerID: p.ProducerID, ProducerSeq: p.ProducerSeq,
	})
	close(fc.mu.changed)
	fc.mu.changed = make(chan struct{})
	return off, ts
}

// read returns up to n records of a shard from off, or the channel that is
// closed on the next append.
func (fc *fakeCluster) read(id shardmap.ShardID, off uint64, n int) ([]transport.Record, <-chan struct{}, uint64) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	log := fc.mu.logs[id]
	end := uint64(len(log))
	if off >= end {
		return nil, fc.mu.changed, end
	}
	hi := min(end, off+uint64(n))
	if d, ok := fc.mu.damaged[id]; ok && off < d[0] {
		hi = min(hi, d[0]) // records stop before the damage
	}
	return append([]transport.Record(nil), log[off:hi]...), fc.mu.changed, end
}

type pubHook func(str *quic.Stream, first *transport.Publish, r *transport.Reader, w *transport.Writer) bool

// fakeBroker is one broker of a fakeCluster.
type fakeBroker struct {
	fc   *fakeCluster
	id   string
	cert tls.Certificate
	addr string

	holdAcks atomic.Bool // drop publishes without answering
	// refuseIdempotent answers every idempotent publish
	// out_of_order_sequence, a gap no resend closes.
	refuseIdempotent atomic.Bool
	// loseAnswers is how many answers to admin changes to lose: the
	// change is made, then the request's stream is reset unanswered.
	loseAnswers atomic.Int32
	// stallSubs makes subscriptions send the whole log whatever the
	// credit and never read their stream again (a broker that does not
	// read: the client's credit writes block once the window is full).
	stallSubs atomic.Bool
	// firstOffset is where this broker's replicas start: a subscription
	// below it is answered out of range.
	firstOffset atomic.Uint64
	published   atomic.Int64 // publish frames received
	// publishHook, when set, serves publish streams instead (review tests);
	// it reports false to fall back to the normal service.
	publishHook atomic.Pointer[pubHook]
	subs        atomic.Int64 // subscribe frames received
	// subErr, when set, answers every subscription with it.
	subErr atomic.Pointer[transport.Error]
	// rawAnswer, when set, is written as the answer to every request
	// instead, and the stream closed.
	rawAnswer atomic.Pointer[[]byte]
	// hangRequests makes the broker read requests and never answer them
	// (its request handling stuck while its QUIC stack still answers);
	// publishes and subscriptions are still served.
	hangRequests atomic.Bool
	// refuseChanges, when set, answers every admin change with it (as a
	// broker answers unavailable when its relay to the control plane
	// failed), making none.
	refuseChanges atomic.Pointer[transport.Error]

	ln     *transport.Listener
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     struct {
		sync.Mutex
		conns []*quic.Conn
	}
}

func (b *fakeBroker) start(t testing.TB, addr string) {
	t.Helper()
	var ln *transport.Listener
	var err error
	for range 50 { // the port of a restarted broker may take a moment to free
		ln, err = transport.Listen(addr, transport.ServerTLS(b.cert, b.fc.ca, transport.ALPNClient), b.fc.cfg)
		if err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	b.ln, b.addr = ln, ln.Addr().String()
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.wg.Add(1)
	go b.acceptLoop()
}

// stop closes the listener and every connection, as a crash would (the
// client sees the connections close) and waits for its goroutines.
func (b *fakeBroker) stop() {
	if b.ln == nil {
		return
	}
	b.cancel()
	b.mu.Lock()
	conns := b.mu.conns
	b.mu.conns = nil
	b.mu.Unlock()
	for _, c := range conns {
		_ = c.CloseWithError(1, "broker restart")
	}
	_ = b.ln.Close()
	b.wg.Wait()
	b.ln = nil
}

func (b *fakeBroker) restart(t *testing.T) {
	b.stop()
	b.start(t, b.addr)
}

func (b *fakeBroker) acceptLoop() {
	defer b.wg.Done()
	for {
		conn, err := b.ln.Accept(b.ctx)
		if err != nil {
			return
		}
		b.mu.Lock()
		b.mu.conns = append(b.mu.conns, conn)
		b.mu.Unlock()
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			for {
				str, err := conn.AcceptStream(b.ctx)
				if err != nil {
					_ = conn.CloseWithError(0, "")
					return
				}
				b.wg.Add(1)
				go func() {
					defer b.wg.Done()
					defer str.CancelRead(0)
					b.serveStream(conn, str)
				}()
			}
		}()
	}
}

func (b *fakeBroker) serveStream(conn *quic.Conn, str *quic.Stream) {
	r, w := transport.NewReader(str, 0), transport.NewWriter(str)
	f, err := r.Read()
	if err != nil {
		return
	}
	switch f := f.(type) {
	case *transport.Publish:
		if h := b.publishHook.Load(); h != nil && (*h)(str, f, r, w) {
			return
		}
		b.servePublish(f, r, w)
	case *transport.Subscribe:
		b.serveSubscribe(conn, f, r, w)
	case *transport.Request:
		if b.hangRequests.Load() {
			select {
			case <-b.ctx.Done():
			case <-str.Context().Done():
			}
			return
		}
		if werr := b.refuseChanges.Load(); werr != nil && f.Op != opMapGet && f.Op != opClusterStatus {
			_ = w.Write(werr)
			break
		}
		if raw := b.rawAnswer.Load(); raw != nil {
			_, _ = str.Write(*raw)
			break
		}
		resp := b.serveRequest(f)
		if f.ID != "" && b.loseAnswers.Add(-1) >= 0 {
			str.CancelWrite(0)
			str.CancelRead(0)
			return
		}
		w.SetMaxFrame(transport.MaxMapFrame) // as a broker answers
		_ = w.Write(resp)
	}
	_ = str.Close()
}

func (b *fakeBroker) servePublish(p *transport.Publish, r *transport.Reader, w *transport.Writer) {
	for {
		b.published.Add(1)
		if !b.holdAcks.Load() {
			if err := w.Buffer(b.publish(p)); err != nil {
				return
			}
			if !r.Ready() {
				if err := w.Flush(); err != nil {
					return
				}
			}
		}
		f, err := r.Read()
		if err != nil {
			return
		}
		var ok bool
		if p, ok = f.(*transport.Publish); !ok {
			_ = w.Write(&transport.Error{Code: transport.CodeUnexpectedFrame})
			return
		}
	}
}

func (b *fakeBroker) publish(p *transport.Publish) transport.Frame {
	if p.ProducerSeq > 0 && b.refuseIdempotent.Load() {
		return &transport.Error{Seq: p.Seq, Code: transport.CodeOutOfOrderSequence, Message: "fake: a gap"}
	}
	m := b.fc.currentMap()
	st, ok := m.Stream(p.Stream)
	if !ok {
		return &transport.Error{Seq: p.Seq, Code: transport.CodeUnknownStream, Message: p.Stream}
	}
	shard := int(p.Shard)
	if shard < 0 {
		shard = shardmap.ShardFor(p.Key, st.Shards)
	}
	if shard >= st.Shards {
		return &transport.Error{Seq: p.Seq, Code: transport.CodeUnknownStream, Message: "no such shard"}
	}
	off, ts := b.fc.append(shardmap.ShardID{Stream: p.Stream, Shard: shard}, p)
	owner := st.Placement.Owner(shard)
	return &transport.Ack{Seq: p.Seq, Stream: p.Stream, Shard: int32(shard), Offset: off, Timestamp: ts,
		Owner: owner, Via: b.id, Forwarded: owner != b.id}
}

func (b *fakeBroker) serveRequest(req *transport.Request) transport.Frame {
	if b.fc.sawRequest(req.ID) {
		return &transport.Response{Map: b.fc.currentMap()}
	}
	var resp transport.Frame
	switch req.Op {
	case opMapGet, opClusterStatus:
		m := b.fc.currentMap()
		if b.fc.staleGets.Add(-1) >= 0 {
			m = b.fc.stale.Load()
		}
		if name := b.fc.revoked.Load(); name != nil {
			hidden := *m
			hidden.Streams = slices.DeleteFunc(slices.Clone(m.Streams), func(st shardmap.Stream) bool { return st.Name == *name })
			m = &hidden
		}
		resp = &transport.Response{Map: m}
	case opStreamCreate:
		if err := b.fc.createStream(req.Stream); err != nil {
			resp = transport.ErrorFrom(err)
		} else {
			resp = &transport.Response{}
		}
	case opReplicaStatus:
		// Every replica this broker holds runs, as a voter.
		var out []transport.ReplicaState
		if st, ok := b.fc.currentMap().Stream(req.Stream.Name); ok {
			for shard := range st.Shards {
				if slices.Contains(st.Placement.Replicas(shard), b.id) {
					// The first replica leads (the fake has no elections).
					rs := transport.ReplicaState{Shard: shard, Node: b.id, Member: "voter", Leader: st.Placement.Replicas(shard)[0]}
					if j := b.fc.joining.Load(); j != nil && *j == b.id {
						rs.Member, rs.Leader = "joining", ""
					}
					out = append(out, rs)
				}
			}
		}
		resp = &transport.Response{Replicas: out}
	case opStreamMove:
		if req.Move == nil {
			resp = &transport.Error{Code: transport.CodeInvalid, Message: "no move"}
			break
		}
		if mv, err := b.fc.moveReplica(req.Stream.Name, *req.Move); err != nil {
			resp = transport.ErrorFrom(err)
		} else {
			resp = &transport.Response{Map: b.fc.currentMap(), Moved: &mv}
		}
	case opClusterRemove:
		if err := b.fc.removeBroker(req.NodeID); err != nil {
			resp = transport.ErrorFrom(err)
		} else {
			resp = &transport.Response{Map: b.fc.currentMap()}
		}
	case opStreamList:
		var out []shardmap.StreamConfig
		for _, s := range b.fc.currentMap().Streams {
			out = append(out, s.StreamConfig)
		}
		resp = &transport.Response{Streams: out}
	case opStreamInfo:
		st, ok := b.fc.currentMap().Stream(req.Stream.Name)
		if !ok {
			resp = &transport.Error{Code: transport.CodeUnknownStream, Message: req.Stream.Name}
		} else {
			resp = &transport.Response{Streams: []shardmap.StreamConfig{st.StreamConfig}}
		}
	default:
		resp = &transport.Error{Code: transport.CodeInvalid, Message: "op " + req.Op}
	}
	return resp
}

func (b *fakeBroker) serveSubscribe(conn *quic.Conn, sub *transport.Subscribe, r *transport.Reader, w *transport.Writer) {
	b.subs.Add(1)
	if e := b.subErr.Load(); e != nil {
		_ = w.Write(e)
		return
	}
	if name := b.fc.revoked.Load(); name != nil && *name == sub.Stream {
		_ = w.Write(&transport.Error{Code: transport.CodeUnauthorized, Message: "principal admin may not subscribe to " + sub.Stream})
		return
	}
	m := b.fc.currentMap()
	st, ok := m.Stream(sub.Stream)
	if !ok || int(sub.Shard) >= st.Shards || sub.Shard < 0 {
		_ = w.Write(&transport.Error{Code: transport.CodeUnknownStream, Message: sub.Stream})
		return
	}
	if (sub.Cluster != "" && sub.Cluster != m.Cluster) || (sub.Created != 0 && sub.Created != st.Created) { // as broker/subscribe.go does
		_ = w.Write(&transport.Error{Code: transport.CodeUnknownStream, Epoch: m.Epoch, Message: "another cluster's stream, or one deleted"})
		return
	}
	if owner := st.Placement.Owner(int(sub.Shard)); owner != b.id && !st.Placement.IsReplica(int(sub.Shard), b.id) {
		_ = w.Write(&transport.Error{Code: transport.CodeNotOwner, Owner: owner, Epoch: m.Epoch})
		return
	}
	if first := b.firstOffset.Load(); sub.Start == transport.StartOffset && sub.Offset < first {
		_ = w.Write(&transport.Error{Code: transport.CodeOutOfRange, Message: fmt.Sprintf("offset %d is below the first retained offset %d", sub.Offset, first)})
		return
	}
	id := shardmap.ShardID{Stream: sub.Stream, Shard: int(sub.Shard)}
	_, _, end := b.fc.read(id, 0, 0)
	next := uint64(0)
	switch sub.Start {
	case transport.StartLatest:
		next = end
	case transport.StartOffset:
		next = sub.Offset
	}

	if b.stallSubs.Load() {
		for {
			recs, _, _ := b.fc.read(id, next, 64)
			if len(recs) == 0 {
				break
			}
			if err := w.Write(&transport.Records{Stream: sub.Stream, Shard: sub.Shard, Records: recs}); err != nil {
				return
			}
			next += uint64(len(recs))
		}
		select {
		case <-conn.Context().Done():
		case <-b.ctx.Done():
		}
		return
	}

	var credit atomic.Int64
	credit.Store(int64(sub.Credit))
	granted := make(chan struct{}, 1)
	done := make(chan struct{})
	defer func() { <-done }()
	go func() { // credit reader; ends when the stream does
		defer close(done)
		for {
			f, err := r.Read()
			if err != nil {
				return
			}
			if c, ok := f.(*transport.Credit); ok {
				credit.Add(int64(c.Records))
				select {
				case granted <- struct{}{}:
				default:
				}
			}
		}
	}()
	defer conn.Context() // keep conn referenced
	for {
		n := credit.Load()
		var changed <-chan struct{}
		if n > 0 {
			var recs []transport.Record
			if e := b.fc.damagedAt(id, next); e != nil {
				_ = w.Write(e)
				return
			}
			recs, changed, _ = b.fc.read(id, next, int(min(n, 64)))
			if len(recs) > 0 {
				if err := w.Write(&transport.Records{Stream: sub.Stream, Shard: sub.Shard, Records: recs}); err != nil {
					return
				}
				credit.Add(-int64(len(recs)))
				next += uint64(len(recs))
				continue
			}
		}
		select {
		case <-changed: // nil while out of credit
		case <-granted:
		case <-done:
			return
		case <-conn.Context().Done():
			return
		case <-b.ctx.Done():
			return
		}
	}
}

var errTest = errors.New("test")
