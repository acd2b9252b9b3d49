package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/demo"
	"github.com/felix-broker/felix/shardmap"
)

type subCmd struct {
	Stream string        `arg:"" help:"Stream to subscribe to."`
	From   string        `help:"Where to start: earliest, latest, or an offset (0 or more; an offset needs --shard, or a stream of one shard)." default:"earliest"`
	Shard  int           `help:"Subscribe to this shard only (-1: every shard)." default:"-1"`
	Count  int           `help:"Exit after this many records (0: run until interrupted, or until --wait)." default:"0"`
	Via    string        `help:"Broker id to attach through; each shard is still read from its owner." placeholder:"BROKER-ID"`
	Wait   time.Duration `help:"With --count: fail if the records have not all arrived within this long. Without: listen this long, then exit (0: as long as it takes). Either way, exit 1 if a shard could not be read." default:"0"`
	Check  time.Duration `hidden:"" help:"How often to check that every shard's owner can be reached." default:"2s"`
}

// subJSON is one record as --json prints it.
type subJSON struct {
	Stream    string            `json:"stream"`
	Shard     int               `json:"shard"`
	Offset    uint64            `json:"offset"`
	Key       string            `json:"key,omitempty"`
	Value     string            `json:"value"`
	Headers   map[string]string `json:"headers,omitempty"`
	Timestamp time.Time         `json:"timestamp"`
}

func (s *subCmd) start() (client.Start, error) {
	switch s.From {
	case "earliest":
		return client.Earliest(), nil
	case "latest":
		return client.Latest(), nil
	}
	n, err := strconv.ParseUint(s.From, 10, 64)
	if err != nil {
		return client.Start{}, usagef("--from must be earliest, latest or an offset (0 or more), got %q", s.From)
	}
	return client.AtOffset(n), nil
}

func (s *subCmd) Run(a *app) error {
	g := a.flags
	from, err := s.start()
	if err != nil {
		return err
	}
	if s.Count < 0 {
		return usagef("--count must not be negative, got %d", s.Count)
	}
	if s.Shard < -1 {
		return usagef("--shard must be a shard number (0 or more), got %d", s.Shard)
	}
	if s.Wait < 0 {
		return usagef("--wait must not be negative, got %s", s.Wait)
	}
	cctx, cancel := context.WithTimeout(a.ctx, g.Timeout)
	defer cancel()
	c, err := g.connect(cctx, a, s.Via)
	if err != nil {
		return err
	}
	defer c.Close()
	if s.Shard >= 0 {
		if err := checkShard(cctx, c, s.Stream, s.Shard); err != nil {
			return err
		}
	} else if s.From != "earliest" && s.From != "latest" {
		// An offset is one shard's: a usage error, said before the SDK
		// refuses it.
		if m, err := c.Map(cctx); err == nil {
			if st, ok := m.Stream(s.Stream); ok && st.Shards > 1 {
				return usagef("--from %s is an offset of one shard, and stream %q has %d: add --shard", s.From, s.Stream, st.Shards)
			}
		}
	}
	var opts []client.SubOpt
	if s.Shard >= 0 {
		opts = append(opts, client.Shard(s.Shard))
	}
	sub, err := c.Subscribe(cctx, s.Stream, from, opts...)
	if err != nil {
		return &brokerError{ID: c.id, Addr: c.addr, Err: &streamError{Stream: s.Stream, Err: err}}
	}
	defer sub.Stop()
	if !g.JSON {
		fmt.Fprintln(a.stderr, s.header(cctx, c))
	}

	ctx := a.ctx
	if s.Wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.Wait)
		defer cancel()
	}
	// Watch that every shard's owner can be reached, and say so when one
	// cannot: the SDK retries quietly, the person at the terminal should
	// not wait without knowing why.
	w := newShardWatch(a, g, c, s.Stream, s.Shard)
	wctx, stopWatch := context.WithCancel(a.ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		w.run(wctx, s.Check)
	}()
	defer func() {
		stopWatch()
		<-watchDone
	}()

	n := 0
	for rec, err := range sub.Records(ctx) {
		if err != nil {
			switch {
			case errors.Is(err, context.DeadlineExceeded) && a.ctx.Err() == nil:
				stopWatch()
				<-watchDone
				stuck := w.problems()
				if s.Count == 0 && len(stuck) == 0 {
					return nil // listened for --wait: done
				}
				if s.Count == 0 {
					return fmt.Errorf("listened to %s for %s (--wait), but %s", s.Stream, s.Wait, andList(stuck))
				}
				msg := fmt.Sprintf("received %d of %d %s from %s within %s (--wait)", n, s.Count, records(s.Count), s.Stream, s.Wait)
				if len(stuck) > 0 {
					msg += ": " + andList(stuck)
				}
				return errors.New(msg)
			case a.ctx.Err() != nil:
				return s.interrupted(n)
			}
			return &brokerError{ID: c.id, Addr: c.addr, Err: &streamError{Stream: s.Stream, Err: err}}
		}
		w.received(rec.Shard)
		if g.JSON {
			b, _ := json.Marshal(subJSON{Stream: rec.Stream, Shard: rec.Shard, Offset: rec.Offset, Key: string(rec.Key),
				Value: string(rec.Value), Headers: rec.Headers, Timestamp: rec.Timestamp})
			fmt.Fprintf(a.stdout, "%s\n", b)
		} else {
			fmt.Fprintln(a.stdout, demo.Received(rec))
		}
		n++
		if s.Count > 0 && n >= s.Count {
			return nil
		}
	}
	if a.ctx.Err() != nil {
		return s.interrupted(n)
	}
	if err := sub.Err(); err != nil {
		return &brokerError{ID: c.id, Addr: c.addr, Err: &streamError{Stream: s.Stream, Err: err}}
	}
	return nil
}

// interrupted is how a subscription that received n records ends on
// an interrupt (SIGINT, SIGTERM): the normal end of an open-ended one,
// and a failure of one that asked for --count records and has fewer.
func (s *subCmd) interrupted(n int) error {
	if s.Count == 0 || n >= s.Count {
		return nil
	}
	return fmt.Errorf("interrupted after %d of %d %s from %s", n, s.Count, records(s.Count), s.Stream)
}

func records(n int) string {
	if n == 1 {
		return "record"
	}
	return "records"
}

// header says where the subscription is attached and where its records
// come from, for the person watching (on stderr, so stdout stays records).
func (s *subCmd) header(ctx context.Context, c *conn) string {
	through := c.id
	if through == "" {
		through = c.addr
	}
	m, err := c.Map(ctx)
	if err != nil {
		return fmt.Sprintf("subscribed to %s from %s through %s", s.Stream, s.From, through)
	}
	st, ok := m.Stream(s.Stream)
	if !ok {
		return fmt.Sprintf("subscribed to %s from %s through %s", s.Stream, s.From, through)
	}
	var owners []string
	allHere := true
	for shard, owner := range st.Placement.All() {
		if s.Shard >= 0 && shard != s.Shard {
			continue
		}
		owners = append(owners, fmt.Sprintf("%s on %s", shardmap.ShardID{Stream: s.Stream, Shard: shard}, owner))
		allHere = allHere && owner == c.id
	}
	if allHere {
		return fmt.Sprintf("subscribed to %s from %s, attached to %s (the owner)", s.Stream, s.From, through)
	}
	return fmt.Sprintf("subscribed to %s from %s through %s; records come from their owners: %s", s.Stream, s.From, through, strings.Join(owners, ", "))
}
