package workload

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/history"
)

// Subscriber is a subscription to every shard of a stream from the
// earliest offset, attached for a whole test: it checks that each shard
// arrives in offset order with no gap and no duplicate, across the
// faults, and keeps every record it saw for Committed.
type Subscriber struct {
	name string
	sub  *client.Subscription
	done chan struct{}

	mu   sync.Mutex
	next []uint64 // per shard: the offset expected next
	seen [][]history.Entry
	errs []string
}

// Subscribe starts a Subscriber on stream's shards through cl; name says
// which in its errors. Finish stops it.
func Subscribe(ctx context.Context, cl *client.Client, name, stream string, shards int) (*Subscriber, error) {
	sub, err := cl.Subscribe(ctx, stream, client.Earliest())
	if err != nil {
		return nil, fmt.Errorf("workload: subscriber %s: %w", name, err)
	}
	s := &Subscriber{name: name, sub: sub, done: make(chan struct{}), next: make([]uint64, shards), seen: make([][]history.Entry, shards)}
	go s.run(ctx)
	return s, nil
}

func (s *Subscriber) run(ctx context.Context) {
	defer close(s.done)
	for rec, err := range s.sub.Records(ctx) {
		s.mu.Lock()
		if err != nil {
			s.errs = append(s.errs, fmt.Sprintf("%s: %v", s.name, err))
			s.mu.Unlock()
			return
		}
		if rec.Shard < 0 || rec.Shard >= len(s.next) {
			s.errs = append(s.errs, fmt.Sprintf("%s: a record of shard %d", s.name, rec.Shard))
		} else {
			if want := s.next[rec.Shard]; rec.Offset != want {
				s.errs = append(s.errs, fmt.Sprintf("%s: shard %d: got offset %d, want %d", s.name, rec.Shard, rec.Offset, want))
			}
			s.next[rec.Shard] = rec.Offset + 1
			s.seen[rec.Shard] = append(s.seen[rec.Shard], history.Entry{Offset: rec.Offset, Value: string(rec.Value)})
		}
		s.mu.Unlock()
	}
}

// Finish waits up to wait until the subscriber has received every shard
// past ends[shard], then stops it; it returns how many records it
// received and what went wrong (an error, a record out of order, or not
// reaching ends).
func (s *Subscriber) Finish(ends []uint64, wait time.Duration) (seen int, errs []string) {
	deadline := time.Now().Add(wait)
	for {
		s.mu.Lock()
		caught := true
		for shard, end := range ends {
			caught = caught && s.next[shard] > end
		}
		failed, next := len(s.errs) > 0, append([]uint64(nil), s.next...)
		s.mu.Unlock()
		if caught || failed || time.Now().After(deadline) {
			s.sub.Stop()
			<-s.done
			s.mu.Lock()
			defer s.mu.Unlock()
			for _, recs := range s.seen {
				seen += len(recs)
			}
			errs = append(errs, s.errs...)
			if !caught && !failed {
				errs = append(errs, fmt.Sprintf("%s: stuck at %v, want past %v", s.name, next, ends))
			}
			return seen, errs
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Committed checks, after Finish, that every record the subscriber
// received is the one logs (the shards read back at the end) hold at its
// offset: it never saw a record that was not committed.
func (s *Subscriber) Committed(logs [][]history.Entry) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Compare(s.name, s.seen, logs)
}

// Compare returns what differs between got, records read by who, and
// logs, the shards' final contents: a record at an offset that holds
// another value, or past the end of the log. got may stop short of logs.
func Compare(who string, got, logs [][]history.Entry) []string {
	var errs []string
	for shard, recs := range got {
		for _, e := range recs {
			var want []history.Entry
			if shard < len(logs) {
				want = logs[shard]
			}
			switch {
			case e.Offset >= uint64(len(want)):
				errs = append(errs, fmt.Sprintf("%s: shard %d: %q at offset %d, past the log's %d records", who, shard, e.Value, e.Offset, len(want)))
			case want[e.Offset].Value != e.Value:
				errs = append(errs, fmt.Sprintf("%s: shard %d: %q at offset %d, where the log has %q", who, shard, e.Value, e.Offset, want[e.Offset].Value))
			}
			if len(errs) > 10 {
				return errs
			}
		}
	}
	return errs
}
