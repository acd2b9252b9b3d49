package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/demo"
)

// maxRecordText documents the record size limit in help texts.
const maxRecordText = "A record (key, value, headers and producer id) may be at most the brokers' --max-record-bytes: 1 MiB (1048576 bytes) by default; larger ones are refused with payload_too_large."

type pubCmd struct {
	Stream      string   `arg:"" help:"Stream to publish to."`
	Value       string   `arg:"" optional:"" help:"Record value; - reads it from standard input. With --count N > 1 the records are VALUE-000, VALUE-001, ... ${max_record}"`
	File        string   `short:"f" help:"Read the value from FILE instead of the command line." placeholder:"FILE" type:"path"`
	Header      []string `short:"H" help:"Record header KEY=VALUE (repeatable)." placeholder:"KEY=VALUE"`
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
	Value     string    `json:"value,omitempty"` // omitted past maxEcho bytes
	Size      int       `json:"value_bytes"`
	Key       string    `json:"key,omitempty"`
	Via       string    `json:"via"`
	Owner     string    `json:"owner"`
	Forwarded bool      `json:"forwarded"`
	Timestamp time.Time `json:"timestamp"`
}

// maxEcho is the longest value echoed in full on a result line; a longer
// one is shown by its start and its size.
const maxEcho = 64

// publishedLine is the result line of one record: the seed's words, with
// a value longer than maxEcho shown by its start and its size.
func publishedLine(value []byte, ack client.Ack) string {
	if len(value) <= maxEcho && utf8.Valid(value) {
		return demo.Published(string(value), ack)
	}
	cut := min(len(value), 32)
	for cut > 0 && !utf8.Valid(value[:cut]) {
		cut--
	}
	shown := string(value[:cut]) + "…"
	q := strconv.Quote(shown)
	return strings.Replace(demo.Published(shown, ack), q, q+" ("+byteSize(len(value))+")", 1)
}

// byteSize says n bytes for a person: "812 bytes", "2.0 KiB", "1.5 MiB".
func byteSize(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}

// value reads the record value: the argument, - for standard input, or
// --file.
func (p *pubCmd) value(a *app) ([]byte, error) {
	switch {
	case p.File != "" && p.Value != "":
		return nil, usagef("give the value either as an argument or with --file, not both")
	case p.File != "":
		b, err := os.ReadFile(p.File)
		if err != nil {
			return nil, usagef("cannot read the value from --file: %v", err)
		}
		return b, nil
	case p.Value == "-":
		b, err := io.ReadAll(a.stdin)
		if err != nil {
			return nil, fmt.Errorf("reading the value from standard input: %w", err)
		}
		return b, nil
	case p.Value == "":
		return nil, usagef("pub needs a value: felixctl pub %s VALUE, or - to read it from standard input, or --file FILE", p.Stream)
	}
	return []byte(p.Value), nil
}

func (p *pubCmd) headers() (map[string]string, error) {
	if len(p.Header) == 0 {
		return nil, nil
	}
	h := make(map[string]string, len(p.Header))
	for _, kv := range p.Header {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usagef("--header %q: write it as KEY=VALUE", kv)
		}
		h[k] = v
	}
	return h, nil
}

func (p *pubCmd) Run(a *app) error {
	g := a.flags
	if p.Count < 1 {
		return usagef("--count must be at least 1, got %d", p.Count)
	}
	if p.Concurrency < 1 {
		return usagef("--concurrency must be at least 1, got %d", p.Concurrency)
	}
	if p.Shard < -1 {
		return usagef("--shard must be a shard number (0 or more), got %d", p.Shard)
	}
	base, err := p.value(a)
	if err != nil {
		return err
	}
	headers, err := p.headers()
	if err != nil {
		return err
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
	if p.Shard >= 0 {
		if err := checkShard(ctx, conns[0], p.Stream, p.Shard); err != nil {
			return err
		}
	}

	var opts []client.PublishOpt
	if p.Shard >= 0 {
		opts = append(opts, client.WithShard(p.Shard))
	}
	if headers != nil {
		opts = append(opts, client.WithHeaders(headers))
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
		value := base
		if p.Count > 1 {
			value = fmt.Appendf(nil, "%s-%03d", base, i)
		}
		c := conns[i%len(conns)]
		// --timeout bounds each publish, as it does each request of
		// other commands, not the whole --count.
		pctx, cancel := context.WithTimeout(a.ctx, g.Timeout)
		ack, err := c.Publish(pctx, p.Stream, key, value, opts...)
		cancel()
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			if firstErr == nil {
				firstErr = &brokerError{ID: c.id, Addr: c.addr, Err: &streamError{Stream: p.Stream, Err: err}}
			}
			return
		}
		if g.JSON {
			j := pubJSON{Stream: ack.Stream, Shard: ack.Shard, Offset: ack.Offset, Size: len(value), Key: p.Key,
				Via: ack.Via, Owner: ack.Owner, Forwarded: ack.Forwarded, Timestamp: ack.Timestamp}
			if len(value) <= maxEcho && utf8.Valid(value) {
				j.Value = string(value)
			}
			b, _ := json.Marshal(j)
			fmt.Fprintf(a.stdout, "%s\n", b)
			return
		}
		fmt.Fprintln(a.stdout, publishedLine(value, ack))
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

// checkShard says, as a usage error, that shard is not a shard of stream
// when c's map shows it is not.
func checkShard(ctx context.Context, c *conn, stream string, shard int) error {
	m, err := c.Map(ctx)
	if err != nil {
		return nil // the publish or subscribe will say what is wrong
	}
	st, ok := m.Stream(stream)
	if !ok || shard < st.Shards {
		return nil
	}
	if st.Shards == 1 {
		return usagef("stream %q has 1 shard: --shard must be 0, got %d", stream, shard)
	}
	return usagef("stream %q has %d shards: --shard must be 0 to %d, got %d", stream, st.Shards, st.Shards-1, shard)
}
