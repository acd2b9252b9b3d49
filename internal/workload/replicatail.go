package workload

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync"
	"time"

	"github.com/felix-broker/felix/internal/history"
	"github.com/felix-broker/felix/transport"
)

// ReplicaTail is a subscription to one shard at one broker, on a
// connection to it alone (as ReadReplica's), attached for a whole test:
// the records come from that broker's own replica, follower or leader,
// where an SDK subscription reads the shard's owner only. It checks that
// the shard arrives in offset order with no gap and no duplicate across
// the broker's faults (it subscribes again after the last record it got
// whenever its connection ends) and keeps every record for Committed: a
// replica must serve committed records only.
type ReplicaTail struct {
	name   string
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	next  uint64
	seen  []history.Entry
	errs  []string
	shard int
}

// TailReplica starts a ReplicaTail of shard of stream at the broker at
// addr (tlsConf: a client's, verifying that broker's node certificate);
// name says which in its errors. Finish stops it.
func TailReplica(ctx context.Context, name, addr string, tlsConf *tls.Config, stream string, shard int) *ReplicaTail {
	ctx, cancel := context.WithCancel(ctx)
	t := &ReplicaTail{name: name, cancel: cancel, done: make(chan struct{}), shard: shard}
	go func() {
		defer close(t.done)
		for ctx.Err() == nil {
			t.once(ctx, addr, tlsConf, stream, shard) // its broker down, restarting, or catching up: again
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return t
}

func (t *ReplicaTail) once(ctx context.Context, addr string, tlsConf *tls.Config, stream string, shard int) {
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := transport.Dial(dctx, addr, tlsConf, transport.Config{})
	if err != nil {
		return
	}
	defer conn.CloseWithError(0, "done")
	stop := context.AfterFunc(ctx, func() { conn.CloseWithError(0, "done") })
	defer stop()
	s, err := conn.OpenStreamSync(dctx)
	if err != nil {
		return
	}
	defer s.CancelRead(0)
	defer s.Close()
	t.mu.Lock()
	from := t.next
	t.mu.Unlock()
	const credit = 1024
	w, r := transport.NewWriter(s), transport.NewReader(s, 0)
	if err := w.Write(&transport.Subscribe{Stream: stream, Shard: int32(shard), Start: transport.StartOffset, Offset: from, Credit: credit}); err != nil {
		return
	}
	for {
		f, err := r.Read()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *transport.Records:
			t.mu.Lock()
			for _, rec := range f.Records {
				if rec.Offset != t.next {
					t.errs = append(t.errs, fmt.Sprintf("%s: shard %d: got offset %d, want %d", t.name, shard, rec.Offset, t.next))
				}
				t.next = rec.Offset + 1
				t.seen = append(t.seen, history.Entry{Offset: rec.Offset, Value: string(rec.Value)})
			}
			t.mu.Unlock()
			if err := w.Write(&transport.Credit{Records: uint32(len(f.Records))}); err != nil {
				return
			}
		case *transport.Error:
			// A replica down or rejoining refuses as unavailable, a
			// broker starting or stopping as not a replica (its map not
			// yet or no longer holding the stream), shutting down, or
			// timed out: subscribe again. Another refusal is a wrong
			// answer.
			switch f.Code {
			case transport.CodeUnavailable, transport.CodeNotOwner, transport.CodeUnknownStream, transport.CodeShuttingDown, transport.CodeTimeout:
				return
			}
			t.mu.Lock()
			t.errs = append(t.errs, fmt.Sprintf("%s: shard %d from offset %d: %v", t.name, shard, from, f))
			t.mu.Unlock()
			return
		default:
			t.mu.Lock()
			t.errs = append(t.errs, fmt.Sprintf("%s: shard %d: unexpected %T %+v", t.name, shard, f, f))
			t.mu.Unlock()
			return
		}
	}
}

// Finish waits up to wait until the tail has received its shard past
// end, then stops it; it returns how many records it received and what
// went wrong (a record out of order, a refusal, or not reaching end).
func (t *ReplicaTail) Finish(end uint64, wait time.Duration) (seen int, errs []string) {
	deadline := time.Now().Add(wait)
	for {
		t.mu.Lock()
		caught, failed, next := t.next > end, len(t.errs) > 0, t.next
		t.mu.Unlock()
		if caught || failed || time.Now().After(deadline) {
			t.cancel()
			<-t.done
			t.mu.Lock()
			defer t.mu.Unlock()
			errs = append(errs, t.errs...)
			if !caught && !failed {
				errs = append(errs, fmt.Sprintf("%s: shard %d: stuck at offset %d, want past %d", t.name, t.shard, next, end))
			}
			return len(t.seen), errs
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Committed checks, after Finish, that every record the tail received is
// the one logs (the shards read back at the end) hold at its offset.
func (t *ReplicaTail) Committed(logs [][]history.Entry) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	got := make([][]history.Entry, t.shard+1)
	got[t.shard] = t.seen
	return Compare(t.name, got, logs)
}
