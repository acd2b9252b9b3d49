package transport

import (
	"time"

	"github.com/quic-go/quic-go"
)

// ALPN protocol names. ALPN names the protocol and its version; a server
// tells which one a connection speaks from
// conn.ConnectionState().TLS.NegotiatedProtocol.
const (
	ALPNClient = "felix/1"      // clients (SDK, felixctl) to brokers
	ALPNPeer   = "felix-peer/1" // broker to broker (forwarding); mTLS required
	ALPNCtl    = "felix-ctl/1"  // brokers and ctl; mTLS required
)

// Config tunes QUIC connections and framing. The zero value is ready to
// use: a zero field means the default written on it.
//
// The defaults favour latency: flow-control windows start large enough
// that a burst of publishes or a max-size frame never waits a round trip
// for a window update, and grow (quic-go auto-tunes between Initial and Max)
// for throughput on long paths.
type Config struct {
	// MaxIdleTimeout closes a connection with no network activity for this
	// long (the smaller of both sides' values applies), which is how a
	// peer that died without closing is noticed. Default 5s.
	MaxIdleTimeout time.Duration
	// KeepAlivePeriod sends a keep-alive this often when idle, so an idle
	// connection between nodes stays up and a dead peer is noticed within
	// MaxIdleTimeout. Default 1s; negative disables keep-alives.
	KeepAlivePeriod time.Duration
	// HandshakeTimeout aborts a handshake with no packet from the peer for
	// this long (and any handshake taking twice as long). Default 5s.
	HandshakeTimeout time.Duration
	// MaxIncomingStreams is how many concurrent bidirectional streams a
	// peer may open on one connection: every publisher and subscriber is
	// one, and so is every forwarding lane between two brokers (one per
	// publisher stream that forwards to that owner). Default 4096.
	//
	// quic-go picks a connection's config before the handshake tells a
	// client from a peer, so this one value applies to both: it is sized
	// for peer connections, and a broker enforces a lower limit on client
	// connections itself (broker.Config.MaxStreamsPerConn).
	MaxIncomingStreams int64
	// InitialStreamWindow is a stream's initial receive window. Default
	// 1 MiB.
	InitialStreamWindow uint64
	// MaxStreamWindow is the most a stream's receive window auto-tunes to.
	// Default 16 MiB (at least InitialStreamWindow).
	MaxStreamWindow uint64
	// InitialConnWindow is a connection's initial receive window. Default
	// 4 MiB.
	InitialConnWindow uint64
	// MaxConnWindow is the most a connection's receive window auto-tunes
	// to. Default 64 MiB (at least InitialConnWindow).
	MaxConnWindow uint64
	// RetryHandshakes is how many connections a [Listener] may hold in
	// their handshake (or done and waiting for Accept) before it asks
	// each new one to prove its address first: a QUIC Retry (RFC 9000
	// section 8.1.2), stateless, which costs a client one more round trip
	// and a spoofed source, which never sees it, everything. Below it no
	// Retry is sent and a handshake is as short as QUIC allows. Default
	// 64; negative sends none.
	RetryHandshakes int
	// MaxHandshakes is the most connections a [Listener] holds in their
	// handshake (or done and waiting for Accept); a new one past it is
	// refused (CONNECTION_REFUSED): the dial fails (the SDK's Connect
	// returns the error; a connected client redials with its backoff).
	// Each holds two goroutines and TLS state for up to twice
	// HandshakeTimeout, and clients from real addresses pass the Retry:
	// this bounds them.
	// Default 256.
	MaxHandshakes int
	// MaxFrame is the largest frame length (type byte plus body) a stream
	// reader accepts; pass it to [NewReader] and [Writer.SetMaxFrame].
	// Default DefaultMaxFrame (4 MiB). A server that bounds records derives
	// it from its record limit with [PublishFrameLimit].
	MaxFrame int
	// Revocations, when set, is the revocation list a [Listener] and
	// [Dial] enforce: a connection whose verified peer certificate it
	// lists is closed with CodeUnauthorized right after its handshake,
	// and a live one when a reload lists it (see [WatchCRL]). Nil: no
	// certificate is revoked. It is checked at handshakes only, never
	// per frame.
	Revocations *Revocations
}

// Defaults of Config, as documented on its fields.
const (
	defaultMaxIdleTimeout      = 5 * time.Second
	defaultKeepAlivePeriod     = time.Second
	defaultHandshakeTimeout    = 5 * time.Second
	defaultMaxIncomingStreams  = 4096
	defaultInitialStreamWindow = 1 << 20
	defaultMaxStreamWindow     = 16 << 20
	defaultInitialConnWindow   = 4 << 20
	defaultMaxConnWindow       = 64 << 20
	defaultRetryHandshakes     = 64
	defaultMaxHandshakes       = 256
)

// WithDefaults returns a copy of c with each zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.MaxIdleTimeout == 0 {
		c.MaxIdleTimeout = defaultMaxIdleTimeout
	}
	if c.KeepAlivePeriod == 0 {
		c.KeepAlivePeriod = defaultKeepAlivePeriod
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = defaultHandshakeTimeout
	}
	if c.MaxIncomingStreams == 0 {
		c.MaxIncomingStreams = defaultMaxIncomingStreams
	}
	if c.InitialStreamWindow == 0 {
		c.InitialStreamWindow = defaultInitialStreamWindow
	}
	if c.MaxStreamWindow == 0 {
		c.MaxStreamWindow = defaultMaxStreamWindow
	}
	c.MaxStreamWindow = max(c.MaxStreamWindow, c.InitialStreamWindow)
	if c.InitialConnWindow == 0 {
		c.InitialConnWindow = defaultInitialConnWindow
	}
	if c.MaxConnWindow == 0 {
		c.MaxConnWindow = defaultMaxConnWindow
	}
	c.MaxConnWindow = max(c.MaxConnWindow, c.InitialConnWindow)
	if c.RetryHandshakes == 0 {
		c.RetryHandshakes = defaultRetryHandshakes
	}
	if c.MaxHandshakes <= 0 {
		c.MaxHandshakes = defaultMaxHandshakes
	}
	if c.MaxFrame <= 0 {
		c.MaxFrame = DefaultMaxFrame
	}
	return c
}

// QUIC returns the quic-go configuration for c, defaults applied.
func (c Config) QUIC() *quic.Config {
	c = c.WithDefaults()
	keepAlive := c.KeepAlivePeriod
	if keepAlive < 0 {
		keepAlive = 0
	}
	return &quic.Config{
		HandshakeIdleTimeout:           c.HandshakeTimeout,
		MaxIdleTimeout:                 c.MaxIdleTimeout,
		KeepAlivePeriod:                keepAlive,
		MaxIncomingStreams:             c.MaxIncomingStreams,
		InitialStreamReceiveWindow:     c.InitialStreamWindow,
		MaxStreamReceiveWindow:         c.MaxStreamWindow,
		InitialConnectionReceiveWindow: c.InitialConnWindow,
		MaxConnectionReceiveWindow:     c.MaxConnWindow,
	}
}
