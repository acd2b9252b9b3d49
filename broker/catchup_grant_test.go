package broker

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// udpRelay forwards one client's datagrams to target and back; paused, it
// drops them (QUIC retransmits once it resumes).
type udpRelay struct {
	ln, up *net.UDPConn
	client atomic.Pointer[net.UDPAddr]
	paused atomic.Bool
	wg     sync.WaitGroup
}

func newUDPRelay(t testing.TB, target string) *udpRelay {
	ta, err := net.ResolveUDPAddr("udp", target)
	if err != nil {
		t.Fatal(err)
	}
	r := &udpRelay{}
	if r.ln, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
		t.Fatal(err)
	}
	if r.up, err = net.DialUDP("udp", nil, ta); err != nil {
		t.Fatal(err)
	}
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		buf := make([]byte, 65536)
		for {
			n, from, err := r.ln.ReadFromUDP(buf)
			if err != nil {
				return
			}
			r.client.Store(from)
			if !r.paused.Load() {
				r.up.Write(buf[:n])
			}
		}
	}()
	go func() {
		defer r.wg.Done()
		buf := make([]byte, 65536)
		for {
			n, err := r.up.Read(buf)
			if err != nil {
				return
			}
			if c := r.client.Load(); c != nil && !r.paused.Load() {
				r.ln.WriteToUDP(buf[:n], c)
			}
		}
	}()
	return r
}

func (r *udpRelay) close() { r.ln.Close(); r.up.Close(); r.wg.Wait() }

// startRelayed starts one broker whose link to the control plane goes
// through a udpRelay (pause it and the broker's map lags the control
// plane's), with ForwardTimeout ft (0: the default). Both are closed
// when the test ends.
func startRelayed(t *testing.T, ft time.Duration) (*inproc, *udpRelay) {
	t.Helper()
	var relay *udpRelay
	ip := startInprocWith(t, func(c *Config) {
		if ft > 0 {
			c.ForwardTimeout = ft
		}
		relay = newUDPRelay(t, c.CtlAddr)
		c.CtlAddr = relay.ln.LocalAddr().String()
	}, 1)
	t.Cleanup(func() {
		ip.close()
		relay.close()
	})
	return ip, relay
}

// TestGrantInANewerMapServesEveryShard: a principal granted a
// subscription in a map newer than the broker's subscribes to two shards
// of a new stream at once (as the SDK does, one Subscribe per shard).
// Both must be served once the newer map comes, though they share one
// catch-up (clientCatchUp). a2c823a let one wait and refused the other
// unauthorized, which the SDK does not retry.
func TestGrantInANewerMapServesEveryShard(t *testing.T) {
	ip, relay := startRelayed(t, 0)
	b := ip.brokers[0]
	alice := ip.dialAs(b, "alice")
	admin := openStream(t, ip.dial(b))

	relay.paused.Store(true) // the broker's map lags the control plane
	if err := ip.ctl.CreateStream(shardmap.StreamConfig{Name: "fresh", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	if err := ip.ctl.Grant(auth.Grant{Principal: "alice", Action: auth.Subscribe, Pattern: "fresh"}); err != nil {
		t.Fatal(err)
	}
	st, _ := ip.ctl.Map().Stream("fresh")
	if b.Map().Epoch >= st.Created {
		t.Fatalf("broker not lagging")
	}
	subs := make([]*wireStream, 2)
	for i := range subs {
		subs[i] = openStream(t, alice)
		subs[i].send(&transport.Subscribe{Stream: "fresh", Shard: int32(i), Start: transport.StartEarliest, Credit: 8,
			Created: st.Created, Epoch: ip.ctl.Map().Epoch})
	}
	time.Sleep(300 * time.Millisecond)
	relay.paused.Store(false)
	ip.waitEpoch(ip.ctl.Map().Epoch)
	for i := range subs {
		wantAck(t, publishShard(admin, uint64(i+1), "fresh", i, "x"), uint64(i+1))
	}
	for i, s := range subs {
		if f := s.recv(); f.Type() != transport.FrameRecords {
			t.Errorf("shard %d: subscription of a granted principal answered %T %+v; want a record", i, f, f)
		}
	}
}

// TestGrantNewerThanTheBrokersMapServes: a principal granted a
// subscription to a stream the broker already knows, in a map the broker
// does not hold yet, names that map (Subscribe.Epoch, the SDK's map): the
// broker catches up to it before it judges, and serves the subscription.
// Judged by the stream's incarnation alone (Created, older than the
// broker's map), it was refused unauthorized at once, and the SDK does
// not retry that; so was one naming the incarnation of a stream created
// just before the grant whenever the broker's map stopped at the
// creation's epoch for a moment (TestGrantInANewerMapServesEveryShard
// failed so under load).
func TestGrantNewerThanTheBrokersMapServes(t *testing.T) {
	ip, relay := startRelayed(t, 0)
	b := ip.brokers[0]
	if err := ip.ctl.CreateStream(shardmap.StreamConfig{Name: "known", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	ip.waitEpoch(ip.ctl.Map().Epoch)
	st, _ := ip.ctl.Map().Stream("known")
	alice := ip.dialAs(b, "alice")
	admin := openStream(t, ip.dial(b))

	relay.paused.Store(true) // the grant does not reach the broker
	if err := ip.ctl.Grant(auth.Grant{Principal: "alice", Action: auth.Subscribe, Pattern: "known"}); err != nil {
		t.Fatal(err)
	}
	granted := ip.ctl.Map().Epoch
	sub := openStream(t, alice)
	sub.send(&transport.Subscribe{Stream: "known", Start: transport.StartEarliest, Credit: 8, Created: st.Created, Epoch: granted})
	time.Sleep(300 * time.Millisecond)
	relay.paused.Store(false)
	ip.waitEpoch(granted)
	wantAck(t, publishShard(admin, 1, "known", 0, "x"), 1)
	if f := sub.recv(); f.Type() != transport.FrameRecords {
		t.Fatalf("subscription of a principal granted in the map it named answered %T %+v; want a record", f, f)
	}
}

// TestSubscriptionJudgedByTheMapItIsServedBy: mallory may subscribe to
// orders* in the broker's map (epoch E). The
// control plane revokes that (E+1) and creates orders.x (E+2), which
// mallory names (Created E+2) at the broker while it still holds E. It
// must be refused: the map the broker catches up to, and serves the
// subscription by, has no grant for mallory.
func TestSubscriptionJudgedByTheMapItIsServedBy(t *testing.T) {
	ip, relay := startRelayed(t, 0)
	b := ip.brokers[0]
	g := auth.Grant{Principal: "mallory", Action: auth.Subscribe, Pattern: "orders*"}
	if err := ip.ctl.Grant(g); err != nil {
		t.Fatal(err)
	}
	ip.waitEpoch(ip.ctl.Map().Epoch)
	mallory := ip.dialAs(b, "mallory")
	admin := openStream(t, ip.dial(b))

	relay.paused.Store(true)
	if err := ip.ctl.Revoke(g); err != nil {
		t.Fatal(err)
	}
	if err := ip.ctl.CreateStream(shardmap.StreamConfig{Name: "orders.x", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	st, _ := ip.ctl.Map().Stream("orders.x")
	sub := openStream(t, mallory)
	sub.send(&transport.Subscribe{Stream: "orders.x", Shard: 0, Start: transport.StartEarliest, Credit: 8, Created: st.Created})
	time.Sleep(300 * time.Millisecond)
	relay.paused.Store(false)
	ip.waitEpoch(ip.ctl.Map().Epoch)
	wantAck(t, publishShard(admin, 1, "orders.x", 0, "secret"), 1)
	if f := sub.recv(); f.Type() != transport.FrameError {
		t.Errorf("a subscription whose grant the caught-up map revoked was served: %T %+v", f, f)
	}
}

// TestBogusCreatedLeavesRealCatchUpsAlone: one subscription naming an
// incarnation no map will hold (any authorized client can send it) must
// not leave a miss that, for ForwardTimeout, fails at once a record
// naming the next real epoch, which the control plane has and the broker
// is about to get (a2c823a's wider miss did).
func TestBogusCreatedLeavesRealCatchUpsAlone(t *testing.T) {
	const ft = 2 * time.Second
	ip, relay := startRelayed(t, ft)
	b := ip.brokers[0]
	if err := ip.ctl.CreateStream(shardmap.StreamConfig{Name: "orders", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	ip.waitEpoch(ip.ctl.Map().Epoch)
	bogus := openStream(t, ip.dial(b))
	bogus.send(&transport.Subscribe{Stream: "orders", Shard: 0, Credit: 1, Created: 1 << 60})
	bogus.recv() // after ForwardTimeout: refused
	relay.paused.Store(true)
	if err := ip.ctl.CreateStream(shardmap.StreamConfig{Name: "fresh", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	st, _ := ip.ctl.Map().Stream("fresh")
	go func() { time.Sleep(200 * time.Millisecond); relay.paused.Store(false) }()
	ws := openStream(t, ip.dial(b))
	ws.send(&transport.Publish{Seq: 1, Stream: "fresh", Shard: 0, Value: []byte("x"), Created: st.Created})
	wantAck(t, ws.recv(), 1)
}

// TestDeniedSubscribersShareOneCatchUp: subscriptions of a principal with
// no grant, each naming an epoch no map has (Subscribe.Created), all wait
// for one catch-up to the control plane, not one each: the broker once
// asked the control plane for the whole map on behalf of every such
// subscription at once, ForwardTimeout long. Each is still refused.
func TestDeniedSubscribersShareOneCatchUp(t *testing.T) {
	const ft = 2 * time.Second
	ip := startInprocWith(t, func(c *Config) { c.ForwardTimeout = ft }, 1,
		shardmap.StreamConfig{Name: "secret", Shards: 1})
	b := ip.brokers[0]
	nobody := ip.dialAs(b, "nobody") // no grants
	epoch := b.Map().Epoch
	wantOneCatchUp(t, b, ft, "denied subscriptions", func(i int) {
		s := openStream(t, nobody)
		s.send(&transport.Subscribe{Stream: "secret", Start: transport.StartEarliest, Credit: 1, Created: epoch + 1_000_000 - uint64(i)})
		wantError(t, s.recv(), transport.ErrUnauthorized)
	})
}

// wantOneCatchUp runs ask(i) for 8 clients at once, each naming an epoch
// no map holds, and checks that b asked the control plane once for them
// all, within about one ForwardTimeout (ft).
func wantOneCatchUp(t *testing.T, b *Broker, ft time.Duration, what string, ask func(i int)) {
	t.Helper()
	const n = 8
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Go(func() { ask(i) })
	}
	wg.Wait()
	if got := b.missed.waits.Load(); got != 1 {
		t.Errorf("%d concurrent %s started %d catch-ups; want 1", n, what, got)
	}
	if took := time.Since(start); took > 3*ft {
		t.Errorf("%d concurrent %s took %v (ForwardTimeout %v)", n, what, took.Round(time.Millisecond), ft)
	}
}

// TestClientPublishesShareOneCatchUp: records of clients, each naming an
// incarnation no map holds (Publish.Created, kept for a record with a
// shard), all wait for one catch-up to the control plane, not one per
// publisher stream: each stream's reader once ran its own, every one
// asking the control plane for the whole map, thousands of a principal's
// streams at once. Each record fails unavailable, nothing written; and
// the client's miss is not remembered for the peers' forwards.
func TestClientPublishesShareOneCatchUp(t *testing.T) {
	const ft = 2 * time.Second
	ip := startInprocWith(t, func(c *Config) { c.ForwardTimeout = ft }, 1,
		shardmap.StreamConfig{Name: "orders", Shards: 1})
	b := ip.brokers[0]
	conn := ip.dial(b)
	epoch := b.Map().Epoch
	wantOneCatchUp(t, b, ft, "client records naming unknown epochs", func(i int) {
		s := openStream(t, conn)
		p := publish(1, "orders", "x")
		p.Shard, p.Created = 0, epoch+1_000_000-uint64(i)
		s.send(p)
		wantError(t, s.recv(), transport.ErrUnavailable)
	})
	// The clients' miss fails the next such record at once, not after
	// another ForwardTimeout.
	s := openStream(t, conn)
	p := publish(2, "orders", "x")
	p.Shard, p.Created = 0, epoch+2_000_000
	start := time.Now()
	s.send(p)
	wantError(t, s.recv(), transport.ErrUnavailable)
	if took := time.Since(start); took > ft/2 {
		t.Errorf("a client record naming an epoch past the clients' last miss failed after %v; want at once", took.Round(time.Millisecond))
	}
	b.missed.mu.Lock()
	defer b.missed.mu.Unlock()
	if b.missed.err != nil {
		t.Errorf("a client's epoch was remembered as missed (epoch %d): peers' forwards would fail at once", b.missed.epoch)
	}
}
