package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// withStream connects to the one broker of a new fake cluster (with
// opts) and creates the stream "s" of one shard there.
func withStream(t *testing.T, opts ...Opt) (*fakeCluster, *Client, context.Context) {
	t.Helper()
	fc := newFakeCluster(t, 1)
	c := connect(t, fc, 0, opts...)
	ctx := testCtx(t)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "s", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	return fc, c, ctx
}

func connect(t *testing.T, fc *fakeCluster, broker int, opts ...Opt) *Client {
	t.Helper()
	c, err := Connect(testCtx(t), fc.brokers[broker].addr, fc.clientOpts(append([]Opt{WithLogger(quiet)}, opts...)...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestConfigDefaults(t *testing.T) {
	c := newConfig(nil)
	if c.maxInFlight != DefaultMaxInFlight || !c.blockOnFull || c.dialTimeout != DefaultDialTimeout ||
		c.backoffMin != DefaultBackoffMin || c.backoffMax != DefaultBackoffMax || c.logger == nil || c.insecure ||
		c.connIdleTimeout != DefaultConnIdleTimeout {
		t.Fatalf("defaults: %+v", c)
	}
	c = newConfig([]Opt{WithMaxInFlight(7), WithBlockOnFull(false), WithReconnect(time.Second, time.Millisecond), WithServerName("x")})
	if c.maxInFlight != 7 || c.blockOnFull || c.backoffMin != time.Second || c.backoffMax != DefaultBackoffMax || c.serverName != "x" {
		t.Fatalf("options: %+v", c)
	}
}

func TestBackoffCapped(t *testing.T) {
	c := &Client{cfg: newConfig([]Opt{WithReconnect(10*time.Millisecond, 80*time.Millisecond)})}
	for n := 1; n < 20; n++ {
		d := c.backoff(n)
		if d <= 0 || d > 80*time.Millisecond {
			t.Fatalf("backoff(%d) = %v", n, d)
		}
	}
	if d := c.backoff(1); d > 12*time.Millisecond {
		t.Fatalf("first backoff %v", d)
	}
}

func TestConnectRequiresCA(t *testing.T) {
	_, err := Connect(context.Background(), "127.0.0.1:1")
	if err == nil || !contains(err.Error(), "WithCA") {
		t.Fatalf("want an error naming WithCA, got %v", err)
	}
}

func TestConnectNoBroker(t *testing.T) {
	fc := newFakeCluster(t, 1)
	// A UDP port with nobody on it.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	pc.Close()
	_, err = Connect(context.Background(), addr, fc.clientOpts(WithDialTimeout(200*time.Millisecond), WithLogger(quiet))...)
	var de *DialError
	if !errors.As(err, &de) || de.Addr != addr || !de.Timeout() || !contains(err.Error(), "is the broker running") {
		t.Fatalf("want a timed-out *DialError, got %v", err)
	}
}

func TestConnectWrongCA(t *testing.T) {
	fc := newFakeCluster(t, 1)
	other := newFakeCluster(t, 1) // another CA
	_, err := Connect(context.Background(), fc.brokers[0].addr, other.clientOpts(WithLogger(quiet))...)
	var de *DialError
	if !errors.As(err, &de) {
		t.Fatalf("want *DialError, got %v", err)
	}
}

func TestConnectNeedsClientCert(t *testing.T) {
	fc := newFakeCluster(t, 1)
	_, err := Connect(context.Background(), fc.brokers[0].addr, WithCA(fc.ca), WithLogger(quiet))
	if err == nil || !contains(err.Error(), "no client certificate") {
		t.Fatalf("connect without a client certificate: %v, want a sentence naming the missing certificate", err)
	}
}

// TestConnectRefusesNonBroker: the SDK accepts only a broker's node
// certificate from the server, so the control plane's certificate (or
// any other role) cannot pose as a broker.
func TestConnectRefusesNonBroker(t *testing.T) {
	fc := newFakeCluster(t, 1)
	if err := transport.GenerateDevCerts(fc.dir, "ctl"); err != nil {
		t.Fatal(err)
	}
	cert, err := transport.LoadKeyPair(filepath.Join(fc.dir, "ctl.crt"), filepath.Join(fc.dir, "ctl.key"))
	if err != nil {
		t.Fatal(err)
	}
	impostor := &fakeBroker{fc: fc, id: "ctl", cert: cert}
	impostor.start(t, "127.0.0.1:0")
	t.Cleanup(impostor.stop)
	_, err = Connect(context.Background(), impostor.addr, fc.clientOpts(WithLogger(quiet))...)
	if err == nil || !contains(err.Error(), "not a felix-node certificate") {
		t.Fatalf("connect to a ctl certificate: %v, want a refusal naming the role", err)
	}
}

func TestWindow(t *testing.T) {
	c := &Client{cfg: newConfig([]Opt{WithMaxInFlight(2)})}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	defer c.cancel()
	p := newPublisher(c, "x")
	for range 2 {
		if err := p.acquire(context.Background(), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.acquire(context.Background(), false); !errors.Is(err, ErrWindowFull) {
		t.Fatalf("want ErrWindowFull, got %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := p.acquire(ctx, true); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want DeadlineExceeded, got %v", err)
	}
	f := &Future{window: p.window, stream: "x"}
	go func() {
		time.Sleep(10 * time.Millisecond)
		f.resolve(Ack{Offset: 7}, nil)
	}()
	if err := p.acquire(context.Background(), true); err != nil { // unblocked by resolve
		t.Fatal(err)
	}
	<-f.Done()
	if ack, err := f.Wait(context.Background()); err != nil || ack.Offset != 7 {
		t.Fatalf("Wait = %v, %v", ack, err)
	}
	c.cancel()
	if err := p.acquire(context.Background(), true); !errors.Is(err, ErrClosed) {
		t.Fatalf("want ErrClosed on a closed client, got %v", err)
	}
}

func TestFutureWaitContext(t *testing.T) {
	f := &Future{window: make(chan struct{}, 1), stream: "x"}
	f.window <- struct{}{}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := f.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("want Canceled, got %v", err)
	}
	f.resolve(Ack{}, errTest)
	if _, err := f.Wait(ctx); !errors.Is(err, errTest) { // resolved wins over a done ctx
		t.Fatalf("want the outcome, got %v", err)
	}
}

// TestChangeSentAgain: an admin change whose answer is lost (the
// broker's stream reset after the change was made) is sent again with the
// same request ID, and the control plane's answer to that, done, is the
// caller's: not "stream exists".
func TestChangeSentAgain(t *testing.T) {
	fc := newFakeCluster(t, 1)
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	fc.brokers[0].loseAnswers.Store(2)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "orders", Shards: 2}); err != nil {
		t.Fatalf("create with its first two answers lost: %v", err)
	}
	fc.requests.Lock()
	seen := maps.Clone(fc.requests.seen)
	fc.requests.Unlock()
	if len(seen) != 1 {
		t.Fatalf("request IDs seen: %v; want one, sent three times", seen)
	}
	for id, n := range seen {
		if n != 3 || !transport.ValidID(id) {
			t.Fatalf("request ID %q sent %d times; want a valid ID, three times", id, n)
		}
	}
	// A change refused is not sent again.
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "orders", Shards: 2}); !errors.Is(err, transport.ErrStreamExists) {
		t.Fatalf("want ErrStreamExists, got %v", err)
	}

	// A broker that does not pass request IDs on (an earlier version) in
	// the map: the change is sent once, and its lost answer is the
	// caller's, outcome unknown.
	fc.clearFeatures()
	if _, err := c.Map(ctx); err != nil {
		t.Fatal(err)
	}
	fc.brokers[0].loseAnswers.Store(1)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "once", Shards: 1}); !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("create through a broker without request IDs, its answer lost: %v, want ErrConnectionLost", err)
	}
	fc.requests.Lock()
	defer fc.requests.Unlock()
	if len(fc.requests.seen) != 3 {
		t.Fatalf("request IDs seen: %v; want the create of once sent once, with its own", fc.requests.seen)
	}
}

func TestPublishRoundTrip(t *testing.T) {
	fc := newFakeCluster(t, 2)
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "orders", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "orders", Shards: 2}); !errors.Is(err, transport.ErrStreamExists) {
		t.Fatalf("want ErrStreamExists, got %v", err)
	}
	for i, shard := range []int{0, 1, 1} {
		ack, err := c.Publish(ctx, "orders", nil, []byte("hello"), WithShard(shard), WithHeaders(map[string]string{"a": "b"}))
		if err != nil {
			t.Fatal(err)
		}
		wantOff := uint64(0)
		if i == 2 {
			wantOff = 1
		}
		owner := fmt.Sprintf("broker-%d", shard)
		if ack.Stream != "orders" || ack.Shard != shard || ack.Offset != wantOff || ack.Via != "broker-0" ||
			ack.Owner != owner || ack.Forwarded != (owner != "broker-0") || ack.Timestamp.IsZero() {
			t.Fatalf("publish %d: ack %+v", i, ack)
		}
	}
	// A keyed record goes where the key hashes.
	key := []byte("customer-42")
	ack, err := c.Publish(ctx, "orders", key, []byte("v"))
	if err != nil || ack.Shard != shardmap.ShardFor(key, 2) {
		t.Fatalf("keyed publish: %+v %v", ack, err)
	}

	// Per-record broker errors are typed and leave the stream usable.
	_, err = c.Publish(ctx, "nope", nil, []byte("x"))
	var pe *PublishError
	if !errors.Is(err, transport.ErrUnknownStream) || !errors.As(err, &pe) || pe.Stream != "nope" {
		t.Fatalf("want a PublishError matching ErrUnknownStream, got %v", err)
	}
	if _, err := c.Publish(ctx, "orders", key, []byte("after")); err != nil {
		t.Fatal(err)
	}

	list, err := c.Streams(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "orders" {
		t.Fatalf("Streams = %v, %v", list, err)
	}
	info, err := c.StreamInfo(ctx, "orders")
	if err != nil || info.Shards != 2 {
		t.Fatalf("StreamInfo = %v, %v", info, err)
	}
	if _, err := c.StreamInfo(ctx, "nope"); !errors.Is(err, transport.ErrUnknownStream) {
		t.Fatalf("StreamInfo(nope): %v", err)
	}
	m, err := c.ClusterStatus(ctx)
	if err != nil || len(m.Nodes) != 2 {
		t.Fatalf("ClusterStatus = %v, %v", m, err)
	}
}

func TestPublishPipelinedInOrder(t *testing.T) {
	_, c, ctx := withStream(t)
	p, err := c.Publisher(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const n = 1000
	futs := make([]*Future, n)
	for i := range futs {
		if futs[i], err = p.PublishAsync(ctx, []byte("k"), []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for i, f := range futs {
		select {
		case <-f.Done():
		default:
			t.Fatalf("future %d not resolved after Flush", i)
		}
		ack, err := f.Wait(ctx)
		if err != nil || ack.Offset != uint64(i) {
			t.Fatalf("future %d: %+v %v", i, ack, err)
		}
	}
	if len(p.window) != 0 {
		t.Fatalf("%d window slots still taken", len(p.window))
	}
}

func TestWindowFullAgainstBroker(t *testing.T) {
	fc, c, ctx := withStream(t, WithMaxInFlight(4), WithBlockOnFull(false))
	fc.brokers[0].holdAcks.Store(true)
	for i := range 4 {
		if _, err := c.PublishAsync(ctx, "s", nil, []byte("x")); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if _, err := c.PublishAsync(ctx, "s", nil, []byte("x")); !errors.Is(err, ErrWindowFull) {
		t.Fatalf("want ErrWindowFull, got %v", err)
	}
}

func TestConnectionLostFailsInFlight(t *testing.T) {
	fc, c, ctx := withStream(t)
	b := fc.brokers[0]
	if _, err := c.Publish(ctx, "s", nil, []byte("before")); err != nil {
		t.Fatal(err)
	}
	b.holdAcks.Store(true)
	const n = 10
	var futs []*Future
	for range n {
		f, err := c.PublishAsync(ctx, "s", nil, []byte("lost?"))
		if err != nil {
			t.Fatal(err)
		}
		futs = append(futs, f)
	}
	for b.published.Load() < n+1 {
		time.Sleep(time.Millisecond)
	}
	b.holdAcks.Store(false)
	b.restart(t)
	for i, f := range futs {
		_, err := f.Wait(ctx)
		var pe *PublishError
		if !errors.Is(err, ErrConnectionLost) || !errors.As(err, &pe) || pe.Stream != "s" {
			t.Fatalf("future %d: want a PublishError matching ErrConnectionLost, got %v", i, err)
		}
	}
	// New publishes redial and work.
	ack, err := c.Publish(ctx, "s", nil, []byte("after"))
	if err != nil || ack.Offset != 1 {
		t.Fatalf("publish after reconnect: %+v %v", ack, err)
	}
}

func TestCloseFailsInFlightAndLeavesNothing(t *testing.T) {
	before := goleak.IgnoreCurrent()
	fc := newFakeCluster(t, 2)
	c, err := Connect(testCtx(t), fc.brokers[0].addr, fc.clientOpts(WithLogger(quiet))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "s", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, "s", Earliest())
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.Publisher(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Publish(ctx, nil, []byte("x"), WithShard(1)); err != nil {
		t.Fatal(err)
	}
	fc.brokers[0].holdAcks.Store(true)
	f, err := c.PublishAsync(ctx, "s", nil, []byte("y"))
	if err != nil {
		t.Fatal(err)
	}
	for fc.brokers[0].published.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	c.Close()
	if leaked := clientGoroutinesAfter(time.Second); leaked != "" {
		t.Fatalf("client goroutines left after Close:\n%s", leaked)
	}
	if _, err := f.Wait(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("in-flight after Close: want ErrClosed, got %v", err)
	}
	select {
	case <-sub.Closed():
	default:
		t.Fatal("subscription not closed after Client.Close")
	}
	if _, err := c.Publish(ctx, "s", nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Publish after Close: %v", err)
	}
	if _, err := p.Publish(ctx, nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Publisher.Publish after Close: %v", err)
	}
	if _, err := c.Subscribe(ctx, "s", Earliest()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Subscribe after Close: %v", err)
	}
	fc.close() // the fake brokers' goroutines, too, must all end
	goleak.VerifyNone(t, before)
}

// clientGoroutines returns the stacks of goroutines running SDK code (not
// the fake brokers'), immediately: Close must have waited for them.
// clientGoroutinesAfter is clientGoroutines once none is left, or after
// wait: a goroutine whose last act was the WaitGroup's Done that Close
// waits for may still be returning when Close does (goleak retries alike).
func clientGoroutinesAfter(wait time.Duration) string {
	deadline := time.Now().Add(wait)
	for {
		leaked := clientGoroutines()
		if leaked == "" || time.Now().After(deadline) {
			return leaked
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func clientGoroutines() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, fn := range []string{"client.(*shardSub)", "client.(*pubSession)", "client.(*Subscription)", "client.(*Publisher)", "client.(*brokerConn)", "client.(*Client)"} {
			if strings.Contains(g, fn) && !strings.Contains(g, "client.TestClose") {
				out = append(out, g)
				break
			}
		}
	}
	return strings.Join(out, "\n\n")
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// TestOnResolved: the function given with OnResolved is called once per
// record: with its ack, in the order the acks arrive, before the next ack
// is read (no hand-off); with the error when the connection is lost; and
// not at all when the publish call itself fails.
func TestOnResolved(t *testing.T) {
	fc, c, ctx := withStream(t, WithMaxInFlight(4), WithBlockOnFull(false))
	b := fc.brokers[0]
	var mu sync.Mutex
	var offsets []uint64
	var errs []error
	calls := 0
	then := OnResolved(func(a Ack, err error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if err != nil {
			errs = append(errs, err)
			return
		}
		offsets = append(offsets, a.Offset)
	})
	const n = 200
	for i := range n {
		for {
			f, err := c.PublishAsync(ctx, "s", nil, []byte(fmt.Sprint(i)), then)
			if errors.Is(err, ErrWindowFull) {
				time.Sleep(100 * time.Microsecond)
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if i == n-1 {
				if _, err := f.Wait(ctx); err != nil {
					t.Fatal(err)
				}
			}
			break
		}
	}
	// The last record's Wait returns once its future resolved, which is
	// just before its function is called: wait for the call (a bounded
	// wait), and check with mu released, so that a failure does not leave
	// the reader blocked in a function.
	var gotCalls int
	var gotOffsets []uint64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		mu.Lock()
		gotCalls, gotOffsets = calls, offsets
		if calls >= n || time.Now().After(deadline) {
			calls, offsets = 0, nil
			mu.Unlock()
			break
		}
		mu.Unlock()
	}
	if gotCalls != n || len(gotOffsets) != n {
		t.Fatalf("%d calls, %d acks, want %d", gotCalls, len(gotOffsets), n)
	}
	for i, off := range gotOffsets {
		if off != uint64(i) {
			t.Fatalf("call %d had offset %d: acks out of order", i, off)
		}
	}

	// A full window fails the call: no function call for that record.
	b.holdAcks.Store(true)
	for range 4 {
		if _, err := c.PublishAsync(ctx, "s", nil, []byte("held"), then); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.PublishAsync(ctx, "s", nil, []byte("refused"), then); !errors.Is(err, ErrWindowFull) {
		t.Fatalf("want ErrWindowFull, got %v", err)
	}
	for b.published.Load() < n+4 {
		time.Sleep(time.Millisecond)
	}
	b.holdAcks.Store(false)
	b.restart(t) // the 4 in flight fail with the connection
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		got, gotErrs := calls, slices.Clone(errs)
		mu.Unlock()
		if got == 4 {
			for _, err := range gotErrs {
				if !errors.Is(err, ErrConnectionLost) {
					t.Fatalf("call with %v, want ErrConnectionLost", err)
				}
			}
			break
		}
		if got > 4 || time.Now().After(deadline) {
			t.Fatalf("%d calls after the connection was lost, want 4", got)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestReplicaStatusFreshMap: a replica status asks the brokers the
// current map has live, not those of the map the client cached while one
// of them was down.
func TestReplicaStatusFreshMap(t *testing.T) {
	fc := newFakeCluster(t, 3)
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "r", Shards: 2, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	down := fc.brokers[2].id
	fc.setLive(down, false)
	if _, err := c.Map(ctx); err != nil { // cached: the broker is down
		t.Fatal(err)
	}
	fc.setLive(down, true)
	sts, err := c.ReplicaStatus(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	voters := 0
	for _, st := range sts {
		if st.Node == down {
			if st.Err != "" || st.Member != "voter" {
				t.Fatalf("%s's replica of shard %d: %+v, want a voter (it is live in the current map)", down, st.Shard, st)
			}
			voters++
		}
	}
	if voters != 2 {
		t.Fatalf("%d replicas of %s reported, want 2: %+v", voters, down, sts)
	}
}

// TestMoveReplica: MoveReplica sends the move and returns where the
// replica went, with the map that made it; a refusal is a BrokerError
// that says why; arguments that cannot be right are refused unsent.
func TestMoveReplica(t *testing.T) {
	fc := newFakeCluster(t, 4)
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "r", Shards: 2, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	// The fake places r/1 on broker-1, broker-2, broker-3.
	_, err := c.MoveReplica(ctx, "r", 1, "broker-2", "")
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "client: move broker-2's replica of r/1: ") || !strings.Contains(err.Error(), "stop it first") {
		t.Fatalf("move of a live broker's replica: %v", err)
	}
	// A map a lease behind (broker-2 live in it) while the control plane
	// sees broker-2 down: the move is not sent unchecked.
	fc.stale.Store(fc.currentMap())
	fc.setLive("broker-2", false)
	fc.staleGets.Store(1)
	staleEpoch := fc.currentMap().Epoch
	if _, err := c.MoveReplica(ctx, "r", 1, "broker-2", ""); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "broker-2 is live: stop it first") {
		t.Fatalf("move checked against a stale map: %v", err)
	}
	if fc.currentMap().Epoch != staleEpoch {
		t.Fatal("a move checked against a stale map that shows its source live reached the control plane")
	}
	fc.staleGets.Store(0)
	// Another replica that is not a voter (a lost one rejoining, say):
	// the move is refused before the control plane is asked.
	joining := "broker-3"
	fc.joining.Store(&joining)
	epoch0 := fc.currentMap().Epoch
	if _, err := c.MoveReplica(ctx, "r", 1, "broker-2", ""); !errors.Is(err, ErrReplicasNotReady) || !strings.Contains(err.Error(), "broker-3, another replica of r/1, holds a replica that is not a voter of the group (joining)") {
		t.Fatalf("move while another replica is joining: %v", err)
	}
	if fc.currentMap().Epoch != epoch0 {
		t.Fatal("a move refused by the client's check reached the control plane")
	}
	fc.joining.Store(nil)
	mv, err := c.MoveReplica(ctx, "r", 1, "broker-2", "")
	if err != nil {
		t.Fatal(err)
	}
	m := fc.currentMap()
	want := MovedReplica{Stream: "r", Shard: 1, From: "broker-2", To: "broker-0", Epoch: m.Epoch, Replicas: []string{"broker-1", "broker-0", "broker-3"}}
	if !reflect.DeepEqual(mv, want) {
		t.Fatalf("moved %+v, want %+v", mv, want)
	}
	if got, err := c.Map(ctx); err != nil || got.Epoch < mv.Epoch {
		t.Fatalf("map after the move: epoch %d, %v", got.Epoch, err)
	}
	if _, err := c.MoveReplica(ctx, "r", 1, "broker-2", "broker-3"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("the same move again: %v, want ErrInvalid", err)
	}
	if _, err := c.MoveReplica(ctx, "nope", 0, "broker-2", ""); !errors.Is(err, ErrUnknownStream) {
		t.Fatalf("move in a stream that does not exist: %v", err)
	}

	epoch := fc.currentMap().Epoch
	for _, tc := range []struct {
		stream string
		shard  int
		from   string
		want   error
	}{
		{"bad name", 0, "broker-2", ErrInvalidStreamName},
		{"r", -1, "broker-2", ErrNoShard},
		{"r", 0, "", ErrInvalid},
	} {
		if _, err := c.MoveReplica(ctx, tc.stream, tc.shard, tc.from, ""); !errors.Is(err, tc.want) {
			t.Errorf("MoveReplica(%q, %d, %q): %v, want %v", tc.stream, tc.shard, tc.from, err, tc.want)
		}
	}
	if fc.currentMap().Epoch != epoch {
		t.Fatal("a move refused by the client reached the cluster")
	}
}

// TestRemoveBroker: RemoveBroker sends the broker to remove and keeps the
// map the answer carries; a refusal is an error that says why; a request
// naming no broker is refused unsent.
func TestRemoveBroker(t *testing.T) {
	fc := newFakeCluster(t, 4)
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	if err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "r", Shards: 2, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	// The fake places r/0 on broker-0, broker-1, broker-2 and r/1 on
	// broker-1, broker-2, broker-3.
	err := c.RemoveBroker(ctx, "broker-3")
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "client: remove broker broker-3: ") || !strings.Contains(err.Error(), "stop it first") {
		t.Fatalf("removing a live broker: %v", err)
	}
	fc.setLive("broker-3", false)
	if err := c.RemoveBroker(ctx, "broker-3"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "move them first") {
		t.Fatalf("removing a broker holding a replica: %v", err)
	}
	if _, err := c.MoveReplica(ctx, "r", 1, "broker-3", ""); err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveBroker(ctx, "broker-3"); err != nil {
		t.Fatal(err)
	}
	m, err := c.Map(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Node("broker-3"); ok || len(m.Nodes) != 3 || m.Epoch != fc.currentMap().Epoch {
		t.Fatalf("map after the removal: epoch %d (cluster's %d), nodes %+v", m.Epoch, fc.currentMap().Epoch, m.Nodes)
	}
	if err := c.RemoveBroker(ctx, "broker-3"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "not a member") {
		t.Fatalf("removing it again: %v", err)
	}

	epoch := fc.currentMap().Epoch
	if err := c.RemoveBroker(ctx, ""); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "name the broker to remove") {
		t.Fatalf("RemoveBroker(\"\"): %v, want ErrInvalid", err)
	}
	if fc.currentMap().Epoch != epoch {
		t.Fatal("a removal refused by the client reached the cluster")
	}
}

// TestBufferedRecordsWritten: records published while others wait for
// their acks are only buffered by the sender; the stream's flusher
// goroutine must write them, without any ack to prompt it.
func TestBufferedRecordsWritten(t *testing.T) {
	fc, c, ctx := withStream(t)
	b := fc.brokers[0]
	b.holdAcks.Store(true)
	const n = 50
	for i := range n {
		if _, err := c.PublishAsync(ctx, "s", nil, []byte{byte(i)}); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.published.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("the broker got %d of %d records: buffered records were never written", b.published.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}
