package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/shardmap"
)

// Options configures Run. Zero means the documented default.
type Options struct {
	// Binary is the executable the brokers run as `<Binary> broker --id ...`
	// (felixctl passes its own, tests the felix binary); required.
	Binary string
	// Dir holds the cluster's certificates, state, data and logs; default a
	// new temporary directory, removed when Run returns. A Dir given is
	// left in place.
	Dir string
	// Stream is the stream the story publishes to; default "orders".
	Stream string
	// Pause is how long the story waits between scenes, so a person can
	// follow it; default none (the fast telling tests use). The story has
	// about seven pauses' worth of scenes and beats: felixctl demo's
	// default of 6s makes it about 45 seconds, as the seed's.
	Pause time.Duration
	// Logger receives the control plane's and the SDK's logs; default
	// discards them (the story is the output).
	Logger *slog.Logger
}

// Result is what the story observed, for tests and callers that want more
// than the text.
type Result struct {
	Map      *shardmap.Map // the map the cluster settled on
	Owner    string        // the broker owning shard 0 of the stream
	NonOwner string        // the broker "hello" was published through
	Hello    client.Ack
	Direct   client.Ack
	// First holds what the subscriber received after hello and direct.
	First []client.Record
	// Sequential holds the six records sent one at a time, as received.
	Sequential []client.Record
	// Concurrent holds the twenty-four sent twelve at a time, as received.
	Concurrent []client.Record
}

// stepTimeout bounds each step of the story, so a broken cluster fails the
// demo with an error instead of hanging it.
const stepTimeout = 30 * time.Second

// Run starts a control plane (in-process) and three broker processes,
// tells the story on w, and tears the cluster down, also when ctx ends
// first.
func Run(ctx context.Context, w io.Writer, opts Options) (res *Result, err error) {
	if opts.Binary == "" {
		return nil, errors.New("demo: Options.Binary is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Dir == "" {
		dir, err := os.MkdirTemp("", "felix-demo-")
		if err != nil {
			return nil, fmt.Errorf("demo: create a directory for the cluster: %w", err)
		}
		defer os.RemoveAll(dir)
		opts.Dir = dir
	}
	fmt.Fprintln(w, "starting a control plane and three broker processes ...")
	startCtx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	c, err := cluster.Start(startCtx, cluster.Options{Dir: opts.Dir, Binary: opts.Binary, Brokers: 3, Logger: opts.Logger})
	if err != nil {
		return nil, fmt.Errorf("demo: start the cluster: %w", err)
	}
	defer func() {
		fmt.Fprintln(w, "\nstopping the cluster ...")
		c.Close()
		fmt.Fprintln(w, "cluster stopped.")
	}()
	return Story(ctx, w, c, opts)
}

// Story tells the story on w against the running cluster c; opts.Binary and
// opts.Dir are not used. It creates opts.Stream with one shard if missing.
func Story(ctx context.Context, w io.Writer, c *cluster.Cluster, opts Options) (*Result, error) {
	stream := opts.Stream
	if stream == "" {
		stream = "orders"
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &story{w: w, pause: opts.Pause, stream: stream, res: &Result{}, clients: map[string]*client.Client{}}
	defer s.close()

	for _, b := range c.Brokers() {
		s.ids = append(s.ids, b.ID)
		cctx, cancel := context.WithTimeout(ctx, stepTimeout)
		cl, err := client.Connect(cctx, b.Addr, client.WithCAFile(c.CAFile()), client.WithClientCertFile(c.AdminCert()), client.WithLogger(logger))
		cancel()
		if err != nil {
			return nil, fmt.Errorf("demo: connect to %s: %w", b.ID, err)
		}
		s.clients[b.ID] = cl
	}
	if err := s.settle(ctx, c); err != nil {
		return nil, err
	}
	if err := s.helloAndDirect(ctx); err != nil {
		return nil, err
	}
	if err := s.oneAtATime(ctx); err != nil {
		return nil, err
	}
	if err := s.twelveAtATime(ctx); err != nil {
		return nil, err
	}
	return s.res, nil
}

// story is the state of one telling.
type story struct {
	w       io.Writer
	pause   time.Duration
	stream  string
	ids     []string // broker ids in order
	clients map[string]*client.Client
	res     *Result

	sub      *client.Subscription
	next     func() (client.Record, error, bool)
	stopPull func()
}

func (s *story) close() {
	if s.stopPull != nil {
		s.stopPull()
	}
	if s.sub != nil {
		s.sub.Stop()
	}
	for _, cl := range s.clients {
		cl.Close()
	}
}

func (s *story) printf(format string, args ...any) { fmt.Fprintf(s.w, format, args...) }

// scene waits opts.Pause (or until ctx ends) before the next scene.
func (s *story) scene(ctx context.Context) error { return s.beat(ctx, 1) }

// beat waits the fraction f of opts.Pause (or until ctx ends): a shorter
// pause within a scene.
func (s *story) beat(ctx context.Context, f float64) error {
	d := time.Duration(float64(s.pause) * f)
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// settle creates the stream, waits until every broker has it in its map,
// prints the ownership and attaches the subscriber to the owner.
func (s *story) settle(ctx context.Context, c *cluster.Cluster) error {
	sctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	sc := shardmap.StreamConfig{Name: s.stream, Shards: 1}
	if err := s.clients[s.ids[0]].CreateStream(sctx, sc); err != nil {
		return fmt.Errorf("demo: create stream %s: %w", s.stream, err)
	}
	for _, id := range s.ids {
		if err := waitStream(sctx, s.clients[id], s.stream); err != nil {
			return fmt.Errorf("demo: %s never saw stream %s in its map: %w", id, s.stream, err)
		}
	}
	m, err := c.WaitMap(sctx, func(m *shardmap.Map) bool { _, ok := m.Stream(s.stream); return ok })
	if err != nil {
		return err
	}
	owner, err := m.Owner(s.stream, 0)
	if err != nil {
		return fmt.Errorf("demo: owner of %s/0: %w", s.stream, err)
	}
	s.res.Map, s.res.Owner = m, owner.ID
	for _, id := range s.ids {
		if id != owner.ID {
			s.res.NonOwner = id
			break
		}
	}
	s.printf("\nthe cluster settled on this ownership (rendezvous hashing of the shard against the node ids):\n\n")
	cluster.WriteOwnership(s.w, m)
	if err := s.scene(ctx); err != nil {
		return err
	}

	sub, err := s.clients[owner.ID].Subscribe(ctx, s.stream, client.Earliest())
	if err != nil {
		return fmt.Errorf("demo: subscribe through %s: %w", owner.ID, err)
	}
	s.sub = sub
	s.next, s.stopPull = iter.Pull2(sub.Records(ctx))
	s.printf("\n%s owns %s/0: a subscriber is attached to it; publishers may go through any broker.\n", owner.ID, s.stream)
	return s.scene(ctx)
}

// waitStream waits until cl's broker has stream in its map.
func waitStream(ctx context.Context, cl *client.Client, stream string) error {
	for {
		if m, err := cl.Map(ctx); err == nil {
			if _, ok := m.Stream(stream); ok {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// publish publishes value through broker id and waits for its ack.
func (s *story) publish(ctx context.Context, id, value string) (client.Ack, error) {
	pctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	ack, err := s.clients[id].Publish(pctx, s.stream, nil, []byte(value))
	if err != nil {
		return ack, fmt.Errorf("demo: publish %q via %s: %w", value, id, err)
	}
	return ack, nil
}

// receive takes the next n records from the subscriber.
func (s *story) receive(ctx context.Context, n int) ([]client.Record, error) {
	var recs []client.Record
	for len(recs) < n {
		// The pull iterator yields in the context its Records call got;
		// bound the wait from here.
		done := make(chan struct{})
		var (
			rec client.Record
			err error
			ok  bool
		)
		go func() {
			defer close(done)
			rec, err, ok = s.next()
		}()
		select {
		case <-done:
		case <-time.After(stepTimeout):
			s.sub.Stop() // ends the iterator, so the goroutine above returns
			<-done
			return recs, fmt.Errorf("demo: the subscriber received %d of %d records within %s", len(recs), n, stepTimeout)
		}
		if !ok {
			return recs, fmt.Errorf("demo: the subscription ended after %d of %d records: %v", len(recs), n, s.sub.Err())
		}
		if err != nil {
			return recs, fmt.Errorf("demo: subscriber: %w", err)
		}
		recs = append(recs, rec)
	}
	return recs, ctx.Err()
}

// helloAndDirect is the heart of the seed: a forwarded publish, then a
// local one, then what the subscriber received.
func (s *story) helloAndDirect(ctx context.Context) error {
	owner, other := s.res.Owner, s.res.NonOwner
	s.printf("\n$ felixctl pub %s hello --via %s\n", s.stream, other)
	ack, err := s.publish(ctx, other, "hello")
	if err != nil {
		return err
	}
	s.res.Hello = ack
	s.printf("%s\n", Published("hello", ack))
	if err := s.scene(ctx); err != nil {
		return err
	}
	s.printf("\n$ felixctl pub %s direct --via %s\n", s.stream, owner)
	if ack, err = s.publish(ctx, owner, "direct"); err != nil {
		return err
	}
	s.res.Direct = ack
	s.printf("%s\n", Published("direct", ack))
	if err := s.beat(ctx, 0.5); err != nil {
		return err
	}

	recs, err := s.receive(ctx, 2)
	s.res.First = recs
	if err != nil {
		return err
	}
	s.printf("\nthe subscriber (attached to %s):\n", owner)
	for _, r := range recs {
		s.printf("  %s\n", Received(r))
	}
	return s.scene(ctx)
}

// oneAtATime sends six records, each after the previous one's ack,
// through the brokers in turn: they arrive in the order sent.
func (s *story) oneAtATime(ctx context.Context) error {
	s.printf("\nsix records sent one at a time, through %s in turn:\n", list(s.ids))
	var sent []string
	for i := range 6 {
		v := fmt.Sprintf("seq-%03d", i)
		ack, err := s.publish(ctx, s.ids[i%len(s.ids)], v)
		if err != nil {
			return err
		}
		sent = append(sent, v)
		s.printf("  %s\n", Published(v, ack))
		if err := s.beat(ctx, 1.0/6); err != nil {
			return err
		}
	}
	recs, err := s.receive(ctx, len(sent))
	s.res.Sequential = recs
	if err != nil {
		return err
	}
	got := values(recs)
	s.printf("the subscriber received: %s\n", strings.Join(got, " "))
	if !slices.Equal(got, sent) {
		return fmt.Errorf("demo: records sent one at a time arrived out of order: sent %v, received %v", sent, got)
	}
	s.printf("in the order sent: each was acknowledged before the next was published.\n")
	return s.scene(ctx)
}

// twelveAtATime sends twenty-four records in two waves of twelve
// concurrent publishes through three brokers: all arrive, each once, in
// the order the owner committed them.
func (s *story) twelveAtATime(ctx context.Context) error {
	s.printf("\ntwenty-four records sent twelve at a time, through %s at once:\n", list(s.ids))
	var sent []string
	var forwarded int
	for wave := range 2 {
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs []error
		)
		for j := range 12 {
			v := fmt.Sprintf("par-%03d", wave*12+j)
			sent = append(sent, v)
			wg.Add(1)
			go func(id string) {
				defer wg.Done()
				ack, err := s.publish(ctx, id, v)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				} else if ack.Forwarded {
					forwarded++
				}
			}(s.ids[j%len(s.ids)])
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
	}
	s.printf("  all %d acknowledged (%d forwarded to %s, %d written locally)\n", len(sent), forwarded, s.res.Owner, len(sent)-forwarded)
	recs, err := s.receive(ctx, len(sent))
	s.res.Concurrent = recs
	if err != nil {
		return err
	}
	if err := s.beat(ctx, 0.5); err != nil {
		return err
	}
	got := values(recs)
	s.printf("the subscriber received, in offset order:\n")
	for chunk := range slices.Chunk(got, 12) {
		s.printf("  %s\n", strings.Join(chunk, " "))
	}
	if err := s.beat(ctx, 0.5); err != nil {
		return err
	}
	sorted := slices.Sorted(slices.Values(got))
	if !slices.Equal(sorted, sent) {
		return fmt.Errorf("demo: of the %d records sent concurrently the subscriber received %v", len(sent), got)
	}
	if slices.Equal(got, sent) {
		s.printf("all %d, each once; this time the owner happened to commit them in the order sent.\n", len(sent))
	} else {
		s.printf("all %d, each once, in an order that differs from the order sent.\n", len(sent))
	}
	s.printf("%s\n", Why)
	return nil
}

func values(recs []client.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = string(r.Value)
	}
	return out
}

// list joins ids as "a, b and c".
func list(ids []string) string {
	switch len(ids) {
	case 0:
		return ""
	case 1:
		return ids[0]
	}
	return strings.Join(ids[:len(ids)-1], ", ") + " and " + ids[len(ids)-1]
}
