package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/demo"
)

type pubCmd struct {
	clientFlags

	Stream      string   `arg:"" help:"Stream to publish to."`
	Value       string   `arg:"" help:"Record value. With --count N > 1 the records are VALUE-000, VALUE-001, ..."`
	Key         string   `help:"Record key: it picks the shard (default: none, the client picks)."`
	Shard       int      `help:"Shard to publish to, whatever the key (-1: by key)." default:"-1"`
	Via         []string `help:"Broker id to publish through; with several (comma-separated) the records go through each in turn (default: the first broker that answers)." placeholder:"BROKER-ID"`
	Count       int      `help:"Number of records to publish." default:"1"`
	Concurrency int      `help:"With --count: records published at once, each wave waiting for the previous (1: each record waits for the previous ack)." default:"1"`
}

// pubJSON is one acknowledged record as --json prints it.
type pubJSON struct {
	Stream    string    `json:"stream"`
	Shard     int       `json:"shard"`
	Offset    uint64    `json:"offset"`
	Value     string    `json:"value"`
	Key       string    `json:"key,omitempty"`
	Via       string    `json:"via"`
	Owner     string    `json:"owner"`
	Forwarded bool      `json:"forwarded"`
	Timestamp time.Time `json:"timestamp"`
}

func (p *pubCmd) Run(a *app) error {
	g := &p.clientFlags
	if p.Count < 1 {
		return usagef("--count must be at least 1, got %d", p.Count)
	}
	if p.Concurrency < 1 {
		return usagef("--concurrency must be at least 1, got %d", p.Concurrency)
	}
	ctx, cancel := context.WithTimeout(a.ctx, g.Timeout)
	defer cancel()

	vias := p.Via
	if len(vias) == 0 {
		vias = []string{""}
	}
	conns := make([]*conn, 0, len(vias))
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for _, via := range vias {
		c, err := g.connect(ctx, a, via)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}

	var opts []client.PublishOpt
	if p.Shard >= 0 {
		opts = append(opts, client.WithShard(p.Shard))
	}
	var key []byte
	if p.Key != "" {
		key = []byte(p.Key)
	}
	var (
		mu       sync.Mutex // serializes output and firstErr
		firstErr error
	)
	publish := func(i int) {
		value := p.Value
		if p.Count > 1 {
			value = fmt.Sprintf("%s-%03d", p.Value, i)
		}
		c := conns[i%len(conns)]
		ack, err := c.Publish(ctx, p.Stream, key, []byte(value), opts...)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			if firstErr == nil {
				firstErr = &brokerError{ID: c.id, Addr: c.addr, Err: &streamError{Stream: p.Stream, Err: err}}
			}
			return
		}
		if g.JSON {
			b, _ := json.Marshal(pubJSON{Stream: ack.Stream, Shard: ack.Shard, Offset: ack.Offset, Value: value, Key: p.Key,
				Via: ack.Via, Owner: ack.Owner, Forwarded: ack.Forwarded, Timestamp: ack.Timestamp})
			fmt.Fprintf(a.stdout, "%s\n", b)
			return
		}
		fmt.Fprintln(a.stdout, demo.Published(value, ack))
	}
	for wave := 0; wave < p.Count; wave += p.Concurrency {
		var wg sync.WaitGroup
		for i := wave; i < min(wave+p.Concurrency, p.Count); i++ {
			if p.Concurrency == 1 {
				publish(i)
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				publish(i)
			}()
		}
		wg.Wait()
		if firstErr != nil {
			return firstErr
		}
	}
	return nil
}
