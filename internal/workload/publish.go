package workload

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/history"
	"github.com/felix-broker/felix/transport"
)

// Outcome classifies a publish's error: nil is Acked, a refusal before
// anything was routed (unauthorized, invalid, too large, unknown stream)
// is Failed, and anything else (a lost connection, unavailable, a
// timeout) is Unknown: the record may have been committed.
func Outcome(err error) history.Outcome {
	if err == nil {
		return history.Acked
	}
	for _, target := range []error{transport.ErrUnauthorized, transport.ErrInvalid, transport.ErrPayloadTooLarge, transport.ErrUnknownStream} {
		if errors.Is(err, target) {
			return history.Failed
		}
	}
	return history.Unknown
}

// streamOf names the publisher stream cl's next publish goes on, as far
// as the client shows it: its home broker and the connections it has
// dialled there. A record is given the name (history.Publish.Stream) only
// if it is the same when its publish returns, so that two records with
// one name went over one connection, on the client's one publisher stream
// of it.
func streamOf(cl *client.Client) string {
	addr := cl.Addr()
	for _, st := range cl.ConnStats() {
		if st.Broker == addr {
			return fmt.Sprintf("%s#%d", addr, st.Dials)
		}
	}
	return ""
}

// stayed returns the stream name taken before a publish (streamOf) if cl
// still shows it after, else "".
func stayed(cl *client.Client, before string) string {
	if before != "" && streamOf(cl) == before {
		return before
	}
	return ""
}

// Record publishes value to stream (to shard, if shard >= 0, else keyed by
// value) through cl within timeout and adds the outcome to rec as
// publisher id's; it returns the ack and the error.
func Record(ctx context.Context, cl *client.Client, rec *history.Recorder, id int, stream string, shard int, value string, timeout time.Duration) (client.Ack, error) {
	return record(ctx, cl, rec, id, stream, shard, value, timeout, false)
}

// record is Record; onStream says that the caller sends its next records
// on cl's publisher stream too, so that the record is given its stream
// (history.Publish.Stream).
func record(ctx context.Context, cl *client.Client, rec *history.Recorder, id int, stream string, shard int, value string, timeout time.Duration, onStream bool) (client.Ack, error) {
	var opts []client.PublishOpt
	if shard >= 0 {
		opts = append(opts, client.WithShard(shard))
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	var on string
	if onStream {
		on = streamOf(cl)
	}
	call := time.Now()
	ack, err := cl.Publish(pctx, stream, []byte(value), []byte(value), opts...)
	cancel()
	p := history.Publish{Publisher: id, Value: value, Outcome: Outcome(err), Call: call, Return: time.Now()}
	if err == nil {
		p.Shard, p.Offset, p.Owner, p.Retried = ack.Shard, ack.Offset, ack.Owner, ack.Duplicate
	}
	p.Stream = stayed(cl, on)
	rec.Add(p)
	return ack, err
}

// Publish publishes unique values ("p<id>-<n>") one at a time through cl
// until stop is closed or ctx ends, recording each outcome in rec as
// publisher id's. An idempotent client gets a minute per record (it
// retries by itself), another 3s.
func Publish(ctx context.Context, stop <-chan struct{}, cl *client.Client, stream string, id int, idempotent bool, rec *history.Recorder) {
	timeout := 3 * time.Second
	if idempotent {
		timeout = time.Minute
	}
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		_, err := record(ctx, cl, rec, id, stream, -1, fmt.Sprintf("p%d-%d", id, n), timeout, true)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			time.Sleep(20 * time.Millisecond) // the broker may be down: do not spin
		}
	}
}

// PublishPipelined publishes unique values ("p<id>-<n>") on one publisher
// stream of cl with up to window records in flight (PublishAsync), until
// stop is closed or ctx ends, recording each outcome in rec as publisher
// id's: called when handed to the stream, returned when its future
// resolved, Unknown when it did not within 30s. Its acked records of a
// shard must hold offsets in the order sent (history's reordered check),
// which a publisher that waits for each ack cannot break: pipelined, a
// record routed again after a refusal is what could overtake. The check
// sees acked records, and written ones of unknown outcome whose
// connection stayed (history.Publish.Stream); the records routed again
// are the slow ones: the wait is longer than a broker holds a record for a leader
// (broker.Config.ForwardTimeout, 10 s) plus an election, so that they
// end acked, not Unknown (with 3 s, most of them were left out).
func PublishPipelined(ctx context.Context, stop <-chan struct{}, cl *client.Client, stream string, id, window int, rec *history.Recorder) {
	const timeout = 30 * time.Second
	type sent struct {
		value  string
		call   time.Time
		stream string // streamOf at the call
		fut    *client.Future
	}
	inflight := make(chan sent, window-1) // and one with the collector
	collected := make(chan struct{})
	go func() { // ends when inflight is closed and drained
		defer close(collected)
		for s := range inflight {
			wctx, cancel := context.WithDeadline(ctx, s.call.Add(timeout))
			ack, err := s.fut.Wait(wctx)
			cancel()
			p := history.Publish{Publisher: id, Value: s.value, Outcome: Outcome(err), Call: s.call, Return: time.Now(), Stream: stayed(cl, s.stream)}
			if err == nil {
				p.Shard, p.Offset, p.Owner = ack.Shard, ack.Offset, ack.Owner
			}
			rec.Add(p)
		}
	}()
	defer func() {
		close(inflight)
		<-collected
	}()
	var pub *client.Publisher
	defer func() {
		if pub != nil {
			pub.Close()
		}
	}()
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		if pub == nil {
			var err error
			if pub, err = cl.Publisher(ctx, stream); err != nil {
				pub = nil
				time.Sleep(20 * time.Millisecond) // the broker may be down: do not spin
				continue
			}
		}
		value := fmt.Sprintf("p%d-%d", id, n)
		on := streamOf(cl)
		call := time.Now()
		fut, err := pub.PublishAsync(ctx, []byte(value), []byte(value))
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			rec.Add(history.Publish{Publisher: id, Value: value, Outcome: Outcome(err), Call: call, Return: time.Now()})
			time.Sleep(20 * time.Millisecond)
			continue
		}
		inflight <- sent{value: value, call: call, stream: on, fut: fut}
		if n%window == window-1 {
			time.Sleep(10 * time.Millisecond) // a window at a time: a few hundred records/s
		}
	}
}
