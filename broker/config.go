package broker

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/felix-broker/felix/internal/msgtrace"
	"github.com/felix-broker/felix/transport"
)

// Config configures a Broker. The zero value of every optional field means
// its documented default; New applies defaults to a copy.
type Config struct {
	// NodeID names this broker in the cluster; required.
	NodeID string
	// Listen is the QUIC address to listen on; default "127.0.0.1:7100".
	Listen string
	// Advertise is the address other brokers and clients use to reach this
	// one; default the address actually bound.
	Advertise string
	// Admin is the advertised HTTP admin address (metrics, health), if
	// any. The broker does not serve it; it registers it in the map so
	// operators' tools find it.
	Admin string
	// DataDir holds the shard logs; required.
	DataDir string
	// ServerTLS is the listener's TLS config; it must offer ALPNClient and
	// ALPNPeer and verify client certificates against the cluster CA.
	ServerTLS *tls.Config
	// PeerTLS dials other brokers (ALPNPeer) with this node's certificate.
	PeerTLS *tls.Config
	// CtlAddr is the control plane's QUIC address; required.
	CtlAddr string
	// CtlTLS dials the control plane (ALPNCtl) with this node's certificate.
	CtlTLS *tls.Config
	// Transport tunes QUIC and framing.
	Transport transport.Config
	// MaxPayload bounds a record's key plus value plus headers; default 1 MiB.
	MaxPayload int
	// ForwardTimeout bounds how long a forwarded publish may wait for the
	// owner, including re-routing after a map change; default 10s.
	ForwardTimeout time.Duration
	// LeaseTTL is the control plane lease; default 3s.
	LeaseTTL time.Duration
	// SegmentSize is the shard logs' segment size; default the wal default.
	SegmentSize int
	// Logger receives one line per meaningful event; default slog.Default().
	Logger *slog.Logger
	// TracerProvider traces publishes through this broker: a server span
	// per publish received, a client span per forward, the log append and
	// the fsync it waited for. Default nil: no tracing, and the publish
	// path makes no tracing calls at all. The global provider is never
	// used implicitly.
	//
	// Spans are started and ended in batches off the publish path, except
	// that a forward needs its client span's ID before it is sent: with an
	// SDK provider built with TraceIDGenerator the broker reserves that ID
	// and starts the spans afterwards too; with any other it starts them
	// before forwarding.
	TracerProvider trace.TracerProvider
	// MeterProvider receives the broker's metrics (see the package doc).
	// Default nil: no metrics, and the publish path takes no timestamps
	// for them.
	MeterProvider metric.MeterProvider
}

func (c Config) withDefaults() (Config, error) {
	if c.NodeID == "" {
		return c, errors.New("broker: config: NodeID is required")
	}
	if c.DataDir == "" {
		return c, errors.New("broker: config: DataDir is required")
	}
	if c.CtlAddr == "" {
		return c, errors.New("broker: config: CtlAddr is required")
	}
	if c.ServerTLS == nil || c.PeerTLS == nil || c.CtlTLS == nil {
		return c, errors.New("broker: config: ServerTLS, PeerTLS and CtlTLS are required")
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:7100"
	}
	if c.MaxPayload == 0 {
		c.MaxPayload = 1 << 20
	}
	if c.ForwardTimeout == 0 {
		c.ForwardTimeout = 10 * time.Second
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 3 * time.Second
	}
	c.Transport = c.Transport.WithDefaults()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// TraceIDGenerator returns the ID generator to build a TracerProvider
// with (sdktrace.WithIDGenerator), so that a forwarding broker can reserve
// span IDs and keep span work off the forward path. It generates random
// IDs like the SDK's default.
func TraceIDGenerator() sdktrace.IDGenerator { return msgtrace.IDs{} }
