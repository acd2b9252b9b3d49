package broker

import (
	"github.com/felix-broker/felix/auth"

	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
	"github.com/felix-broker/felix/wal"
)

// pubSession serves one publisher stream, from a client or from a
// forwarding peer (see the package doc, "Goroutines of the publish path",
// for who owns what). Its reader goroutine decodes publishes, takes them
// in and routes them; answers are written by whoever completes each
// record; no lock is held across anything that can block.
type pubSession struct {
	b      *Broker
	s      *quic.Stream
	r      *transport.Reader
	peerID string // the forwarding broker's node id; "" for a client
	from   caller // who the stream acts for
	acks   *ackWriter

	// allowed is the stream this client was last authorized to publish
	// to, at map epoch allowedEpoch: the reader goroutine's cache, so a
	// publisher of one stream is authorized once per map, not per record.
	allowed      string
	allowedEpoch uint64

	ctx    context.Context // cancelled when the session ends
	cancel context.CancelFunc

	slots   chan struct{}  // one per record in flight or answered and not written (Config.PublishInFlight)
	budget  *byteBudget    // the client principal's publish bytes (Config.PublishBytesPerPrincipal); nil for a peer
	pending sync.WaitGroup // records in flight
	workers sync.WaitGroup // lane connectors and readers, the retrier, the writers' flushers
	stopped atomic.Bool    // Close asked the session to stop reading
	// draining: Close began the drain (drain). The reader reads on, until
	// the client ends its side or Close stops it reading, and refuses
	// every record it reads from then on, not taking it in.
	draining atomic.Bool
	idle     chan struct{} // closed when the session has answered everything

	// lanes are the session's forwarding lanes, by owner node id. The
	// reader and the retrier route onto them; the mutex guards only the
	// lookup or insertion (a lane is opened without waiting for it).
	lanes struct {
		sync.Mutex
		m      map[string]*lane
		closed bool // closeLanes ran: nothing more is forwarded
	}

	// order keeps the records of each shard in the order received while
	// some are routed again, and runs the retrier (order.go).
	order routeOrder

	// received numbers the records the reader takes in (the reader's).
	received uint64
}

// servePublish serves a publisher stream whose first frame was first, or
// a publish skipped for its size (skipped, and first nil).
func (b *Broker) servePublish(s *quic.Stream, r *transport.Reader, first *transport.Publish, skipped *transport.Error, from caller) {
	p := &pubSession{
		b: b, s: s, r: r, peerID: from.peerID, from: from,
		slots: make(chan struct{}, b.cfg.PublishInFlight),
		idle:  make(chan struct{}),
	}
	p.lanes.m = map[string]*lane{}
	p.order.init()
	if from.use != nil {
		p.budget = from.use.use.publish
	}
	p.acks = newAckWriter(s, &p.workers, p.release)
	p.ctx, p.cancel = context.WithCancel(b.ctx)
	defer p.cancel()
	defer close(p.idle)

	b.mu.Lock()
	if b.mu.closing {
		b.mu.Unlock()
		var seq uint64
		if first != nil {
			seq = first.Seq
		} else {
			seq = skipped.Seq
		}
		werr := b.leavingRefusal()
		werr.Seq = seq
		b.refuse(s, werr)
		return
	}
	b.mu.pubs[p] = struct{}{}
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.mu.pubs, p)
		b.mu.Unlock()
	}()

	if first != nil {
		p.handle(first)
	} else {
		p.refuseSkipped(skipped)
	}
	for {
		f, err := p.r.ReadIf(transport.FramePublish)
		if err != nil {
			var werr *transport.Error
			if errors.Is(err, transport.ErrSkipped) && errors.As(err, &werr) {
				// A publish over the size limit, skipped whole: answer it
				// and read on.
				if !p.refuseSkipped(werr) {
					break
				}
				continue
			}
			if errors.As(err, &werr) && !p.stopped.Load() {
				// The stream cannot be resynchronized after a bad frame:
				// answer it, finish what was taken in, close the stream.
				p.acks.send(werr)
				s.CancelRead(quic.StreamErrorCode(werr.Code))
			} else if !errors.Is(err, io.EOF) && !p.stopped.Load() {
				p.b.log.Debug("publisher stream ended", "err", err)
			}
			break
		}
		if !p.handle(f.(*transport.Publish)) {
			break
		}
	}
	p.finish()
}

// inbound is one publish this broker took in, carried from its receipt to
// its answer.
type inbound struct {
	pub *transport.Publish

	// last: no further frame was buffered on the stream when this one was
	// read, so the reader may commit it itself (wal.Log.AppendNow). Set
	// here on receipt, cleared by rerouted.
	last bool

	// charge is what the record holds of its principal's publish budget
	// until its answer is written; 0 for a peer's.
	charge int64

	// ev is what happens to it, for telemetry (events.go), which builds
	// its spans and metrics from it once it is answered.
	ev pubEvents

	// deadline is set (monoNow) when a record of a replicated shard is
	// first routed (replicated.go): when it stops waiting for a leader.
	// Zero for replication factor 1, which pays nothing more per record.
	deadline int64

	// n is the record's place in the stream (receipt order), route the
	// shard's route it is counted on until answered or handed back, and
	// resumed marks the retrier's dispatch of a waiting record (order.go).
	n       uint64
	route   *shardRoute
	resumed bool

	// passed are the replicas of a replicated shard that refused the
	// record knowing no leader, or could not be reached, since one named
	// a leader: guessLeader tries the others first (replicated.go). In
	// resumed's padding: the record is no larger for it.
	passed replicaMask

	// placed is the map epoch a client's record was placed by when the
	// shard it picked was of a stream since created again (dispatch): its
	// ack carries it (transport.Ack.Epoch). 0 otherwise.
	placed uint64
}

// replicated reports whether in is a record of a replicated shard.
func (in *inbound) replicated() bool { return in.deadline != 0 }

// expired reports whether a replicated record is past its deadline.
func (in *inbound) expired() bool { return monoNow() > in.deadline }

// monoStart is the origin of monoNow, set once as the package loads.
var monoStart = time.Now()

// monoNow is the time since monoStart in nanoseconds, on the monotonic
// clock: routing deadlines are measured on it, so that a step of the
// wall clock neither stretches nor cuts "fails unavailable within
// ForwardTimeout". It reads no wall clock (cheaper than time.Now), and an
// int64 keeps inbound small.
func monoNow() int64 { return int64(time.Since(monoStart)) }

// rerouted returns in as a goroutine other than the reader (the retrier)
// dispatches it again: queued, never committed inline, whatever was
// buffered when it was read.
func (in inbound) rerouted() inbound {
	in.last = false
	return in
}

// handle takes one publish in. It returns false when the session is ending.
func (p *pubSession) handle(pub *transport.Publish) bool {
	// received takes the hop context off the headers, traced or not.
	p.received++
	in := inbound{pub: pub, last: !p.r.Ready(), ev: p.b.tel.received(pub, p.peerID), n: p.received}
	if p.draining.Load() {
		return p.refuseLeaving(in)
	}
	if p.peerID == "" {
		// Only a forwarding peer may speak for an epoch or another broker;
		// a client's Created says which incarnation it picked Shard by.
		pub.Epoch, pub.Via = 0, ""
		if pub.Shard < 0 {
			pub.Created = 0
		}
	}
	hlen := headersLen(pub.Headers)
	pid := pub.ProducerID
	if p.peerID != "" {
		// Scoped by the client's principal where it was received
		// (producerscope.go): counted as the client gave it, so a record
		// within the limit when published to the owner is within it
		// when forwarded.
		pid = producerName(pid)
	}
	size := len(pub.Key) + len(pub.Value) + hlen + len(pid)
	// Charged by what the broker holds until the answer: the frame, which
	// may be larger than its fields (detachHeaders).
	wire := p.r.LastSize()
	if !p.take(&in, max(size, wire)) {
		return false
	}
	detachHeaders(pub, hlen, wire)
	if err := p.authorize(pub); err != nil {
		p.fail(in, err)
		return true
	}
	in.ev.taken = true // counted in at its answer
	if err := p.checkRecord(pub, size, hlen); err != nil {
		p.fail(in, err)
		return true
	}
	if p.peerID == "" && pub.ProducerID != "" {
		pub.ProducerID = scopeProducer(p.from.principal, pub.ProducerID) // producerscope.go
	}
	p.dispatch(in, 0)
	return true
}

// authorize checks that the stream may carry pub: a client's principal
// must be allowed to publish to pub's stream, which must have a valid name
// (checked first, refused invalid); a peer may only forward in its own
// name (Via is the peer's node id, as its certificate says).
func (p *pubSession) authorize(pub *transport.Publish) *transport.Error {
	if p.peerID != "" {
		if pub.Via != p.peerID {
			return transport.Errorf(transport.CodeUnauthorized, "peer %q forwarded a record as %q: a peer forwards in its own name only", p.peerID, pub.Via)
		}
		return nil
	}
	m := p.b.member.Map()
	if pub.Stream == p.allowed && m.Epoch == p.allowedEpoch {
		return nil
	}
	if err := checkStreamName(pub.Stream); err != nil {
		return err
	}
	if err := p.b.authorize(m, p.from, auth.Publish, pub.Stream); err != nil {
		return err
	}
	p.allowed, p.allowedEpoch = pub.Stream, m.Epoch
	return nil
}

// take takes a slot and the principal's budget for a record of size bytes
// (waiting for them: this is what stops reading a publisher that has too
// much in flight or too many answers unwritten), and counts the record
// pending. It returns false when the session is ending.
func (p *pubSession) take(in *inbound, size int) bool {
	select {
	case p.slots <- struct{}{}:
	default:
		p.held(limitPublishInFlight, "the stream has %d records in flight or answered and not written (PublishInFlight); read the acks", p.b.cfg.PublishInFlight)
		select {
		case p.slots <- struct{}{}:
		case <-p.ctx.Done():
			return false
		}
	}
	if p.budget != nil {
		in.charge = int64(size) + ackReserve
		if !p.budget.tryAcquire(in.charge) {
			p.held(limitPublishBytes, "the principal's publisher streams hold %d bytes in flight or in unwritten answers (PublishBytesPerPrincipal)", p.budget.max)
			if !p.budget.acquire(in.charge, p.ctx.Done(), nil) {
				<-p.slots
				return false
			}
		}
	}
	p.pending.Add(1)
	p.b.tel.taken(&in.ev)
	return true
}

// held counts a limit that holds the publisher back (it is not refused:
// the broker stops reading its stream until the limit frees up).
func (p *pubSession) held(limit, format string, args ...any) {
	who := p.from.principal
	if p.peerID != "" {
		who = "peer " + p.peerID
	}
	p.b.limits.hit(limit, who, fmt.Sprintf(format, args...))
}

// release gives back what written answers held: their slots and charges.
// It is the ackWriter's release.
func (p *pubSession) release(records, bytes int64) {
	for range records {
		<-p.slots
	}
	if p.budget != nil {
		p.budget.release(bytes)
	}
}

// refuseSkipped answers a publish the stream's reader skipped because its
// frame was over the size limit: refused for its size as a record
// decoded and found over MaxPayload is, whether a client or a forwarding
// peer sent it (werr, the reader's, names the frame's size and limit,
// for the limit's log).
func (p *pubSession) refuseSkipped(werr *transport.Error) bool {
	pub := &transport.Publish{Seq: werr.Seq}
	in := inbound{pub: pub, ev: p.b.tel.untraced(pub, p.peerID)}
	if !p.take(&in, 0) {
		return false
	}
	p.b.limits.hit(limitRecordBytes, p.from.principal+p.peerID, werr.Message)
	p.fail(in, p.b.tooLarge(0))
	return true
}

// tooLarge is the refusal of a record over MaxPayload, of size bytes (0:
// not known, its frame was skipped). A client gets the same whether it
// published to the record's owner or through another broker, and it
// names the broker and its limit: during a rolling change of
// --max-record-bytes the owner's limit may be below the receiving
// broker's.
func (b *Broker) tooLarge(size int) *transport.Error {
	what := "record"
	if size > 0 {
		what = fmt.Sprintf("record of %d bytes", size)
	}
	return &transport.Error{Code: transport.CodePayloadTooLarge,
		Message: fmt.Sprintf("%s (key, value, headers and producer id) exceeds the record limit of %s, %d bytes (--max-record-bytes)", what, b.cfg.NodeID, b.cfg.MaxPayload)}
}

// checkRecord refuses a record over the header or size limits, before
// anything of it is buffered. size is the record's bytes, hlen its
// headers'.
func (p *pubSession) checkRecord(pub *transport.Publish, size, hlen int) *transport.Error {
	cfg, who := &p.b.cfg, p.from.principal+p.peerID
	limit := transport.MaxProducerIDLen
	if p.peerID != "" {
		limit = maxScopedProducerID // the receiving broker scoped it
	}
	if len(pub.ProducerID) > limit {
		// Each producer id is kept by the shard's producer table (up to
		// MaxProducers of them, for ProducerExpiry): its length bounds
		// what one client can make the table hold.
		msg := fmt.Sprintf("producer id of %d bytes; the limit is %d", len(pub.ProducerID), limit)
		p.b.limits.hit(limitProducerID, who, msg)
		return &transport.Error{Code: transport.CodeInvalid, Message: msg}
	}
	if len(pub.Headers) > cfg.MaxHeaders {
		msg := fmt.Sprintf("record has %d headers; the broker's limit is %d (MaxHeaders)", len(pub.Headers), cfg.MaxHeaders)
		p.b.limits.hit(limitHeaders, who, msg)
		return &transport.Error{Code: transport.CodeInvalid, Message: msg}
	}
	if hlen > cfg.MaxHeaderBytes {
		msg := fmt.Sprintf("record has %d bytes of headers; the broker's limit is %d (MaxHeaderBytes)", hlen, cfg.MaxHeaderBytes)
		p.b.limits.hit(limitHeaderBytes, who, msg)
		return &transport.Error{Code: transport.CodePayloadTooLarge, Message: msg}
	}
	if size > cfg.MaxPayload {
		e := p.b.tooLarge(size)
		p.b.limits.hit(limitRecordBytes, who, e.Message)
		return e
	}
	return nil
}

// detachHeaders gives pub's headers their own copy when keeping them
// would keep much more of its frame alive than they hold: the log keeps
// the map itself in its in-memory tail, and the decoded map's strings
// point into one copy of the whole frame body (transport.DecodeFrame),
// wire bytes long, which the sender sizes (a large key or value, which
// the tail copies, or fields a broker ignores). Up to 1 KiB more is kept
// as it is, which saves small records an allocation.
func detachHeaders(pub *transport.Publish, hlen, wire int) {
	if hlen == 0 || wire <= hlen+1024 {
		return
	}
	h := make(map[string]string, len(pub.Headers))
	for k, v := range pub.Headers {
		h[strings.Clone(k)] = strings.Clone(v)
	}
	pub.Headers = h
}

func headersLen(h map[string]string) int {
	n := 0
	for k, v := range h {
		n += len(k) + len(v)
	}
	return n
}

// dispatch routes pub by the broker's current map: a local append when this
// broker owns the shard, a forward when it does not, a NotOwner refusal
// when a peer forwarded it here by a map this broker no longer agrees
// with. The session's reader calls it, and its retrier for a re-route;
// it holds no lock. A reader can wait in it only for a map as new as the
// sender's (a forwarder's epoch, or the incarnation a client picked the
// shard by), which holds back that stream alone.
func (p *pubSession) dispatch(in inbound, attempt int) {
	b, pub := p.b, in.pub
	m := b.routingMap()
	if need := max(pub.Epoch, pub.Created); need > m.Epoch && !p.servesIncarnation(m, pub) {
		// The sender has seen a newer map than ours: catch up before
		// judging ownership, so a moved shard is never written twice.
		nm, err := p.catchUp(need)
		if err != nil {
			p.fail(in, &transport.Error{Code: transport.CodeUnavailable,
				Message: fmt.Sprintf("%s could not catch up to map epoch %d: %v", b.cfg.NodeID, need, err)})
			return
		}
		m = nm
	}
	if p.peerID != "" {
		if _, ok := m.Node(p.peerID); !ok {
			// A node certificate of the cluster's CA that no longer, or
			// never, names a member (a broker removed, a stray
			// certificate): its records would be written without any
			// principal's check. A new member's map is newer than ours,
			// and we caught up to it above.
			p.fail(in, &transport.Error{Code: transport.CodeUnauthorized, Epoch: m.Epoch,
				Message: fmt.Sprintf("node %q is not a member of the cluster (map epoch %d): it forwards no record", p.peerID, m.Epoch)})
			return
		}
	}
	st, ok := m.Stream(pub.Stream)
	if !ok {
		p.fail(in, &transport.Error{Code: transport.CodeUnknownStream, Epoch: m.Epoch,
			Message: fmt.Sprintf("stream %q does not exist; create it with `felixctl stream create %s`", pub.Stream, pub.Stream)})
		return
	}
	if pub.Created != 0 && pub.Created != st.Created {
		// The shard was picked by another stream of this name, of another
		// shard count perhaps: a forwarder routes it again by a newer map.
		// A client's plain record goes to the stream of that name now,
		// placed by this map as the SDK would have (any shard is right
		// for a keyless one), and its ack names the map for the client to
		// fetch. An idempotent publisher's sequences are per shard, so its
		// record is refused, not placed elsewhere.
		if p.peerID == "" && pub.ProducerID == "" && st.Shards > 0 {
			shard := int(pub.Shard) % st.Shards
			if len(pub.Key) > 0 {
				shard = shardmap.ShardFor(pub.Key, st.Shards)
			}
			pub.Shard, pub.Created = int32(shard), st.Created
			in.placed = m.Epoch
		} else if p.peerID != "" {
			p.fail(in, &transport.Error{Code: transport.CodeNotOwner, Epoch: m.Epoch,
				Message: fmt.Sprintf("stream %q was created again at map epoch %d; the record was routed by the stream of epoch %d", pub.Stream, st.Created, pub.Created)})
			return
		} else {
			p.fail(in, &transport.Error{Code: transport.CodeUnknownStream, Epoch: m.Epoch,
				Message: fmt.Sprintf("stream %q of map epoch %d, whose shard %d the record was published to, was deleted; the stream of that name now was created at epoch %d: publish the record again", pub.Stream, pub.Created, pub.Shard, st.Created)})
			return
		}
	}
	shard := int(pub.Shard)
	if pub.Shard < 0 {
		shard = shardmap.ShardFor(pub.Key, st.Shards)
	} else if shard >= st.Shards {
		p.fail(in, &transport.Error{Code: transport.CodeInvalid,
			Message: fmt.Sprintf("stream %q has %d shards; there is no shard %d", pub.Stream, st.Shards, shard)})
		return
	}
	if st.Replicas > 1 {
		p.dispatchReplicated(in, m, st, shard, attempt)
		return
	}
	owner := st.Placement.Owner(shard)
	in.ev.route(shard, owner)
	switch {
	case owner == b.cfg.NodeID:
		p.appendLocal(in, m, shard)
	case p.peerID != "":
		p.fail(in, &transport.Error{Code: transport.CodeNotOwner, Epoch: m.Epoch, Owner: owner,
			Message: fmt.Sprintf("%s does not own %s/%d at epoch %d; %s does", b.cfg.NodeID, pub.Stream, shard, m.Epoch, owner)})
	default:
		p.forward(in, m, shard, owner, attempt)
	}
}

// catchUp returns a map at least as new as epoch, which this stream's
// sender named: a peer's epoch through the broker's remembered misses
// (Broker.catchUp), a client's through the one catch-up all clients share
// (clientCatchUp).
func (p *pubSession) catchUp(epoch uint64) (*shardmap.Map, error) {
	if p.peerID != "" {
		return p.b.catchUp(p.ctx, epoch)
	}
	m := p.b.catchUpForClient(p.ctx, epoch)
	if m.Epoch < epoch {
		return nil, fmt.Errorf("the control plane gave no map of epoch %d within %v (holding %d)", epoch, p.b.cfg.ForwardTimeout, m.Epoch)
	}
	return m, nil
}

// servesIncarnation reports whether m, older than the map pub was
// forwarded by, already has what judging pub needs from the newer one:
// the same incarnation of pub's stream (pub.Created, which only a
// forwarder sets) with pub's shard placed on this broker. A shard's
// placement is fixed for its stream's incarnation (it moves only when
// its owner leaves the membership, and not back), and the forwarder
// routed pub here by the newer map, so both maps name this broker: the
// epochs in between changed something else (a broker's liveness, another
// stream), and pub need not wait for them. Without this an owner that
// missed the last maps (its control-plane link was down while the others
// got them) refused every forward until it caught up.
func (p *pubSession) servesIncarnation(m *shardmap.Map, pub *transport.Publish) bool {
	if pub.Created == 0 || pub.Shard < 0 {
		return false
	}
	st, ok := m.Stream(pub.Stream)
	if !ok || st.Created != pub.Created || int(pub.Shard) >= st.Shards {
		return false
	}
	if st.Replicas > 1 {
		return slices.Contains(st.Placement.Replicas(int(pub.Shard)), p.b.cfg.NodeID)
	}
	return st.Placement.Owner(int(pub.Shard)) == p.b.cfg.NodeID
}

// appendLocal appends pub to this broker's log of the shard; the ack is
// written by the shard's committer once the record is fsynced.
func (p *pubSession) appendLocal(in inbound, m *shardmap.Map, shard int) {
	b, pub := p.b, in.pub
	id := shardmap.ShardID{Stream: pub.Stream, Shard: shard}
	if !p.onRoute(&in, id, nil, 0, false) {
		return // waits behind the shard's earlier records (order.go)
	}
	idem := pub.ProducerID != "" && pub.ProducerSeq > 0
	if !idem { // an idempotent record is checked once judged (below)
		if werr := p.diskFull(); werr != nil {
			p.fail(in, werr)
			return
		}
	}
	e, err := b.shards.acquire(m, id)
	if err != nil {
		p.fail(in, &transport.Error{Code: transport.CodeUnavailable,
			Message: fmt.Sprintf("%s cannot open its log of %s: %v", b.cfg.NodeID, id, err)})
		return
	}
	defer e.release() // once the record is queued, closing the log commits it
	via := pub.Via
	if via == "" {
		via = b.cfg.NodeID
	}
	var prod *producer // set for an idempotent publish to append
	pseq := pub.ProducerSeq
	if idem {
		if prod = p.admitIdempotent(in, e, shard, via, 0); prod == nil {
			return // answered, or shares the outcome of the same record in flight
		}
		if p.refusedForDisk(in, e, prod) {
			return
		}
	}
	b.tel.stampRouted(&in.ev)
	a := localAppends.Get().(*localAppend)
	a.p, a.e, a.in, a.prod, a.pseq, a.id, a.via = p, e, in, prod, pseq, id, via
	a.rec = wal.Record{
		ProducerID:  pub.ProducerID,
		ProducerSeq: pub.ProducerSeq,
		Headers:     pub.Headers,
		Key:         pub.Key,
		Value:       pub.Value,
	}
	// With no further frame buffered the reader would only wait for one,
	// so it may commit this record itself when the log is idle (saving the
	// hand-off to the committer and back); while frames are buffered it
	// queues them, so pipelined records share an fsync. a is not touched
	// once appended: it may already be answered and reused.
	if in.last {
		e.log.AppendNow(&a.rec, a.done)
	} else {
		e.log.AppendAsync(&a.rec, a.done)
	}
	if prod != nil {
		e.producers.enqueued(prod) // a later sequence of prod may now be queued
	}
}

// localAppend is a record on its way into this broker's log of its shard,
// with what its answer needs once the log has committed it: one object
// per record, reused through localAppends (a closure over the record's
// inbound moved it to the heap, about 600 bytes allocated per record in
// three objects).
type localAppend struct {
	p    *pubSession
	e    *shardEntry
	in   inbound
	prod *producer // set for an idempotent publish
	pseq uint64
	id   shardmap.ShardID
	via  string
	rec  wal.Record    // what the log appends; not read by it once done runs
	ack  transport.Ack // the answer, encoded as it is written
	done func(offset uint64, ts int64, err error)
}

var localAppends sync.Pool

func init() {
	localAppends.New = func() any {
		a := new(localAppend)
		a.done = a.committed // bound once: a method value allocates
		return a
	}
}

// committed answers the record once its log has committed it (or failed
// to), then returns a to the pool.
func (a *localAppend) committed(offset uint64, ts int64, err error) {
	p, e, pub := a.p, a.e, a.in.pub
	if a.prod != nil {
		e.producers.committed(a.prod, a.pseq, offset, ts, err)
	}
	if err != nil {
		code := transport.CodeInternal
		msg := fmt.Sprintf("%s could not write %s: %v", p.b.cfg.NodeID, a.id, err)
		switch {
		case errors.Is(err, wal.ErrClosed):
			code = transport.CodeShuttingDown
		case errors.Is(err, wal.ErrFailed):
			// The log failed a write or an fsync and stopped (fail-stop):
			// this record's outcome is unknown (its bytes may reach the
			// disk all the same), and the shard takes no more until its
			// log is reopened.
			code = transport.CodeUnavailable
			msg = fmt.Sprintf("%s's log of %s failed (%v): the record may or may not have been written; the shard takes no more records until %s restarts", p.b.cfg.NodeID, a.id, err, p.b.cfg.NodeID)
		}
		p.reply(&a.in, &transport.Error{Seq: pub.Seq, Code: code, Message: msg})
	} else {
		e.commits.stamp(&a.in.ev) // committed: the commit its log just made
		e.answers.cork(p.acks)    // written with the commit's other acks
		node := p.b.cfg.NodeID
		a.ack = transport.Ack{Seq: pub.Seq, Stream: pub.Stream, Shard: int32(a.id.Shard), Offset: offset,
			Timestamp: ts, Owner: node, Via: a.via, Forwarded: a.via != node}
		p.reply(&a.in, &a.ack)
	}
	*a = localAppend{done: a.done}
	localAppends.Put(a)
}

// fail answers pub with err.
func (p *pubSession) fail(in inbound, err *transport.Error) {
	err.Seq = in.pub.Seq
	p.reply(&in, err)
}

// reply writes in's answer, f (an *transport.Ack or a *transport.Error),
// counts the record answered, and hands its events to telemetry. The
// record's slot and charge are released when the answer is written.
func (p *pubSession) reply(in *inbound, f transport.Frame) {
	t := p.b.tel
	t.stampAnswered(&in.ev)
	_, acked := f.(*transport.Ack)
	p.resolved(in, acked)
	switch f := f.(type) {
	case *transport.Ack:
		in.ev.offset = f.Offset
		f.Epoch = in.placed
	case *transport.Error:
		in.ev.err = f
	}
	p.acks.answer(f, in.charge)
	p.done()
	t.observe(&in.ev)
}

// done counts a record answered. Its slot and charge are released when
// the answer is written (see ackWriter).
func (p *pubSession) done() {
	p.pending.Done()
}

// finish waits until every record taken in is answered, then closes the
// stream. A forward that cannot finish within ForwardTimeout is failed by
// closing its lane.
func (p *pubSession) finish() {
	answered := make(chan struct{})
	go func() {
		p.pending.Wait()
		close(answered)
	}()
	select {
	case <-answered:
	case <-time.After(p.b.cfg.ForwardTimeout):
		p.cancel()     // a re-route waiting for a map gives up
		p.closeLanes() // lanes fail what they still hold
		<-answered
	}
	p.cancel()
	p.closeLanes()
	// The last answers may still be corked by a commit, whose uncork may
	// start a flusher (workers.Add): uncorked first, then every worker,
	// then the stream closes, with no write of it left running.
	p.acks.waitUncorked()
	p.workers.Wait()
	p.s.Close()
}

// closeLanes closes the session's lanes, failing what they still hold,
// and stops it forwarding more.
func (p *pubSession) closeLanes() {
	p.lanes.Lock()
	lanes := p.lanes.m
	p.lanes.m, p.lanes.closed = nil, true
	p.lanes.Unlock()
	for _, l := range lanes {
		l.close()
	}
}

// drain begins the session's drain as its broker closes. A client's
// session reads on and refuses what it reads (refuseLeaving) until the
// client, told by the first refusal that its broker is leaving (Owner),
// ends its side, or Close stops it reading (stopReading): a record the
// client had written before it learnt of the drain is answered "not
// written", where one left unread was of unknown outcome to the client.
// A forwarding peer's session stops reading at once: its lane answers
// what the owner never read, once the owner ends the stream, as not
// written (lane.kill). What either took in before is committed and
// answered as before.
func (p *pubSession) drain() {
	if p.peerID != "" {
		p.stopReading()
		return
	}
	p.draining.Store(true)
}

// refuseLeaving refuses in, read after the session's drain began: it is
// not taken in: its bytes are let go at once, and it holds only a slot
// and its answer's reserve (ackReserve) until its refusal is written, so
// a client sending on during the drain makes the broker hold no more
// than PublishInFlight answers. It returns false when the session is ending.
func (p *pubSession) refuseLeaving(in inbound) bool {
	if !p.take(&in, 0) {
		return false
	}
	p.fail(in, p.b.leavingRefusal())
	return true
}

// leavingRefusal is the answer to a record this broker did not take in
// because it is shutting down: nothing was written. Owner names this
// broker, so that a client can tell its own broker leaving (it then ends
// its side of the stream and publishes through another) from the owner
// of a shard it forwards to leaving (a relayed refusal names the owner).
func (b *Broker) leavingRefusal() *transport.Error { return leavingRefusal(b.cfg.NodeID) }

// leavingRefusal is the refusal of a record node, shutting down, did not
// take in.
func leavingRefusal(node string) *transport.Error {
	return &transport.Error{Code: transport.CodeShuttingDown, Owner: node,
		Message: fmt.Sprintf("%s is shutting down and did not take the record in; nothing was written", node)}
}

// stopReading makes the session stop taking in publishes; what it already
// took in is still answered.
func (p *pubSession) stopReading() {
	p.stopped.Store(true)
	p.s.CancelRead(quic.StreamErrorCode(transport.CodeShuttingDown))
}

// waitIdle returns once the session has answered everything it took in.
func (p *pubSession) waitIdle() { <-p.idle }
