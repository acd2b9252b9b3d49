package transport

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/quic-go/quic-go"
)

// Application error codes on QUIC connections and streams (CloseWithError,
// CancelRead, CancelWrite) are [ErrorCode] values, 0 for an orderly close:
// quic.ApplicationErrorCode(CodeShuttingDown) says a node is going away.
const closeNormal quic.ApplicationErrorCode = 0

// ClosedWith returns the reason the peer gave for closing a QUIC
// connection, as an *Error, when err (or an error it wraps) is the
// connection's *quic.ApplicationError sent by the peer with a code other
// than 0: by the convention above that code is an [ErrorCode] (a broker
// refusing a client's connection closes it with CodeUnauthorized or
// CodeLimitExceeded, one going away with CodeShuttingDown). The *Error's
// Message is the peer's reason phrase and it unwraps to err's
// *quic.ApplicationError. ClosedWith returns nil for anything else: a
// close of this side, an orderly close, an idle timeout, a code too large
// to be an ErrorCode.
func ClosedWith(err error) *Error {
	var ae *quic.ApplicationError
	if !errors.As(err, &ae) || !ae.Remote || ae.ErrorCode == closeNormal || ae.ErrorCode > quic.ApplicationErrorCode(^ErrorCode(0)) {
		return nil
	}
	return &Error{Code: ErrorCode(ae.ErrorCode), Message: ae.ErrorMessage, cause: ae}
}

// Listener accepts QUIC connections on a UDP socket it owns, and keeps
// track of them so that Close can close them properly.
type Listener struct {
	udp *net.UDPConn
	tr  *quic.Transport
	ln  *quic.Listener
	rev *Revocations // nil: none revoked

	// handshakes counts the connections quic-go made for the listener
	// that are neither accepted nor closed (see Listen).
	handshakes atomic.Int64

	// mu guards conns, the accepted connections not yet closed, which
	// Accept adds and their closing removes.
	mu struct {
		sync.Mutex
		conns  map[*quic.Conn]struct{}
		closed bool
	}
}

// Listen listens for QUIC connections on the UDP address addr
// ("host:port"; port 0 picks one, see [Listener.Addr]). tlsConf must have a
// certificate and the ALPN names served (see [ServerTLS]).
//
// Connections in their handshake are bounded: with cfg.RetryHandshakes
// of them (counted from the connection quic-go makes for a client's
// first packet until it is accepted or closed) a new client is sent a
// Retry first, so that a spoofed source makes the listener hold nothing,
// and with cfg.MaxHandshakes a new one is refused. quic-go by itself
// bounds only the handshakes done and waiting for Accept.
func Listen(addr string, tlsConf *tls.Config, cfg Config) (*Listener, error) {
	cfg = cfg.WithDefaults()
	if err := checkTLS(tlsConf); err != nil {
		return nil, fmt.Errorf("transport: listen on %q: %w", addr, err)
	}
	udpAddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("transport: listen on %q: %w", addr, err)
	}
	udp, err := net.ListenUDP("udp", udpAddr)
	if err != nil {
		return nil, fmt.Errorf("transport: listen on %q: %w", addr, err)
	}
	l := &Listener{udp: udp, rev: cfg.Revocations}
	l.mu.conns = map[*quic.Conn]struct{}{}
	l.tr = &quic.Transport{
		Conn:              udp,
		StatelessResetKey: resetKey(tlsConf),
		// Asked for a client's first packet that carries no valid token
		// (from an earlier Retry or connection).
		VerifySourceAddress: func(net.Addr) bool {
			return cfg.RetryHandshakes >= 0 && l.handshakes.Load() >= int64(cfg.RetryHandshakes)
		},
		ConnContext: func(ctx context.Context, _ *quic.ClientInfo) (context.Context, error) {
			return l.handshakeStarts(ctx, int64(cfg.MaxHandshakes))
		},
	}
	ln, err := l.tr.Listen(tlsConf, cfg.QUIC())
	if err != nil {
		l.tr.Close()
		udp.Close()
		return nil, fmt.Errorf("transport: listen on %q: %w", addr, err)
	}
	l.ln = ln
	return l, nil
}

// errTooManyHandshakes refuses a connection past Config.MaxHandshakes.
var errTooManyHandshakes = errors.New("transport: too many handshakes in flight")

// handshake is a connection counted in Listener.handshakes until done
// runs: when Accept takes it, or when it closes (its handshake failed or
// timed out), whichever comes first.
type handshake struct {
	l    *Listener
	once sync.Once
}

func (h *handshake) done() { h.once.Do(func() { h.l.handshakes.Add(-1) }) }

type handshakeKey struct{}

// handshakeStarts counts the connection quic-go is about to make for a
// client's first packet (its ConnContext), or refuses it when limit are
// in flight. ctx ends when the connection closes; the context returned
// is the connection's (quic.Conn.Context derives from it), which is how
// Accept finds the handshake to count done.
func (l *Listener) handshakeStarts(ctx context.Context, limit int64) (context.Context, error) {
	if l.handshakes.Add(1) > limit {
		l.handshakes.Add(-1)
		return nil, errTooManyHandshakes
	}
	h := &handshake{l: l}
	context.AfterFunc(ctx, h.done)
	return context.WithValue(ctx, handshakeKey{}, h), nil
}

// Accept waits for the next connection whose handshake is complete. After
// [Listener.StopAccepting] or [Listener.Close] it returns
// quic.ErrServerClosed. A connection whose client certificate
// Config.Revocations lists is closed with CodeUnauthorized (saying whose
// certificate was revoked) and not returned.
func (l *Listener) Accept(ctx context.Context) (*quic.Conn, error) {
	conn, err := l.ln.Accept(ctx)
	for err == nil && l.rev != nil {
		rerr := l.rev.admit(conn)
		if rerr == nil {
			break
		}
		l.handshakeDone(conn)
		refuse(conn, rerr)
		conn, err = l.ln.Accept(ctx)
	}
	if err != nil {
		return nil, err
	}
	l.handshakeDone(conn)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.closed {
		conn.CloseWithError(quic.ApplicationErrorCode(CodeShuttingDown), "listener closed")
		return nil, quic.ErrServerClosed
	}
	l.mu.conns[conn] = struct{}{}
	context.AfterFunc(conn.Context(), func() {
		l.mu.Lock()
		delete(l.mu.conns, conn)
		l.mu.Unlock()
	})
	return conn, nil
}

// handshakeDone counts conn's handshake done (see handshake).
func (l *Listener) handshakeDone(conn *quic.Conn) {
	if h, ok := conn.Context().Value(handshakeKey{}).(*handshake); ok {
		h.done()
	}
}

// Addr returns the address the listener is bound to.
func (l *Listener) Addr() net.Addr { return l.udp.LocalAddr() }

// StopAccepting refuses new connections; connections already accepted
// stay up. Use it to drain before [Listener.Close].
func (l *Listener) StopAccepting() error { return l.ln.Close() }

// Close stops accepting, closes every connection accepted from l that is
// still open with CodeShuttingDown (close them first for another code),
// and closes the socket.
func (l *Listener) Close() error {
	l.ln.Close()
	l.mu.Lock()
	l.mu.closed = true
	conns := make([]*quic.Conn, 0, len(l.mu.conns))
	for c := range l.mu.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() { c.CloseWithError(quic.ApplicationErrorCode(CodeShuttingDown), "listener closed") })
	}
	wg.Wait()
	err := l.tr.Close()
	if cerr := l.udp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("transport: closing listener on %s: %w", l.udp.LocalAddr(), err)
	}
	return nil
}

// Dial connects to the QUIC server at addr ("host:port") on a UDP socket of
// its own, which closes with the connection. It returns when the handshake
// is done, or with ctx's error when ctx ends first. tlsConf names the ALPN
// protocol (see [ClientTLS]).
//
// With TLS 1.3 a client finishes its handshake before the server has
// checked the client's certificate: a server that rejects the certificate
// closes the connection right after, and the first stream operation
// fails.
//
// A server certificate cfg.Revocations lists fails the dial with a
// [CodeUnauthorized] error wrapping [ErrRevoked], after the connection is
// closed with it.
func Dial(ctx context.Context, addr string, tlsConf *tls.Config, cfg Config) (*quic.Conn, error) {
	if err := checkTLS(tlsConf); err != nil {
		return nil, fmt.Errorf("transport: dial %s: %w", addr, err)
	}
	raddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("transport: dial %s: %w", addr, err)
	}
	// A socket of the remote's family: an IPv4 socket cannot reach ::1.
	network, laddr := "udp4", &net.UDPAddr{IP: net.IPv4zero}
	if raddr.IP != nil && raddr.IP.To4() == nil {
		network, laddr = "udp6", &net.UDPAddr{IP: net.IPv6zero}
	}
	udp, err := net.ListenUDP(network, laddr)
	if err != nil {
		return nil, fmt.Errorf("transport: dial %s: %w", addr, err)
	}
	tr := &quic.Transport{Conn: udp}
	release := func() {
		tr.Close()
		udp.Close()
	}
	if tlsConf.ServerName == "" {
		// As quic.DialAddr does: verify the name dialed.
		tlsConf = tlsConf.Clone()
		if host, _, err := net.SplitHostPort(addr); err == nil {
			tlsConf.ServerName = host
		}
	}
	conn, err := tr.Dial(ctx, raddr, tlsConf, cfg.QUIC())
	if err != nil {
		release()
		return nil, fmt.Errorf("transport: dial %s: %w", addr, err)
	}
	if cfg.Revocations != nil {
		if rerr := cfg.Revocations.admit(conn); rerr != nil {
			refuse(conn, rerr)
			release()
			return nil, fmt.Errorf("transport: dial %s: %w", addr, rerr)
		}
	}
	context.AfterFunc(conn.Context(), release)
	return conn, nil
}

func checkTLS(c *tls.Config) error {
	if c == nil {
		return errors.New("nil TLS config")
	}
	if len(c.NextProtos) == 0 {
		return errors.New("TLS config names no ALPN protocol (ALPNClient, ALPNPeer or ALPNCtl)")
	}
	return nil
}

// resetKey derives the listener's stateless reset key from its TLS private
// key, so that a server restarted with the same identity can tell clients
// of its previous run at once that their connections are gone (a QUIC
// stateless reset), instead of leaving them to the idle timeout. Without a
// certificate it returns nil (no stateless resets).
func resetKey(tlsConf *tls.Config) *quic.StatelessResetKey {
	if len(tlsConf.Certificates) == 0 || tlsConf.Certificates[0].PrivateKey == nil {
		return nil
	}
	der, err := x509.MarshalPKCS8PrivateKey(tlsConf.Certificates[0].PrivateKey)
	if err != nil {
		return nil
	}
	k := quic.StatelessResetKey(sha256.Sum256(append([]byte("felix stateless reset key v1\x00"), der...)))
	return &k
}
