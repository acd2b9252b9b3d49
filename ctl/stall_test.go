package ctl

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/felix-broker/felix/ctl/ctlclient"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// stallProxy relays UDP between one client and target. While stalled it
// holds the datagrams of both directions and delivers them when the
// stall ends (a link that stops for a moment, or a process paused):
// nothing is lost.
type stallProxy struct {
	pc     net.PacketConn
	target *net.UDPAddr
	up     *net.UDPConn // to target

	mu      sync.Mutex
	client  net.Addr
	stalled bool
	oneWay  bool // stall only target -> client
	held    []func()
	done    chan struct{}
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ta, err := net.ResolveUDPAddr("udp", target)
	if err != nil {
		t.Fatal(err)
	}
	up, err := net.DialUDP("udp", nil, ta)
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{pc: pc, target: ta, up: up, done: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // client -> target
		defer wg.Done()
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			b := append([]byte(nil), buf[:n]...)
			p.mu.Lock()
			p.client = from
			if p.oneWay {
				_, _ = up.Write(b)
			} else {
				p.do(func() { _, _ = up.Write(b) })
			}
			p.mu.Unlock()
		}
	}()
	go func() { // target -> client
		defer wg.Done()
		buf := make([]byte, 65536)
		for {
			n, err := up.Read(buf)
			if err != nil {
				return
			}
			b := append([]byte(nil), buf[:n]...)
			p.mu.Lock()
			to := p.client
			p.do(func() { _, _ = pc.WriteTo(b, to) })
			p.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		pc.Close()
		up.Close()
		wg.Wait()
	})
	return p
}

// do runs send now, or when the stall ends; p.mu is held.
func (p *stallProxy) do(send func()) {
	if p.stalled {
		p.held = append(p.held, send)
		return
	}
	send()
}

func (p *stallProxy) stall(d time.Duration) {
	p.mu.Lock()
	p.stalled = true
	p.mu.Unlock()
	time.Sleep(d)
	p.mu.Lock()
	p.stalled = false
	held := p.held
	p.held = nil
	for _, send := range held {
		send()
	}
	p.mu.Unlock()
}

// TestLinkStallKeepsBrokerLive: a broker with the default lease (3s)
// whose link to a healthy ctl stalls for 1.2s at a time, both ways
// (shorter than the link's QUIC idle timeout, half a lease, and well
// within the lease; nothing is lost, only delayed), is never shown down
// and costs no map epoch. A stall longer than the heartbeat interval's
// margin (LeaseTTL/2 - LeaseTTL/3, 500ms here) may leave the member with
// no answer for half a lease: it cannot tell a stalled link from a stuck
// ctl, so it leaves the registration, ending it as handed over, and
// registers again (here with the same ctl), adopting its lease. The ctl
// it left keeps the lease for that: ending the session as a broker gone
// (deleting live/) showed the node down, then live again.
func TestLinkStallKeepsBrokerLive(t *testing.T) {
	const lease = 3 * time.Second
	p := newPKI(t)
	srv := startCtlLease(t, p, t.TempDir(), "127.0.0.1:0", lease)
	px := newStallProxy(t, srv.Addr())

	m := joinThrough(t, p, px, lease)
	session := func() uint64 {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		if ss := srv.mu.sessions["b0"]; ss != nil {
			return ss.id
		}
		return 0
	}
	waitMap(t, m, "b0 live", func(mp *shardmap.Map) bool { return liveCount(mp) == 1 })
	first := session()
	before := srv.Map().Epoch

	var shownDown bool
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			if liveCount(srv.Map()) != 1 {
				shownDown = true
			}
		}
	}()
	time.Sleep(1500 * time.Millisecond)
	for range 5 {
		px.stall(1200 * time.Millisecond)
		time.Sleep(1100 * time.Millisecond) // the stalls fall at different phases of the heartbeats
	}
	time.Sleep(time.Second)
	close(stop)
	<-watched
	t.Logf("registration session %d -> %d", first, session())
	if after := srv.Map().Epoch; after != before || shownDown {
		t.Fatalf("a healthy ctl behind a link that stalled for 1.2s at a time (lease %v, QUIC idle timeout %v): map epoch %d -> %d, b0 shown down in the ctl's map: %v",
			lease, lease/2, before, after, shownDown)
	}
}

// TestMemberHandOverKeepsBrokerLive: ctl's answers to a broker are
// delayed (here the ctl -> broker direction of the link stalls for 1.2s,
// less than the QUIC idle timeout; the ctl reads every heartbeat and
// renews the lease in time). The member leaves the registration after
// LeaseTTL/2 without an answer and registers again; the ctl, which is
// not stuck, must take that as a hand-over and keep the lease for the
// next registration to adopt. Ending the session as a broker gone
// deleted the live key, and the leader marked the node down, then up
// again when it re-registered: two map epochs pushed to every broker and
// client for a broker that never went away.
func TestMemberHandOverKeepsBrokerLive(t *testing.T) {
	const lease = 3 * time.Second
	p := newPKI(t)
	srv := startCtlLease(t, p, t.TempDir(), "127.0.0.1:0", lease)
	px := newStallProxy(t, srv.Addr())
	px.mu.Lock()
	px.oneWay = true
	px.mu.Unlock()

	m := joinThrough(t, p, px, lease)
	waitMap(t, m, "b0 live", func(mp *shardmap.Map) bool { return liveCount(mp) == 1 })
	time.Sleep(500 * time.Millisecond)
	before := srv.Map().Epoch
	px.stall(1200 * time.Millisecond)
	time.Sleep(2 * time.Second)
	if after := srv.Map().Epoch; after != before || liveCount(srv.Map()) != 1 {
		t.Fatalf("ctl answers delayed 1.2s (heartbeats read, lease renewed): the map went from epoch %d to %d (b0 live: %v)", before, after, liveCount(srv.Map()) == 1)
	}
}

// joinThrough registers broker b0 with the ctl behind px, with lease; it
// leaves when the test ends.
func joinThrough(t *testing.T, p *testPKI, px *stallProxy, lease time.Duration) *ctlclient.Member {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	m, err := ctlclient.Join(ctx, ctlclient.MemberConfig{
		CtlAddr:  px.pc.LocalAddr().String(),
		TLS:      p.clientTLS(t, "b0"),
		Node:     transport.Register{NodeID: "b0", Addr: "127.0.0.1:7400"},
		LeaseTTL: lease,
		Logger:   testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}
