package broker

import (
	"github.com/felix-broker/felix/auth"
	"sync"

	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/replica"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
	"github.com/felix-broker/felix/wal"
)

// maxRecordsPerFrame bounds the records of one Records frame;
// Config.SubscriptionBytes bounds its bytes, and so the memory one
// subscription holds at a time.
const maxRecordsPerFrame = 512

// serveSubscribe streams one shard to a subscriber: from its start point
// through the log, then live as records commit. It sends no more records
// than the subscriber has granted credit for; a subscriber that stops
// granting simply stops receiving and holds nothing of the broker's but
// its position, so it never slows publishers or other subscribers.
//
// It releases r (Reader.Release): its credit reader, once started, reads r
// until the stream ends, after serveSubscribe returns.
func (b *Broker) serveSubscribe(s *quic.Stream, r *transport.Reader, sub *transport.Subscribe, from caller) {
	readerStarted := false
	defer func() {
		if !readerStarted {
			r.Release()
		}
	}()
	if err := checkStreamName(sub.Stream); err != nil {
		b.refuse(s, err)
		return
	}
	mapChanged := b.member.Changed()
	m := b.member.Map()
	if newer := max(sub.Created, sub.Epoch); newer > m.Epoch {
		// The subscriber read a newer map than this broker holds: one
		// the broker's map refuses (its grant may be in the newer one,
		// which may be newer than the stream's incarnation) catches up
		// to the subscriber's map; one of a newer incarnation of the
		// stream catches up to that. Either shares one catch-up with
		// every client's (clientCatchUp), and is judged by the map it is
		// then served by.
		if from.principal != "" && m.ACL.Check(from.principal, auth.Subscribe, sub.Stream) != nil {
			m = b.catchUpForClient(b.ctx, newer)
		} else if sub.Created > m.Epoch {
			m = b.catchUpForClient(b.ctx, sub.Created)
		}
	}
	if err := b.authorize(m, from, auth.Subscribe, sub.Stream); err != nil {
		b.refuse(s, err)
		return
	}
	// free gives the connection's subscription slot back. It runs before
	// the stream ends (refuse, and the close at the bottom): a client that
	// saw its subscription end may open another at once.
	free := func() {}
	if from.use != nil {
		if n := from.use.subs.Add(1); int(n) > b.cfg.MaxSubsPerConn {
			from.use.subs.Add(-1)
			b.refuse(s, b.limits.exceeded(limitSubsPerConn, from.principal,
				"the connection has %d subscriptions, the broker's limit (MaxSubsPerConn); close some or open another connection", b.cfg.MaxSubsPerConn))
			return
		}
		var once sync.Once
		free = func() { once.Do(func() { from.use.subs.Add(-1) }) }
		defer free()
	}
	refuse := func(err error) {
		free()
		b.refuse(s, err)
	}
	if int64(sub.Credit) > int64(b.cfg.MaxCredit) {
		refuse(b.limits.exceeded(limitCredit, from.principal,
			"subscription credit of %d records is over the broker's limit of %d (MaxCredit); subscribe with less credit", sub.Credit, b.cfg.MaxCredit))
		return
	}
	if sub.Cluster != "" && m.Cluster != "" && sub.Cluster != m.Cluster {
		// Built again: its streams are others, whatever their epochs.
		refuse(&transport.Error{Code: transport.CodeUnknownStream, Epoch: m.Epoch,
			Message: fmt.Sprintf("stream %q of cluster %s: this broker serves cluster %s", sub.Stream, sub.Cluster, m.Cluster)})
		return
	}
	st, ok := m.Stream(sub.Stream)
	if !ok {
		refuse(&transport.Error{Code: transport.CodeUnknownStream, Epoch: m.Epoch,
			Message: fmt.Sprintf("stream %q does not exist", sub.Stream)})
		return
	}
	if sub.Created != 0 && sub.Created != st.Created {
		// Its offsets are of another stream of the same name.
		refuse(&transport.Error{Code: transport.CodeUnknownStream, Epoch: m.Epoch,
			Message: fmt.Sprintf("stream %q of map epoch %d was deleted; the stream of that name now was created at epoch %d: subscribe to it anew", sub.Stream, sub.Created, st.Created)})
		return
	}
	if sub.Shard < 0 || int(sub.Shard) >= st.Shards {
		refuse(&transport.Error{Code: transport.CodeInvalid,
			Message: fmt.Sprintf("stream %q has %d shards; there is no shard %d", sub.Stream, st.Shards, sub.Shard)})
		return
	}
	id := shardmap.ShardID{Stream: sub.Stream, Shard: int(sub.Shard)}
	if !st.Placement.IsReplica(id.Shard, b.cfg.NodeID) {
		owner := st.Placement.Owner(id.Shard)
		refuse(&transport.Error{Code: transport.CodeNotOwner, Epoch: m.Epoch, Owner: owner,
			Message: fmt.Sprintf("%s does not own %s; subscribe at %s", b.cfg.NodeID, id, owner)})
		return
	}
	if from.use != nil && st.Factor() == 1 { // a replica's log is open anyway
		if err := b.limits.pin(from.use, id, b.shards.pinBudget()); err != nil {
			refuse(err)
			return
		}
		defer b.limits.unpin(from.use, id)
	}
	e, err := b.shards.acquire(m, id)
	if err != nil {
		refuse(&transport.Error{Code: transport.CodeUnavailable,
			Message: fmt.Sprintf("%s cannot open its log of %s: %v", b.cfg.NodeID, id, err)})
		return
	}
	defer e.release() // the subscription keeps its log open
	if e.group != nil {
		if err := replicaDown(e.group); err != nil {
			refuse(replicaFailed(b.cfg.NodeID, id, err))
			return
		}
	}
	log := e.sl
	// A subscription reads a shard log by position (wal.Reader, or a
	// replica's replica.Reader): one behind the log's in-memory tail
	// reads about the bytes it is sent from the segment files, whatever
	// its credit and however many others catch up elsewhere in the log.
	// Between reads it holds its position (and, of a replica, at most 16
	// KiB of records of the entry it read last: replica.Reader).
	var read func(from uint64, maxRecords, maxBytes int) ([]wal.Record, error) = log.Read
	switch {
	case e.log != nil:
		read = e.log.NewReader().Read
	case e.group != nil:
		r := e.group.NewReader()
		defer r.Close()
		read = r.Read
	}
	next := log.FirstOffset()
	switch sub.Start {
	case transport.StartLatest:
		next = log.NextOffset()
	case transport.StartOffset:
		next = sub.Offset
		// A replica may lag behind the one that served the offset: it
		// waits for it (committed elsewhere, it is coming).
		if first, end := log.FirstOffset(), log.NextOffset(); next < first || next > end && e.group == nil {
			refuse(&transport.Error{Code: transport.CodeOutOfRange,
				Message: fmt.Sprintf("offset %d of %s is outside the retained range %d..%d", next, id, first, end)})
			return
		}
	}

	pos := &subPos{id: id, log: log}
	pos.next.Store(next)
	b.subs.add(pos)
	defer b.subs.remove(pos)

	credit := newCredit(sub.Credit, uint64(b.cfg.MaxCredit))
	b.wg.Add(1)
	readerStarted = true
	r.SmallFrames(64) // credit grants, about ten bytes each
	go func() {
		defer b.wg.Done()
		defer r.Release()
		for {
			// Credit frames only: another is not decoded, and ends the
			// subscription.
			f, err := r.ReadIf(transport.FrameCredit)
			if errors.Is(err, io.EOF) {
				// The subscriber closed its side: it grants no more,
				// and is still sent what it granted. It can still go
				// (its connection closes, it stops reading), which the
				// stream's context tells, as it tells that the writer
				// closed the stream.
				credit.close()
				<-s.Context().Done()
				credit.stop()
				return
			}
			var werr *transport.Error
			if errors.As(err, &werr) {
				credit.fail(werr) // the writer answers it
			}
			if err != nil {
				credit.stop() // reset, or the connection is gone
				return
			}
			if !credit.add(f.(*transport.Credit).Records) {
				return // over MaxCredit: the writer answers it
			}
		}
	}()

	// The subscription's reads are charged to its principal's budget: hold
	// bytes before a read (the most it can return), what the frame holds
	// from the read until it is written.
	var budget *byteBudget
	if from.use != nil {
		budget = from.use.use.sub
	}
	hold := int64(max(b.cfg.SubscriptionBytes, b.cfg.MaxPayload))
	var charged int64
	charge := func(n int64) {
		if budget != nil && n != charged {
			budget.release(charged - n)
		}
		charged = n
	}
	defer charge(0)

	// A replica's group can fail, learn that its log was lost, or stop
	// taking its leader's entries while a subscriber waits on it: look
	// every second, and end the subscription then (the SDK moves on to
	// another replica).
	var groupCheck <-chan time.Time
	var led leaderWatch
	if e.group != nil {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		groupCheck = t.C
	}

	w := transport.NewWriter(s)
	w.SetMaxFrame(recordsFrameLimit(b.cfg))
	// room is what a frame leaves to its records' encodings
	// (SubscriptionBytes leaves room for 512 records without headers).
	room := transport.RecordsRoom(recordsFrameLimit(b.cfg), sub.Stream)
	out := &transport.Records{Stream: sub.Stream, Shard: sub.Shard}
	// allowed checks the subscriber's permission again when the map has
	// changed (a revoke ends its subscriptions, as in NATS and Kafka: it
	// once ended only new ones), writing the refusal if it is gone.
	authEpoch := m.Epoch
	allowed := func() bool {
		if b.member.Map().Epoch == authEpoch {
			return true
		}
		mapChanged = b.member.Changed() // before the map it is for
		m := b.member.Map()
		if err := b.authorize(m, from, auth.Subscribe, sub.Stream); err != nil {
			w.Write(err)
			b.tel.countError(err.Code)
			return false
		}
		authEpoch = m.Epoch
		return true
	}
loop:
	for {
		if !credit.available() {
			// Idle until the subscriber grants more: it holds its
			// position, not the encoding of its last frame (up to
			// keepBufSize, charged to no limit).
			w.Release()
		}
		n, ok := credit.take(maxRecordsPerFrame, b.ctx.Done())
		if !ok || !allowed() {
			break
		}
		if budget != nil && !budget.tryAcquire(hold) {
			b.limits.hit(limitSubscriptionByte, from.principal, fmt.Sprintf("the principal's subscriptions hold %d bytes not yet written (SubscriptionBytesPerPrincipal)", budget.max))
			if !budget.acquire(hold, b.ctx.Done(), credit.done) {
				break
			}
		}
		charged = hold
		_, changed := log.Watch()
		recs, err := read(next, n, b.cfg.SubscriptionBytes)
		if err != nil {
			e := readError(b.cfg.NodeID, id, next, err)
			if gone := b.shardGone(id, st.Created); gone != nil {
				e = gone // closed because the map took the shard away
			}
			w.Write(e)
			b.tel.countError(e.Code)
			break
		}
		credit.giveBack(n - len(recs))
		if len(recs) == 0 {
			charge(0)
			w.Release() // idle until a record comes: as above
			for {
				select {
				case <-changed:
					continue loop
				case <-mapChanged:
					mapChanged = b.member.Changed()
					if allowed() {
						continue // still allowed: wait on
					}
				case <-groupCheck:
					err := replicaDown(e.group)
					if err == nil {
						err = led.behind(b, e.group)
					}
					if err == nil {
						continue // still running: wait on
					}
					werr := replicaFailed(b.cfg.NodeID, id, err)
					if gone := b.shardGone(id, st.Created); gone != nil {
						werr = gone
					}
					w.Write(werr)
					b.tel.countError(werr.Code)
				case <-credit.done:
				case <-b.ctx.Done():
				}
				break loop
			}
		}
		out.Records = out.Records[:0]
		size, held, encoded := 0, 0, 0
		for i := range recs {
			rec := &recs[i]
			n := len(rec.Key) + len(rec.Value) + len(rec.ProducerID) + headersLen(rec.Headers)
			if encoded += transport.RecordLen(n, len(rec.Headers)); encoded > room && i > 0 {
				// The frame would go over the limit (records with many
				// headers): the rest go in the next one.
				credit.giveBack(len(recs) - i)
				clear(recs[i:])
				recs = recs[:i]
				break
			}
			size += len(rec.Key) + len(rec.Value)
			held += n
			out.Records = append(out.Records, transport.Record{
				Offset: rec.Offset, Timestamp: rec.Timestamp, Key: rec.Key, Value: rec.Value,
				Headers: rec.Headers, ProducerID: producerName(rec.ProducerID), ProducerSeq: rec.ProducerSeq,
			})
		}
		charge(int64(held))
		first, last := recs[0].Offset, recs[len(recs)-1].Offset
		// Once encoded, the frame is all the subscription holds while a
		// slow subscriber keeps the write waiting: drop the records.
		err = w.Buffer(out)
		clear(out.Records)
		clear(recs)
		if err != nil {
			// Only a record too large for any frame gets here (one
			// stored while MaxPayload was larger): the subscription
			// ends at it, with an error naming it, and never skips it.
			e := tooLarge(id, first, len(recs), err)
			w.Write(e)
			b.tel.countError(e.Code)
			break
		}
		err = w.Flush()
		charge(0)
		if err != nil {
			break
		}
		next = last + 1
		pos.next.Store(next)
		b.tel.recordsOut.Add(context.Background(), int64(len(recs)))
		b.tel.bytesOut.Add(context.Background(), int64(size))
	}
	free()
	if credit.exceeded() {
		w.Write(b.limits.exceeded(limitCredit, from.principal,
			"subscription credit went over the broker's limit of %d records (MaxCredit); grant less", b.cfg.MaxCredit))
		b.tel.countError(transport.CodeLimitExceeded)
	}
	if werr := credit.failure(); werr != nil {
		w.Write(werr)
		b.tel.countError(werr.Code)
	}
	s.CancelRead(0)
	s.Close()
}

// shardGone returns the answer to a subscription of shard id of the
// stream created at epoch created whose log or replica was closed under
// it because the broker's map no longer gives it the shard: the stream
// was deleted (or deleted and created again), unknown_stream, as a new
// subscription is refused; or the shard is no longer this broker's,
// not_owner naming the owner. nil while the map still gives it here.
func (b *Broker) shardGone(id shardmap.ShardID, created uint64) *transport.Error {
	m := b.member.Map()
	st, ok := m.Stream(id.Stream)
	if !ok || created != 0 && st.Created != created {
		return &transport.Error{Code: transport.CodeUnknownStream, Epoch: m.Epoch,
			Message: fmt.Sprintf("stream %q was deleted (map epoch %d) while subscribed to", id.Stream, m.Epoch)}
	}
	if !st.Placement.IsReplica(id.Shard, b.cfg.NodeID) {
		owner := st.Placement.Owner(id.Shard)
		return &transport.Error{Code: transport.CodeNotOwner, Epoch: m.Epoch, Owner: owner,
			Message: fmt.Sprintf("%s no longer holds %s; subscribe at %s", b.cfg.NodeID, id, owner)}
	}
	return nil
}

// replicaDown returns why a subscriber must not wait on replica g: its
// group stopped, its log was lost (it never catches up), or it is joining
// its group in place of a lost replica (rejoin.go: it is catching up, and
// has far less than the others), else nil.
func replicaDown(g *replica.Group) error {
	if err := g.Err(); err != nil {
		return err
	}
	if err := g.Lost(); err != nil {
		return err
	}
	if membership(g) != replica.Voter {
		return errReplicaJoining
	}
	return nil
}

// errReplicaJoining: the replica is joining its group in place of a lost
// one, and catching up.
var errReplicaJoining = errors.New("broker: replica joining its group in place of a lost one, catching up")

// Why a subscriber waiting at a replica's end reads elsewhere
// (leaderWatch.behind).
var (
	errReplicaDiskLow    = errors.New("broker: the broker's disk is below --min-free-bytes, so its replica, a follower, takes no more entries from its leader")
	errReplicaLeaderless = errors.New("broker: the replica has known no leader for a second or more (cut off from its group, or the group lost its majority)")
)

// leaderWatch tells a subscription waiting at the end of its replica,
// checked every second, whether the replica has stopped taking its
// group's entries while the group may commit more without it, which the
// subscriber would wait for in vain: its broker's disk is nearly full
// and it follows (raftNet.deliver leaves its leader's entries unwritten;
// its catch-up state cannot tell, as the leader then thinks it holds no
// more than it does), or it has known no leader at two checks in a row
// (cut off from the others, which may have elected one). The leader of a
// group whose disk fills stops taking records itself, so its subscribers
// wait on.
type leaderWatch struct{ leaderless int }

func (w *leaderWatch) behind(b *Broker, g *replica.Group) error {
	if b.disk.low.Load() && !g.IsLeader() {
		return errReplicaDiskLow
	}
	if lead, _ := g.Leader(); lead != 0 {
		w.leaderless = 0
		return nil
	}
	if w.leaderless++; w.leaderless >= 2 {
		return errReplicaLeaderless
	}
	return nil
}

// replicaFailed is the wire error for a subscription to a replica that
// cannot serve it (its group stopped, or it takes no more entries):
// unavailable, which the SDK answers by trying another replica.
func replicaFailed(node string, id shardmap.ShardID, err error) *transport.Error {
	return &transport.Error{Code: transport.CodeUnavailable, Message: fmt.Sprintf("%s's replica of %s cannot serve the subscription (%v); read from another replica", node, id, err)}
}

// tooLarge is the wire error for a Records frame of n records of id, the
// first at offset at, that failed to encode (err): payload_too_large
// naming the record, which is too large for any frame (with n == 1; a
// larger frame is cut to fit, so more than one is a bug: internal).
func tooLarge(id shardmap.ShardID, at uint64, n int, err error) *transport.Error {
	if n > 1 {
		return &transport.Error{Code: transport.CodeInternal,
			Message: fmt.Sprintf("%s: a frame of %d records from offset %d failed to encode: %v", id, n, at, err)}
	}
	return &transport.Error{Code: transport.CodePayloadTooLarge, From: at, To: at,
		Message: fmt.Sprintf("%s: the record at offset %d is too large for a frame (%v), stored while the broker's record limit (MaxPayload, --max-record-bytes) was larger: raise it back to read it, or subscribe at offset %d to go on past it",
			id, at, err, at+1)}
}

// readError is the wire error for a failed read of id's log at offset at.
func readError(node string, id shardmap.ShardID, at uint64, err error) *transport.Error {
	var ce *wal.CorruptError
	switch {
	case errors.As(err, &ce):
		// The subscriber gets the damaged range and can skip it; the
		// records after it are served.
		return &transport.Error{Code: transport.CodeCorrupt, From: ce.From, To: ce.To,
			Message: fmt.Sprintf("%s: records at offsets %d-%d are damaged in %s's log (%s); subscribe at offset %d to skip them",
				id, ce.From, ce.To, node, ce.Reason, ce.To+1)}
	case errors.Is(err, wal.ErrOutOfRange), errors.Is(err, replica.ErrOutOfRange):
		// Below FirstOffset (retention passed the subscriber), or past
		// the end; a read at NextOffset waits instead.
		return &transport.Error{Code: transport.CodeOutOfRange, Message: fmt.Sprintf("reading %s at offset %d: %v", id, at, err)}
	case errors.Is(err, wal.ErrClosed), errors.Is(err, replica.ErrClosed):
		return &transport.Error{Code: transport.CodeShuttingDown, Message: fmt.Sprintf("reading %s at offset %d: %v", id, at, err)}
	}
	return &transport.Error{Code: transport.CodeInternal, Message: fmt.Sprintf("reading %s at offset %d: %v", id, at, err)}
}
