package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"

	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/internal/dirlock"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

func publish(seq uint64, stream, value string) *transport.Publish {
	return &transport.Publish{Seq: seq, Stream: stream, Shard: -1, Key: []byte(value), Value: []byte(value)}
}

func wantAck(t *testing.T, f transport.Frame, seq uint64) *transport.Ack {
	t.Helper()
	a, ok := f.(*transport.Ack)
	if !ok {
		t.Fatalf("seq %d: want an ack, got %T %+v", seq, f, f)
	}
	if a.Seq != seq {
		t.Fatalf("ack for seq %d, want %d", a.Seq, seq)
	}
	return a
}

func wantError(t *testing.T, f transport.Frame, target error) *transport.Error {
	t.Helper()
	e, ok := f.(*transport.Error)
	if !ok {
		t.Fatalf("want an error, got %T %+v", f, f)
	}
	if !errors.Is(e, target) {
		t.Fatalf("error %v, want %v", e, target)
	}
	return e
}

func TestPublishDirectAndForwarded(t *testing.T) {
	ip := startInproc(t, 3, shardmap.StreamConfig{Name: "orders", Shards: 1})
	owner, other := ip.owner("orders", 0), ip.nonOwner("orders", 0)

	ws := openStream(t, ip.dial(owner))
	ws.send(publish(1, "orders", "direct"))
	a := wantAck(t, ws.recv(), 1)
	if a.Forwarded || a.Owner != owner.NodeID() || a.Via != owner.NodeID() || a.Offset != 0 {
		t.Fatalf("direct ack %+v: want owner %s, not forwarded, offset 0", a, owner.NodeID())
	}

	ws = openStream(t, ip.dial(other))
	ws.send(publish(1, "orders", "hello"))
	a = wantAck(t, ws.recv(), 1)
	if !a.Forwarded || a.Owner != owner.NodeID() || a.Via != other.NodeID() || a.Offset != 1 {
		t.Fatalf("forwarded ack %+v: want via %s to %s, offset 1", a, other.NodeID(), owner.NodeID())
	}
}

func TestPipelinedOrderThroughForward(t *testing.T) {
	ip := startInproc(t, 2, shardmap.StreamConfig{Name: "orders", Shards: 1})
	for _, b := range ip.brokers {
		t.Run("via "+b.NodeID(), func(t *testing.T) {
			ws := openStream(t, ip.dial(b))
			const n = 2000
			go func() {
				for i := range n {
					ws.w.Buffer(publish(uint64(i), "orders", fmt.Sprint(i)))
					if i%64 == 63 {
						ws.w.Flush()
					}
				}
				ws.w.Flush()
			}()
			var last uint64
			for i := range n {
				a := wantAck(t, ws.recv(), uint64(i))
				if i > 0 && a.Offset != last+1 {
					t.Fatalf("seq %d committed at offset %d after %d: send order broken", i, a.Offset, last)
				}
				last = a.Offset
			}
		})
	}
}

func TestSubscribeReplayThenLive(t *testing.T) {
	ip := startInproc(t, 2, shardmap.StreamConfig{Name: "orders", Shards: 1})
	owner, other := ip.owner("orders", 0), ip.nonOwner("orders", 0)
	pub := openStream(t, ip.dial(other))
	for i := range 10 {
		pub.send(publish(uint64(i), "orders", fmt.Sprint(i)))
		wantAck(t, pub.recv(), uint64(i))
	}

	// Through a non-owner: a redirect naming the owner.
	sub := openStream(t, ip.dial(other))
	sub.send(&transport.Subscribe{Stream: "orders", Shard: 0, Start: transport.StartEarliest, Credit: 100})
	e := wantError(t, sub.recv(), transport.ErrNotOwner)
	if e.Owner != owner.NodeID() {
		t.Fatalf("redirect names %q, want %s", e.Owner, owner.NodeID())
	}

	sub = openStream(t, ip.dial(owner))
	sub.send(&transport.Subscribe{Stream: "orders", Shard: 0, Start: transport.StartOffset, Offset: 4, Credit: 100})
	next := uint64(4)
	for next < 10 {
		recs, ok := sub.recv().(*transport.Records)
		if !ok {
			t.Fatal("want records")
		}
		for _, r := range recs.Records {
			if r.Offset != next || string(r.Value) != fmt.Sprint(next) {
				t.Fatalf("record %d %q, want %d", r.Offset, r.Value, next)
			}
			next++
		}
	}
	pub.send(publish(10, "orders", "10"))
	wantAck(t, pub.recv(), 10)
	recs := sub.recv().(*transport.Records)
	if len(recs.Records) != 1 || recs.Records[0].Offset != 10 {
		t.Fatalf("live tail delivered %+v, want offset 10", recs.Records)
	}
}

func TestCreditBoundsDelivery(t *testing.T) {
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	b := ip.brokers[0]
	pub := openStream(t, ip.dial(b))
	for i := range 50 {
		pub.send(publish(uint64(i), "orders", "x"))
	}
	for i := range 50 {
		wantAck(t, pub.recv(), uint64(i))
	}
	sub := openStream(t, ip.dial(b))
	sub.send(&transport.Subscribe{Stream: "orders", Start: transport.StartEarliest, Credit: 7})
	got := 0
	for got < 7 {
		got += len(sub.recv().(*transport.Records).Records)
	}
	if got != 7 {
		t.Fatalf("delivered %d records on 7 credits", got)
	}
	sub.send(&transport.Credit{Records: 43})
	for got < 50 {
		got += len(sub.recv().(*transport.Records).Records)
	}
	if got != 50 {
		t.Fatalf("delivered %d records on 50 credits", got)
	}
}

func TestBadInputIsTypedAndContained(t *testing.T) {
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "orders", Shards: 2})
	b := ip.brokers[0]
	conn := ip.dial(b)

	good := openStream(t, conn)
	good.send(publish(1, "orders", "before"))
	wantAck(t, good.recv(), 1)

	cases := []struct {
		name string
		raw  []byte
		want error
	}{
		{"oversized frame", append(binary.BigEndian.AppendUint32(nil, 1<<30), byte(transport.FrameSubscribe)), transport.ErrFrameTooLarge},
		{"oversized publish", append(binary.BigEndian.AppendUint32(nil, 1<<30), byte(transport.FramePublish)), transport.ErrPayloadTooLarge},
		{"unknown frame type", append(binary.BigEndian.AppendUint32(nil, 2), 0xEE, 0x90), transport.ErrUnknownFrame},
		{"malformed body", append(binary.BigEndian.AppendUint32(nil, 3), byte(transport.FramePublish), 0xc1, 0xc1), transport.ErrMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bad := openStream(t, conn)
			if _, err := bad.s.Write(tc.raw); err != nil {
				t.Fatal(err)
			}
			wantError(t, bad.recv(), tc.want)
			bad.recvEnd()
		})
	}
	t.Run("malformed publish after good ones", func(t *testing.T) {
		bad := openStream(t, conn)
		bad.send(publish(1, "orders", "ok"))
		wantAck(t, bad.recv(), 1)
		bad.s.Write(append(binary.BigEndian.AppendUint32(nil, 3), byte(transport.FramePublish), 0x93, 0xc1))
		wantError(t, bad.recv(), transport.ErrMalformed)
		bad.recvEnd()
	})

	// Per-record errors do not end the stream.
	good.send(publish(2, "nope", "x"))
	wantError(t, good.recv(), transport.ErrUnknownStream)
	good.send(&transport.Publish{Seq: 3, Stream: "orders", Shard: 9, Value: []byte("x")})
	wantError(t, good.recv(), transport.ErrInvalid)
	good.send(&transport.Publish{Seq: 4, Stream: "orders", Shard: 0, Value: make([]byte, b.cfg.MaxPayload+1)})
	wantError(t, good.recv(), transport.ErrPayloadTooLarge)
	good.send(publish(5, "orders", "after"))
	wantAck(t, good.recv(), 5)

	sub := openStream(t, conn)
	sub.send(&transport.Subscribe{Stream: "nope", Credit: 1})
	wantError(t, sub.recv(), transport.ErrUnknownStream)
	sub = openStream(t, conn)
	sub.send(&transport.Subscribe{Stream: "orders", Start: transport.StartOffset, Offset: 1000, Credit: 1})
	wantError(t, sub.recv(), transport.ErrOutOfRange)

	// The connection still serves new streams.
	again := openStream(t, conn)
	again.send(publish(1, "orders", "still fine"))
	wantAck(t, again.recv(), 1)
}

func TestForwardedPublishFromClientCannotClaimEpoch(t *testing.T) {
	ip := startInproc(t, 2, shardmap.StreamConfig{Name: "orders", Shards: 1})
	other := ip.nonOwner("orders", 0)
	ws := openStream(t, ip.dial(other))
	p := publish(1, "orders", "x")
	p.Via, p.Epoch = "someone-else", 1<<40
	ws.send(p)
	a := wantAck(t, ws.recv(), 1)
	if a.Via != other.NodeID() {
		t.Fatalf("client-supplied Via leaked into the ack: %+v", a)
	}
}

// TestSecondBrokerOnOneDataDirRefused: a broker on the data directory of
// a running one is refused before it touches it (two on one directory
// overwrote each other's acked records), and the directory is free again
// once the first is closed.
func TestSecondBrokerOnOneDataDirRefused(t *testing.T) {
	ip := startInproc(t, 1)
	cfg := ip.brokerConfig(0)
	cfg.Listen = "127.0.0.1:0"
	if b, err := New(cfg); !errors.Is(err, dirlock.ErrInUse) {
		if b != nil {
			b.Close()
		}
		t.Fatalf("a second broker on broker-0's data directory: %v, want dirlock.ErrInUse", err)
	}
	if err := ip.brokers[0].Close(); err != nil {
		t.Fatal(err)
	}
	ip.brokers[0] = ip.startBroker(0)
}

// TestNotReadyOnceClosing: from Close's first step (no more accepts,
// sessions draining, up to ForwardTimeout) the broker says it is not
// ready; it said ready until its context was cancelled at the end.
func TestNotReadyOnceClosing(t *testing.T) {
	ip := startInproc(t, 1)
	b := ip.brokers[0]
	if err := b.Readiness(); err != nil {
		t.Fatalf("a running broker: %v", err)
	}
	b.mu.Lock()
	b.mu.closing = true // as Close's first step sets it
	b.mu.Unlock()
	err := b.Readiness()
	b.mu.Lock()
	b.mu.closing = false
	b.mu.Unlock()
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "shutting down") {
		t.Fatalf("a closing broker's readiness: %v, want not ready, shutting down", err)
	}
}

// TestNotReadyWithoutTheControlPlane: a broker that has had no link to
// the control plane for longer than its lease is not ready (the others
// see it down and forward nothing to it); it reported itself ready for as
// long as it ran.
func TestNotReadyWithoutTheControlPlane(t *testing.T) {
	ip := startInprocWith(t, func(c *Config) { c.LeaseTTL = 300 * time.Millisecond }, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	b := ip.brokers[0]
	if err := b.Readiness(); err != nil {
		t.Fatalf("with its control plane: %v", err)
	}
	ip.ctl.Close()
	deadline := time.Now().Add(10 * time.Second)
	for b.Readiness() == nil {
		if time.Now().After(deadline) {
			t.Fatal("still ready 10 s after its control plane stopped (lease 300 ms)")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := b.Readiness(); !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "control plane") {
		t.Fatalf("readiness without its control plane: %v", err)
	}
}

// unjoinedConfig returns the config of a broker whose control plane
// address has nothing listening on it: its Start retries the join until
// its context ends or the broker is closed.
func unjoinedConfig(t *testing.T) Config {
	t.Helper()
	dir := t.TempDir()
	id := cluster.BrokerID(0)
	if err := transport.GenerateDevCerts(filepath.Join(dir, "certs"), "ctl", id); err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctlAddr := pc.LocalAddr().String()
	pc.Close()
	nt, err := cluster.LoadNodeTLS(filepath.Join(dir, "certs"), id)
	if err != nil {
		t.Fatal(err)
	}
	return Config{NodeID: id, Listen: "127.0.0.1:0", DataDir: filepath.Join(dir, id),
		ServerTLS: nt.Server, PeerTLS: nt.Peer, CtlTLS: nt.Ctl, CtlAddr: ctlAddr,
		LeaseTTL: time.Second, Logger: quiet()}
}

// TestCloseDuringStartStopsIt: Close while Start waits for an unreachable
// control plane ends the join, waits for Start (which returns
// ErrClosed) and leaves nothing running. It used to return at once,
// leaving Start to join later, open logs in a directory whose lock was
// released, and leave the membership's goroutines running.
func TestCloseDuringStartStopsIt(t *testing.T) {
	before := goleak.IgnoreCurrent()
	b, err := New(unjoinedConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		started <- b.Start(ctx)
	}()
	time.Sleep(500 * time.Millisecond) // Start is in ctlclient.Join, retrying
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return while Start was joining")
	}
	select {
	case err := <-started:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("Start closed while joining: %v, want ErrClosed", err)
		}
	default:
		t.Error("Close returned while Start still runs")
		<-started
	}
	if err := goleak.Find(before); err != nil {
		t.Errorf("still running after Close returned:\n%v", err)
	}
}

// TestCloseAfterFailedStart: Start fails (its context ends before the
// control plane answers); Close then returns nil and leaves nothing
// running, as servercmd expects.
func TestCloseAfterFailedStart(t *testing.T) {
	before := goleak.IgnoreCurrent()
	b, err := New(unjoinedConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := b.Start(ctx); err == nil || errors.Is(err, ErrClosed) {
		t.Fatalf("Start without a control plane: %v, want a join error", err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("Close after a failed Start: %v", err)
	}
	if err := goleak.Find(before); err != nil {
		t.Errorf("still running after Close returned:\n%v", err)
	}
}

// TestFailedNewUnregistersMetrics: New failing after it registered the
// broker's metrics callback (here its shard directory cannot be made)
// unregisters it, so a supervisor retrying New does not pile failed
// brokers onto its MeterProvider.
func TestFailedNewUnregistersMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	cfg := unjoinedConfig(t)
	cfg.MeterProvider = mp
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg.DataDir, "streams"), []byte("not a dir"), 0o640); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := New(cfg); err == nil {
			t.Fatalf("attempt %d: New succeeded with a file for its shard directory", i)
		}
	}
	var names []string
	eachMetric(t, reader, func(m metricdata.Metrics) { names = append(names, m.Name) })
	if len(names) > 0 {
		t.Errorf("after New failed 3 times, the provider still observes the failed brokers: %v", names)
	}
}
