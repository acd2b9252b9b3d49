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
	clientFlags

	Stream string        `arg:"" help:"Stream to subscribe to."`
	From   string        `help:"Where to start: earliest, latest, or an offset (an offset needs --shard, or a stream of one shard)." default:"earliest"`
	Shard  int           `help:"Subscribe to this shard only (-1: every shard)." default:"-1"`
	Count  int           `help:"Exit after this many records (0: run until interrupted)." default:"0"`
	Via    string        `help:"Broker id to attach through; each shard is still read from its owner." placeholder:"BROKER-ID"`
	Wait   time.Duration `help:"Fail if --count records have not arrived within this long (0: wait as long as it takes)." default:"0"`
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
		return client.Start{}, usagef("--from must be earliest, latest or an offset, got %q", s.From)
	}
	return client.AtOffset(n), nil
}

func (s *subCmd) Run(a *app) error {
	g := &s.clientFlags
	from, err := s.start()
	if err != nil {
		return err
	}
	if s.Count < 0 {
		return usagef("--count must not be negative, got %d", s.Count)
	}
	cctx, cancel := context.WithTimeout(a.ctx, g.Timeout)
	defer cancel()
	c, err := g.connect(cctx, a, s.Via)
	if err != nil {
		return err
	}
	defer c.Close()
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
	n := 0
	for rec, err := range sub.Records(ctx) {
		if err != nil {
			switch {
			case errors.Is(err, context.DeadlineExceeded) && a.ctx.Err() == nil:
				return fmt.Errorf("received %d of %d records from %s within %s (--wait)", n, s.Count, s.Stream, s.Wait)
			case a.ctx.Err() != nil:
				return nil // interrupted: the normal end of an open-ended subscription
			}
			return &brokerError{ID: c.id, Addr: c.addr, Err: &streamError{Stream: s.Stream, Err: err}}
		}
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
		return nil
	}
	if err := sub.Err(); err != nil {
		return &brokerError{ID: c.id, Addr: c.addr, Err: &streamError{Stream: s.Stream, Err: err}}
	}
	return nil
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
	for shard, owner := range st.Owners {
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
