// Package quictest holds what tests of QUIC servers share: it counts
// what quic-go holds in a process, so that a test can bound what a
// client makes a server keep, and it starts clients that hold a
// server's handshake open. It is for tests only.
package quictest

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// ServerHandshakes counts the goroutines quic-go runs per server
// connection in its handshake, in this process.
func ServerHandshakes() int {
	var buf bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&buf, 1)
	n := 0
	for _, blk := range strings.Split(buf.String(), "\n\n") {
		if !strings.Contains(blk, "(*baseServer).handleNewConn") {
			continue
		}
		// A block is "<count> @ <pcs>"; the first one has the
		// profile's header line before it.
		at := strings.Index(blk, " @ ")
		var c int
		if _, err := fmt.Sscanf(blk[strings.LastIndex(blk[:at], "\n")+1:], "%d @", &c); err == nil {
			n += c
		}
	}
	return n
}

// Staller dials connections that stall in their handshake: they never
// send their client certificate (nor Finished) until Release. They
// share one real UDP socket on loopback, so they pass a Retry the
// server asks for: only a cap on handshakes in flight bounds them.
type Staller struct {
	ctx   context.Context
	addr  *net.UDPAddr
	conf  *tls.Config
	qconf *quic.Config
	udp   *net.UDPConn
	tr    *quic.Transport
	block chan struct{}
	wg    sync.WaitGroup
	once  sync.Once
}

// NewStaller returns a Staller that dials addr with conf (its
// certificates are never sent) and qconf, each dial until ctx ends.
// Release it.
func NewStaller(ctx context.Context, addr *net.UDPAddr, conf *tls.Config, qconf *quic.Config) (*Staller, error) {
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	s := &Staller{ctx: ctx, addr: addr, qconf: qconf, udp: udp, tr: &quic.Transport{Conn: udp}, block: make(chan struct{})}
	s.conf = conf.Clone()
	s.conf.Certificates = nil
	s.conf.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		<-s.block
		return nil, errors.New("gave up")
	}
	return s, nil
}

// Stall starts n more dials, each on a goroutine of its own, which stay
// in their handshake until Release (or until the server ends it).
func (s *Staller) Stall(n int) {
	for range n {
		s.wg.Go(func() {
			if conn, err := s.tr.Dial(s.ctx, s.addr, s.conf, s.qconf); err == nil {
				conn.CloseWithError(0, "")
			}
		})
	}
}

// Release lets every stalled dial go on, waits for them and closes the
// socket. Each dial fails its handshake with an error the server is
// told of, unless ctx ended first (then the server holds it until its
// handshake timeout); one the server never answered ends at qconf's
// handshake timeout or with ctx. Calls after the first do nothing.
func (s *Staller) Release() {
	s.once.Do(func() {
		close(s.block)
		s.wg.Wait()
		s.tr.Close()
		s.udp.Close()
	})
}

// HeldHandshakes dials n connections to addr that stall in their
// handshake (see [Staller]) and returns how many server connections in
// their handshake this process holds once it holds limit (or 3 s have
// passed: a loaded machine may dial fewer) and half a second more has
// passed for the dials refused to get in. It releases the dials before
// it returns, abandoning them: the server holds those it held until its
// handshake timeout (or Close).
func HeldHandshakes(addr *net.UDPAddr, conf *tls.Config, qconf *quic.Config, n, limit int) (int, error) {
	ctx, cancel := context.WithCancel(context.Background())
	s, err := NewStaller(ctx, addr, conf, qconf)
	if err != nil {
		cancel()
		return 0, err
	}
	defer s.Release()
	defer cancel() // first: the dials the server never answered end now
	s.Stall(n)
	for deadline := time.Now().Add(3 * time.Second); ServerHandshakes() < limit && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	return ServerHandshakes(), nil
}

// SilentAddr returns a UDP address on loopback that takes datagrams and
// answers none until the test ends: a QUIC peer whose host is up and whose
// process is stuck (or a firewall dropping its packets). A dial of it
// fails only after the dialer's handshake timeout.
func SilentAddr(t testing.TB) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc.LocalAddr().String()
}
