package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/internal/quictest"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// Each test here makes one client ("mallory") go past one resource limit
// and checks that it gets the typed error (or is held back, for the limits
// that stop reading), that what the broker holds stays within the bound,
// and that a well-behaved client (the admin principal) keeps publishing.

// startLimited starts brokers with tweak applied, an "orders" stream, and
// grants mallory publish and subscribe on it.
func startLimited(t *testing.T, n int, tweak func(*Config)) *inproc {
	t.Helper()
	ip := startInprocWith(t, func(c *Config) {
		c.Logger = quiet()
		tweak(c)
	}, n, shardmap.StreamConfig{Name: "orders", Shards: 1})
	for _, a := range []auth.Action{auth.Publish, auth.Subscribe} {
		if err := ip.ctl.Grant(auth.Grant{Principal: "mallory", Action: a, Pattern: "orders"}); err != nil {
			t.Fatal(err)
		}
	}
	ip.waitEpoch(ip.ctl.Map().Epoch)
	return ip
}

// wellBehaved publishes one record as the admin principal through b on a
// fresh connection and fails the test unless it is acked.
func wellBehaved(t *testing.T, ip *inproc, b *Broker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := publishOnce(ctx, ip.dial(b)); err != nil {
		t.Fatalf("a well-behaved publisher failed: %v", err)
	}
}

// wantLimitClose expects conn to have been closed with limit_exceeded.
func wantLimitClose(t *testing.T, conn *quic.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	err := publishOnce(ctx, conn)
	var ae *quic.ApplicationError
	if !errors.As(err, &ae) || ae.ErrorCode != quic.ApplicationErrorCode(transport.CodeLimitExceeded) {
		t.Fatalf("connection over the limit: %v, want closed with limit_exceeded", err)
	}
}

// waitUntil polls cond for up to waitFor.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestConnectionLimits(t *testing.T) {
	ip := startLimited(t, 2, func(c *Config) { c.MaxConns, c.MaxConnsPerPrincipal = 3, 2 })
	owner, other := ip.owner("orders", 0), ip.nonOwner("orders", 0)

	// Per principal: the third connection of mallory is closed.
	m1, m2 := ip.dialAs(owner, "mallory"), ip.dialAs(owner, "mallory")
	for _, c := range []*quic.Conn{m1, m2} {
		if err := publishOnce(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	wantLimitClose(t, ip.dialAs(owner, "mallory"))

	// In total: a third principal fills the broker; the next one is refused.
	admin := ip.dial(owner)
	if err := publishOnce(context.Background(), admin); err != nil {
		t.Fatal(err)
	}
	wantLimitClose(t, ip.dialAs(owner, "carol"))

	// Peers are not clients: a publish forwarded to the full owner works.
	wellBehaved(t, ip, other)

	// A connection that closes gives its place back.
	m1.CloseWithError(0, "")
	waitUntil(t, "mallory's connection to be released", func() bool {
		c := ip.dialAs(owner, "mallory")
		defer c.CloseWithError(0, "")
		return publishOnce(context.Background(), c) == nil
	})
}

func TestStreamsPerConnection(t *testing.T) {
	ip := startLimited(t, 1, func(c *Config) { c.MaxStreamsPerConn = 4 })
	b := ip.brokers[0]
	conn := ip.dialAs(b, "mallory")
	var open []*wireStream
	for i := range 4 {
		ws := openStream(t, conn)
		ws.send(publish(uint64(i), "orders", "x"))
		wantAck(t, ws.recv(), uint64(i))
		open = append(open, ws)
	}
	extra := openStream(t, conn)
	extra.send(publish(9, "orders", "x"))
	wantError(t, extra.recv(), transport.ErrLimitExceeded)
	extra.recvEnd()
	wellBehaved(t, ip, b)

	// A stream that ends gives its place back.
	open[0].s.Close()
	open[0].recvEnd()
	waitUntil(t, "the closed stream to be released", func() bool {
		ws := openStream(t, conn)
		ws.send(publish(10, "orders", "x"))
		_, ok := ws.recv().(*transport.Ack)
		ws.s.Close()
		return ok
	})
}

func TestFirstFrameTimeout(t *testing.T) {
	ip := startLimited(t, 1, func(c *Config) { c.FirstFrameTimeout = 300 * time.Millisecond })
	b := ip.brokers[0]
	conn := ip.dialAs(b, "mallory")
	// Half a frame header: the broker waits for the rest, up to the
	// timeout.
	idle := openStream(t, conn)
	if _, err := idle.s.Write([]byte{0, 0}); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	wantError(t, idle.recv(), transport.ErrTimeout)
	idle.recvEnd()
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("idle stream closed after %v", took)
	}
	// A stream that sends its first frame is not cut off later.
	ws := openStream(t, conn)
	ws.send(publish(1, "orders", "x"))
	wantAck(t, ws.recv(), 1)
	time.Sleep(500 * time.Millisecond)
	ws.send(publish(2, "orders", "y"))
	wantAck(t, ws.recv(), 2)
	wellBehaved(t, ip, b)
}

func TestSubscriptionsAndCredit(t *testing.T) {
	ip := startLimited(t, 1, func(c *Config) { c.MaxSubsPerConn, c.MaxCredit = 2, 100 })
	b := ip.brokers[0]
	conn := ip.dialAs(b, "mallory")

	// Credit over the bound, at subscribe or later.
	sub := openStream(t, conn)
	sub.send(&transport.Subscribe{Stream: "orders", Credit: 101})
	wantError(t, sub.recv(), transport.ErrLimitExceeded)
	sub.recvEnd()
	sub = openStream(t, conn)
	sub.send(&transport.Subscribe{Stream: "orders", Start: transport.StartLatest, Credit: 60})
	sub.send(&transport.Credit{Records: 41})
	wantError(t, sub.recv(), transport.ErrLimitExceeded)
	sub.recvEnd()
	// A frame a subscription does not carry (here one a broker sends, of
	// many small records: decoded, many times its size) is refused
	// undecoded, and ends the subscription; it was decoded and ignored.
	sub = openStream(t, conn)
	sub.send(&transport.Subscribe{Stream: "orders", Start: transport.StartLatest, Credit: 10})
	sub.send(&transport.Records{Stream: "orders", Records: make([]transport.Record, 10_000)})
	wantError(t, sub.recv(), transport.ErrUnexpectedFrame)
	sub.recvEnd()

	// Subscriptions per connection.
	var subs []*wireStream
	for range 2 {
		s := openStream(t, conn)
		s.send(&transport.Subscribe{Stream: "orders", Start: transport.StartEarliest, Credit: 100})
		subs = append(subs, s)
	}
	// Both are live: a record reaches them (the log was empty).
	wellBehaved(t, ip, b)
	for _, s := range subs {
		if recs, ok := s.recv().(*transport.Records); !ok || len(recs.Records) != 1 {
			t.Fatalf("subscription got %+v", recs)
		}
	}
	third := openStream(t, conn)
	third.send(&transport.Subscribe{Stream: "orders", Credit: 10})
	wantError(t, third.recv(), transport.ErrLimitExceeded)
	third.recvEnd()
	wellBehaved(t, ip, b)
}

// TestSubscriptionBytes: many subscriptions of large records that never
// read hold at most their principal's budget of records, and another
// principal's subscriber gets everything.
func TestSubscriptionBytes(t *testing.T) {
	const (
		record = 100 << 10
		perSub = 64 << 10
		budget = 256 << 10
	)
	ip := startLimited(t, 1, func(c *Config) {
		c.MaxPayload, c.SubscriptionBytes, c.SubscriptionBytesPerPrincipal = 128<<10, perSub, budget
	})
	b := ip.brokers[0]
	pub := openStream(t, ip.dial(b))
	for i := range 60 {
		pub.send(&transport.Publish{Seq: uint64(i), Stream: "orders", Shard: 0, Value: make([]byte, record)})
		wantAck(t, pub.recv(), uint64(i))
	}

	conn := ip.dialAs(b, "mallory")
	for range 20 {
		s := openStream(t, conn)
		s.send(&transport.Subscribe{Stream: "orders", Credit: 1000})
	}
	use := func() *principalUse {
		b.limits.mu.Lock()
		defer b.limits.mu.Unlock()
		return b.limits.mu.principals["mallory"]
	}
	waitUntil(t, "mallory's subscriptions to hold records", func() bool {
		u := use()
		return u != nil && u.sub.inUse() > 0
	})
	for range 50 {
		if n := use().sub.inUse(); n > budget {
			t.Fatalf("mallory's subscriptions hold %d bytes, budget %d", n, budget)
		}
		time.Sleep(5 * time.Millisecond)
	}

	// The admin principal is not held back.
	sub := openStream(t, ip.dial(b))
	sub.send(&transport.Subscribe{Stream: "orders", Credit: 1000})
	got := 0
	for got < 60 {
		got += len(sub.recv().(*transport.Records).Records)
	}
	pub.send(&transport.Publish{Seq: 100, Stream: "orders", Shard: 0, Value: []byte("after")})
	wantAck(t, pub.recv(), 100)
}

// floodUnread publishes n records of size bytes on a stream of a
// connection whose receive window is tiny, never reading the acks. It
// returns the stream; the writes go on in the background until the broker
// stops reading or the stream is closed.
func floodUnread(t *testing.T, ip *inproc, b *Broker, n, size int) (*wireStream, *sync.WaitGroup) {
	t.Helper()
	conn := ip.dialAsWith(b, "mallory", transport.Config{InitialStreamWindow: 2 << 10, MaxStreamWindow: 2 << 10})
	ws := openStream(t, conn)
	var wg sync.WaitGroup
	wg.Go(func() {
		w := transport.NewWriter(ws.s)
		for i := range n {
			if w.Write(&transport.Publish{Seq: uint64(i), Stream: "orders", Shard: 0, Value: make([]byte, size)}) != nil {
				return
			}
		}
	})
	return ws, &wg
}

// heldLog is a log handler that notes the limits the broker logs as
// reached by a client (limits.hit), so that a test can wait until a limit
// holds a publisher back before it judges what the broker took in.
type heldLog struct {
	mu      sync.Mutex
	reached map[string]bool
}

func newHeldLog() *heldLog { return &heldLog{reached: map[string]bool{}} }

func (h *heldLog) Enabled(context.Context, slog.Level) bool { return true }

func (h *heldLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "limit" {
			h.mu.Lock()
			h.reached[a.Value.String()] = true
			h.mu.Unlock()
		}
		return true
	})
	return nil
}

func (h *heldLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *heldLog) WithGroup(string) slog.Handler      { return h }

// waitHeld waits until the broker has logged limit as reached.
func (h *heldLog) waitHeld(t *testing.T, limit string) {
	t.Helper()
	waitUntil(t, "the "+limit+" limit to hold the publisher back", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.reached[limit]
	})
}

// settled waits until f stops changing and returns its last value. Call
// it once the limit under test holds the publisher back: before that, a
// pause of the broker (an fsync, a loaded machine) looks settled too.
func settled(f func() uint64) uint64 {
	last := f()
	for {
		time.Sleep(200 * time.Millisecond)
		if v := f(); v != last {
			last = v
			continue
		}
		return last
	}
}

// TestAckBacklog: a publisher that never reads its acks is stopped after
// PublishInFlight unwritten answers; once it reads, every record is
// answered.
func TestAckBacklog(t *testing.T) {
	const inFlight, n = 64, 5000
	held := newHeldLog()
	ip := startLimited(t, 1, func(c *Config) { c.PublishInFlight, c.Logger = inFlight, slog.New(held) })
	b := ip.brokers[0]
	ws, wg := floodUnread(t, ip, b, n, 100)
	log := ip.logOf(b, "orders", 0)
	held.waitHeld(t, limitPublishInFlight)
	taken := settled(log.NextOffset)
	// What fits the publisher's 2 KiB window, plus the slots.
	if taken > 2<<10/20+inFlight {
		t.Fatalf("the broker took in %d records from a publisher that reads no acks", taken)
	}
	b.mu.Lock()
	for p := range b.mu.pubs {
		if got := p.acks.backlogged(); got > inFlight*100 {
			t.Errorf("ack backlog of %d bytes", got)
		}
		if len(p.slots) > inFlight {
			t.Errorf("%d slots taken", len(p.slots))
		}
	}
	b.mu.Unlock()
	wellBehaved(t, ip, b)

	// Reading the acks lets everything through.
	for i := range n {
		wantAck(t, ws.recv(), uint64(i))
	}
	wg.Wait()
}

// TestPublishBytesPerPrincipal: the records in flight and unwritten
// answers of a principal's publishers stay within its budget.
func TestPublishBytesPerPrincipal(t *testing.T) {
	const budget, size, n = 64 << 10, 4 << 10, 500
	held := newHeldLog()
	ip := startLimited(t, 1, func(c *Config) {
		c.PublishBytesPerPrincipal, c.MaxPayload, c.Logger = budget, 8<<10, slog.New(held)
	})
	b := ip.brokers[0]
	ws, wg := floodUnread(t, ip, b, n, size)
	log := ip.logOf(b, "orders", 0)
	held.waitHeld(t, limitPublishBytes)
	taken := settled(log.NextOffset)
	if taken >= n/2 {
		t.Fatalf("the broker took in %d records", taken)
	}
	b.limits.mu.Lock()
	u := b.limits.mu.principals["mallory"]
	b.limits.mu.Unlock()
	if got := u.publish.inUse(); got > budget || got == 0 {
		t.Fatalf("mallory's publishers hold %d bytes, budget %d", got, budget)
	}
	wellBehaved(t, ip, b)
	for i := range n {
		wantAck(t, ws.recv(), uint64(i))
	}
	wg.Wait()
	waitUntil(t, "the budget to be given back", func() bool { return u.publish.inUse() == 0 })
}

func TestHeaderLimits(t *testing.T) {
	ip := startLimited(t, 1, func(c *Config) {})
	b := ip.brokers[0]
	ws := openStream(t, ip.dialAs(b, "mallory"))
	headers := func(n, size int) map[string]string {
		h := make(map[string]string, n)
		for i := range n {
			h[fmt.Sprintf("h%06d", i)] = strings.Repeat("v", size)
		}
		return h
	}
	cases := []struct {
		headers map[string]string
		want    error
	}{
		{headers(DefaultMaxHeaders+1, 0), transport.ErrInvalid},
		{headers(4, DefaultMaxHeaderBytes/4), transport.ErrPayloadTooLarge},
		// 200,000 headers: a frame over the size limit, skipped unread.
		{headers(200000, 0), transport.ErrPayloadTooLarge},
		{headers(DefaultMaxHeaders, 10), nil},
	}
	for i, tc := range cases {
		ws.send(&transport.Publish{Seq: uint64(i), Stream: "orders", Shard: 0, Headers: tc.headers, Value: []byte("x")})
		if tc.want == nil {
			wantAck(t, ws.recv(), uint64(i))
			continue
		}
		if e := wantError(t, ws.recv(), tc.want); e.Seq != uint64(i) {
			t.Fatalf("error for seq %d, want %d", e.Seq, i)
		}
	}
	if next := ip.logOf(b, "orders", 0).NextOffset(); next != 1 {
		t.Fatalf("%d records written, want only the good one", next)
	}
	wellBehaved(t, ip, b)
}

// TestOneRecordSizeLimit: a record over MaxPayload gets payload_too_large
// whatever its frame's size, also in a stream's first frame; the stream
// goes on, except after a frame far over the limit, which closes it with
// the same code.
func TestOneRecordSizeLimit(t *testing.T) {
	const limit = 64 << 10
	ip := startLimited(t, 1, func(c *Config) { c.MaxPayload = limit })
	b := ip.brokers[0]
	if want := transport.PublishFrameLimit(limit, DefaultMaxHeaders); b.cfg.Transport.MaxFrame != want {
		t.Fatalf("frame limit %d, want %d derived from the record limit", b.cfg.Transport.MaxFrame, want)
	}
	ws := openStream(t, ip.dialAs(b, "mallory"))
	ws.send(publish(1, "orders", "first"))
	wantAck(t, ws.recv(), 1)
	for i, size := range []int{limit + 1, limit + 2<<10, 2 * limit, 3 * limit} {
		seq := uint64(10 + i)
		ws.send(&transport.Publish{Seq: seq, Stream: "orders", Shard: 0, Value: make([]byte, size)})
		if e := wantError(t, ws.recv(), transport.ErrPayloadTooLarge); e.Seq != seq {
			t.Fatalf("%d bytes: error for seq %d, want %d", size, e.Seq, seq)
		}
		ws.send(publish(seq, "orders", "fits"))
		wantAck(t, ws.recv(), seq)
	}
	// A producer id counts toward the record.
	ws.send(&transport.Publish{Seq: 20, Stream: "orders", Shard: 0, Value: make([]byte, limit-10), ProducerID: strings.Repeat("p", 11)})
	wantError(t, ws.recv(), transport.ErrPayloadTooLarge)

	// The first frame of a stream too: the stream is a publisher's, and
	// goes on (it was answered and closed, as a bad first frame is).
	first := openStream(t, ip.dialAs(b, "mallory"))
	first.send(&transport.Publish{Seq: 30, Stream: "orders", Shard: 0, Value: make([]byte, 2*limit)})
	first.send(publish(31, "orders", "after"))
	if e := wantError(t, first.recv(), transport.ErrPayloadTooLarge); e.Seq != 30 || !strings.Contains(e.Message, strconv.Itoa(limit)) {
		t.Fatalf("the first frame, over the limit: %+v, want payload_too_large for seq 30 naming the limit", e)
	}
	wantAck(t, first.recv(), 31)

	// Far over: refused at once, the stream closed, with the same code.
	hdr := append(binary.BigEndian.AppendUint32(nil, uint32(8*b.cfg.Transport.MaxFrame)), byte(transport.FramePublish))
	if _, err := ws.s.Write(hdr); err != nil {
		t.Fatal(err)
	}
	wantError(t, ws.recv(), transport.ErrPayloadTooLarge)
	ws.recvEnd()
	wellBehaved(t, ip, b)
}

// dialAsWith is dialAs with a transport config of the client's own.
func (ip *inproc) dialAsWith(b *Broker, name string, cfg transport.Config) *quic.Conn {
	ip.t.Helper()
	return ip.dialAddrAs(b.Addr().String(), name, cfg)
}

// dialAddrAs opens a client connection to the broker at addr as principal
// name.
func (ip *inproc) dialAddrAs(addr, name string, cfg transport.Config) *quic.Conn {
	t := ip.t
	t.Helper()
	ca, err := transport.LoadCA(filepath.Join(ip.dir, "certs", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	cert := ip.clientCert(name)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	conn, err := transport.Dial(ctx, addr, transport.ClientTLS(ca, &cert, "", transport.ALPNClient), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.CloseWithError(0, "") })
	return conn
}

// Subscriptions that grant credit over the bound after subscribing are
// each ended with limit_exceeded for their credit, one after the other on
// one connection allowed a single subscription: the grant is judged with
// the credit the writer holds at that moment (it used to be judged
// without it, and the subscription went on: TestSubscriptionsAndCredit
// failed so under -race), and the ended subscription's slot is free for
// the next.
func TestSubscriptionSlotFreeWhenItEnds(t *testing.T) {
	ip := startLimited(t, 1, func(c *Config) { c.MaxSubsPerConn, c.MaxCredit = 1, 100 })
	conn := ip.dialAs(ip.brokers[0], "mallory")
	for i := range 300 {
		// Ended by the broker for credit granted later over the bound.
		sub := openStream(t, conn)
		sub.send(&transport.Subscribe{Stream: "orders", Start: transport.StartLatest, Credit: 60})
		sub.send(&transport.Credit{Records: 41})
		e := wantError(t, sub.recv(), transport.ErrLimitExceeded)
		if !strings.Contains(e.Message, "MaxCredit") {
			t.Fatalf("subscription %d refused for %q, want its credit", i, e.Message)
		}
		sub.recvEnd()
	}
}

// TestHalfSentFramesHeldBack: frames a client starts and never finishes,
// on every stream it may open, are charged to its publish budget as they
// are buffered; past it the streams are not read (QUIC's flow control
// holds the client back), so the broker holds the budget and the
// connection's window, not a buffer of MaxFrame per stream. Each once held
// a MiB outside every budget, with no time limit.
func TestHalfSentFramesHeldBack(t *testing.T) {
	ip := startLimited(t, 1, func(c *Config) { c.PublishBytesPerPrincipal = 1 }) // floored at a record's size
	b := ip.brokers[0]
	maxFrame := b.cfg.Transport.MaxFrame
	conn := ip.dialAs(b, "mallory")
	before := heapInUse()
	const streams = 100
	hdr := binary.BigEndian.AppendUint32(nil, uint32(maxFrame))
	hdr = append(hdr, byte(transport.FramePublish))
	junk := make([]byte, maxFrame-64) // never the last bytes
	var wg sync.WaitGroup
	for i := range streams {
		ws := openStream(t, conn)
		if i%2 == 0 {
			ws.send(publish(1, "orders", "x"))
		} else {
			ws.send(&transport.Subscribe{Stream: "orders", Start: transport.StartLatest, Credit: 1})
		}
		wg.Go(func() {
			ws.s.SetWriteDeadline(time.Now().Add(2 * time.Second)) // flow control stops it
			ws.s.Write(hdr)
			ws.s.Write(junk)
		})
	}
	wg.Wait()
	b.limits.mu.Lock()
	u := b.limits.mu.principals["mallory"]
	b.limits.mu.Unlock()
	if got, most := u.publish.inUse(), int64(maxFrame)+int64(b.cfg.PublishBytesPerPrincipal); got > most {
		t.Fatalf("mallory's half-sent frames hold %d bytes of its budget, more than one frame and the budget (%d)", got, most)
	}
	if held := int64(heapInUse()) - int64(before); held > 48<<20 {
		t.Fatalf("%d half-sent frames of %d bytes: the broker's heap grew by %d MiB", streams, maxFrame, held>>20)
	}
	wellBehaved(t, ip, b)
}

// heapInUse returns the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestHandshakesInFlightBounded: clients that never finish the TLS
// handshake (they never send their certificate) make the broker hold at
// most Transport.MaxHandshakes connections in their handshake; the rest
// are refused. The clients share one real UDP socket, so they pass the
// Retry the broker asks for past Transport.RetryHandshakes (a spoofed
// source would not): the cap is what bounds them. Without it every
// client's first packet made a server connection (two goroutines and
// TLS state) for up to twice HandshakeTimeout: 2000 such dials left 329
// in their handshake, as many as the dialing side could start.
func TestHandshakesInFlightBounded(t *testing.T) {
	const maxHS = 64
	ip := startInprocWith(t, func(c *Config) { c.Transport.MaxHandshakes = maxHS }, 1)
	ca, err := transport.LoadCA(filepath.Join(ip.dir, "certs", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	const attempts = 2000
	conf := transport.ClientTLS(ca, nil, "localhost", transport.ALPNClient)
	held, err := quictest.HeldHandshakes(ip.brokers[0].Addr().(*net.UDPAddr), conf, transport.Config{}.QUIC(), attempts, maxHS)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("server connections in handshake after %d never-finished dials: %d (MaxHandshakes %d)", attempts, held, maxHS)
	if held > maxHS {
		t.Errorf("the broker holds %d unfinished handshakes from one unauthenticated source; Transport.MaxHandshakes is %d", held, maxHS)
	}
}

// paddedPublish is a record of two bytes and one small header whose frame
// a client pads with pad bytes the broker ignores (Via is a forwarding
// broker's; a client's is cleared).
func paddedPublish(seq uint64, pad string) *transport.Publish {
	return &transport.Publish{Seq: seq, Stream: "orders", Shard: -1, Key: []byte("k"), Value: []byte("v"),
		Headers: map[string]string{"h": "x"}, Via: pad}
}

// TestPaddedFramesCharged: a record is charged against its principal's
// publish budget by its frame, not by its fields: the decoded record's
// fields alias one copy of the whole frame, which a client can pad for
// free. With the lane to the owner held dialing, padded records of two
// bytes were all taken in under a 2 MiB budget (128 of them: 64 KiB
// charged, the heap 112 MiB larger).
func TestPaddedFramesCharged(t *testing.T) {
	release := make(chan struct{})
	ip := startInprocWith(t, func(c *Config) {
		c.PublishBytesPerPrincipal = 2 << 20
		c.Knobs.DialPeer = func(ctx context.Context, node string) error {
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}, 2, shardmap.StreamConfig{Name: "orders", Shards: 1})
	defer close(release)
	fwd := ip.nonOwner("orders", 0)
	const n, padding = 16, 900 << 10
	pad := strings.Repeat("x", padding)
	before := heapInUse()
	conn := ip.dial(fwd)
	ws := openStream(t, conn)
	var wg sync.WaitGroup
	wg.Go(func() {
		ws.s.SetWriteDeadline(time.Now().Add(2 * time.Second)) // the budget stops it
		for i := uint64(1); i <= n; i++ {
			if err := ws.w.Write(paddedPublish(i, pad)); err != nil {
				return
			}
		}
	})
	wg.Wait()
	pad = ""
	var charged int64
	fwd.limits.mu.Lock()
	for _, u := range fwd.limits.mu.principals {
		charged += u.publish.inUse()
	}
	fwd.limits.mu.Unlock()
	grew := int64(heapInUse()) - int64(before)
	if charged < padding {
		t.Fatalf("records in flight are charged %d bytes, less than one frame (%d)", charged, padding)
	}
	if grew > 12<<20 {
		t.Fatalf("%d padded records (charged %d KiB of a 2 MiB budget) made the broker's heap grow by %d MiB", n, charged>>10, grew>>20)
	}
	conn.CloseWithError(0, "done")
}

// TestPaddedFramesLeaveTheTail: the shard's in-memory tail keeps a
// record's header map, whose strings alias the whole decoded frame: a
// padded frame's headers get their own copy, so that acked records of
// two bytes do not keep their frames alive (64 of them once kept 55 MiB,
// after their stream and connection were closed).
func TestPaddedFramesLeaveTheTail(t *testing.T) {
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	b := ip.brokers[0]
	conn := ip.dial(b)
	ws := openStream(t, conn)
	ws.send(paddedPublish(1, ""))
	wantAck(t, ws.recv(), 1)
	before := heapInUse()
	const n = 64
	pad := strings.Repeat("x", 900<<10)
	for i := uint64(2); i < n+2; i++ {
		ws.send(paddedPublish(i, pad))
		wantAck(t, ws.recv(), i)
	}
	ws.s.Close()
	conn.CloseWithError(0, "done")
	pad = ""
	if grew := int64(heapInUse()) - int64(before); grew > 16<<20 {
		t.Fatalf("%d acked records of two bytes, their connection closed, keep %d MiB of the broker's heap", n, grew>>20)
	}
}
