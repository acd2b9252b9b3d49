package broker

import (
	"context"
	"errors"
	"fmt"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
	"github.com/felix-broker/felix/wal"
)

const (
	// maxRecordsPerFrame and maxBytesPerFrame bound one Records frame, and
	// so the memory one subscription holds at a time.
	maxRecordsPerFrame = 512
	maxBytesPerFrame   = 256 << 10
)

// serveSubscribe streams one shard to a subscriber: from its start point
// through the log, then live as records commit. It sends no more records
// than the subscriber has granted credit for; a subscriber that stops
// granting simply stops receiving and holds nothing of the broker's but
// its position, so it never slows publishers or other subscribers.
func (b *Broker) serveSubscribe(s *quic.Stream, r *transport.Reader, sub *transport.Subscribe) {
	m := b.member.Map()
	st, ok := m.Stream(sub.Stream)
	if !ok {
		b.refuse(s, &transport.Error{Code: transport.CodeUnknownStream, Epoch: m.Epoch,
			Message: fmt.Sprintf("stream %q does not exist", sub.Stream)})
		return
	}
	if sub.Shard < 0 || int(sub.Shard) >= st.Shards {
		b.refuse(s, &transport.Error{Code: transport.CodeInvalid,
			Message: fmt.Sprintf("stream %q has %d shards; there is no shard %d", sub.Stream, st.Shards, sub.Shard)})
		return
	}
	id := shardmap.ShardID{Stream: sub.Stream, Shard: int(sub.Shard)}
	if owner := st.Owners[id.Shard]; owner != b.cfg.NodeID {
		b.refuse(s, &transport.Error{Code: transport.CodeNotOwner, Epoch: m.Epoch, Owner: owner,
			Message: fmt.Sprintf("%s does not own %s; subscribe at %s", b.cfg.NodeID, id, owner)})
		return
	}
	log, err := b.shards.log(id, st.StreamConfig)
	if err != nil {
		b.refuse(s, &transport.Error{Code: transport.CodeUnavailable,
			Message: fmt.Sprintf("%s cannot open its log of %s: %v", b.cfg.NodeID, id, err)})
		return
	}
	next := log.FirstOffset()
	switch sub.Start {
	case transport.StartLatest:
		next = log.NextOffset()
	case transport.StartOffset:
		next = sub.Offset
		if first, end := log.FirstOffset(), log.NextOffset(); next < first || next > end {
			b.refuse(s, &transport.Error{Code: transport.CodeOutOfRange,
				Message: fmt.Sprintf("offset %d of %s is outside the retained range %d..%d", next, id, first, end)})
			return
		}
	}

	pos := &subPos{id: id, log: log}
	pos.next.Store(next)
	b.subs.add(pos)
	defer b.subs.remove(pos)

	credit := newCredit(sub.Credit)
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer credit.stop()
		for {
			f, err := r.Read()
			if err != nil {
				return
			}
			if c, ok := f.(*transport.Credit); ok {
				credit.add(c.Records)
			}
		}
	}()

	w := transport.NewWriter(s)
	out := &transport.Records{Stream: sub.Stream, Shard: sub.Shard}
loop:
	for {
		n, ok := credit.take(maxRecordsPerFrame, b.ctx.Done())
		if !ok {
			break
		}
		_, changed := log.Watch()
		recs, err := log.Read(next, n, maxBytesPerFrame)
		if err != nil {
			code := transport.CodeInternal
			switch {
			case errors.Is(err, wal.ErrOutOfRange):
				code = transport.CodeOutOfRange // retention passed the subscriber
			case errors.Is(err, wal.ErrClosed):
				code = transport.CodeShuttingDown
			}
			w.Write(&transport.Error{Code: code, Message: fmt.Sprintf("reading %s at offset %d: %v", id, next, err)})
			b.tel.countError(code)
			break
		}
		credit.giveBack(n - len(recs))
		if len(recs) == 0 {
			select {
			case <-changed:
				continue
			case <-credit.done:
			case <-b.ctx.Done():
			}
			break loop
		}
		out.Records = out.Records[:0]
		size := 0
		for i := range recs {
			rec := &recs[i]
			size += len(rec.Key) + len(rec.Value)
			out.Records = append(out.Records, transport.Record{
				Offset: rec.Offset, Timestamp: rec.Timestamp, Key: rec.Key, Value: rec.Value,
				Headers: rec.Headers, ProducerID: rec.ProducerID, ProducerSeq: rec.ProducerSeq,
			})
		}
		if err := w.Write(out); err != nil {
			break
		}
		next = recs[len(recs)-1].Offset + 1
		pos.next.Store(next)
		b.tel.recordsOut.Add(context.Background(), int64(len(recs)))
		b.tel.bytesOut.Add(context.Background(), int64(size))
	}
	s.CancelRead(0)
	s.Close()
}
