package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/quictest"
	"github.com/quic-go/quic-go"
)

// testStream is a client stream with its framing.
type testStream struct {
	s *quic.Stream
	r *Reader
	w *Writer
}

func openStream(t *testing.T, conn *quic.Conn) *testStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := conn.OpenStreamSync(ctx)
	if err != nil {
		t.Fatalf("opening stream: %v", err)
	}
	return &testStream{s: s, r: NewReader(s, 0), w: NewWriter(s)}
}

// roundTrip sends f and requires it back unchanged.
func (ts *testStream) roundTrip(t *testing.T, f Frame) {
	t.Helper()
	ts.s.SetDeadline(time.Now().Add(10 * time.Second))
	if err := ts.w.Write(f); err != nil {
		t.Fatalf("stream %d: write: %v", ts.s.StreamID(), err)
	}
	got, err := ts.r.Read()
	if err != nil {
		t.Fatalf("stream %d: read: %v", ts.s.StreamID(), err)
	}
	if !reflect.DeepEqual(got, f) {
		t.Fatalf("stream %d: echo\n got %#v\nwant %#v", ts.s.StreamID(), got, f)
	}
}

func TestQUICEchoAllFrames(t *testing.T) {
	p := newPKI(t, "n1")
	addr := startEcho(t, p, Config{})
	conn := dial(t, addr, ClientTLS(p.ca, &p.client, "localhost"), Config{})
	if got := conn.ConnectionState().TLS.NegotiatedProtocol; got != ALPNClient {
		t.Fatalf("negotiated %q, want %q", got, ALPNClient)
	}
	ts := openStream(t, conn)
	for _, tc := range sampleFrames() {
		ts.roundTrip(t, tc.f)
	}
	// Pipelined: many frames out, then all back in order.
	const n = 500
	for i := range n {
		if err := ts.w.Buffer(&Publish{Seq: uint64(i), Stream: "s", Value: make([]byte, 128)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := ts.w.Flush(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		f, err := ts.r.Read()
		if err != nil {
			t.Fatal(err)
		}
		if seq := f.(*Publish).Seq; seq != uint64(i) {
			t.Fatalf("frame %d came back with Seq %d", i, seq)
		}
	}
	// A clean close gets a clean close back.
	ts.s.Close()
	if _, err := ts.r.Read(); err != io.EOF {
		t.Fatalf("after close: %v, want io.EOF", err)
	}
}

// TestQUICGarbageStreamIsolated sends garbage on one stream of a
// connection: that stream gets the Error frame and is closed; the other
// streams and the connection carry on.
func TestQUICGarbageStreamIsolated(t *testing.T) {
	p := newPKI(t, "n1")
	const maxFrame = 64 << 10
	addr := startEcho(t, p, Config{MaxFrame: maxFrame})
	oversized := append(binary.BigEndian.AppendUint32(nil, maxFrame+1), byte(FrameAck))
	tests := []struct {
		name    string
		garbage []byte
		closeW  bool // end the send side after the garbage
		code    ErrorCode
	}{
		{"oversized length", oversized, false, CodeFrameTooLarge},
		{"huge length", []byte{0xff, 0xff, 0xff, 0xff, 2, 2, 3}, false, CodeFrameTooLarge},
		{"huge publish", []byte{0xff, 0xff, 0xff, 0xff, 1, 2, 3}, false, CodePayloadTooLarge},
		{"malformed body", frame(FramePublish, []byte{0x9a, 0xc1, 0xc1, 0xc1}), false, CodeMalformed},
		{"huge declared msgpack length", frame(FramePublish, []byte{0x9a, 0x01, 0xdb, 0xff, 0xff, 0xff, 0xff, 'a'}), false, CodeMalformed},
		{"truncated frame", frame(FramePublish, body(&Publish{Value: make([]byte, 100)}))[:50], true, CodeMalformed},
		{"unknown type", frame(77, []byte{0x90}), false, CodeUnknownFrame},
		{"zero-length frame", []byte{0, 0, 0, 0}, false, CodeMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			conn := dial(t, addr, ClientTLS(p.ca, &p.client, "localhost"), Config{MaxFrame: maxFrame})
			streams := make([]*testStream, 3)
			for i := range streams {
				streams[i] = openStream(t, conn)
				streams[i].roundTrip(t, &Publish{Seq: 1, Stream: "s", Value: []byte(fmt.Sprint("before ", i))})
			}
			bad := streams[1]
			bad.s.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := bad.s.Write(tc.garbage); err != nil {
				t.Fatal(err)
			}
			if tc.closeW {
				bad.s.Close()
			}
			f, err := bad.r.Read()
			if err != nil {
				t.Fatalf("reading the answer to garbage: %v", err)
			}
			werr, ok := f.(*Error)
			if !ok {
				t.Fatalf("answer to garbage is %#v, want an Error frame", f)
			}
			if werr.Code != tc.code {
				t.Fatalf("Error frame code %v (%v), want %v", werr.Code, werr, tc.code)
			}
			if _, err := bad.r.Read(); err != io.EOF {
				t.Fatalf("after the Error frame: %v, want io.EOF (stream closed)", err)
			}
			// The other streams, and new ones, keep working.
			streams[2] = openStream(t, conn)
			for round := range 10 {
				for _, i := range []int{0, 2} {
					streams[i].roundTrip(t, &Publish{Seq: uint64(round), Stream: "s", Value: []byte(fmt.Sprint("after ", i))})
				}
			}
			if err := conn.Context().Err(); err != nil {
				t.Fatalf("connection closed: %v", context.Cause(conn.Context()))
			}
		})
	}
}

func TestListenDialErrors(t *testing.T) {
	p := newPKI(t, "n1")
	noALPN := ServerTLS(p.nodes["n1"], p.ca)
	noALPN.NextProtos = nil
	if _, err := Listen("127.0.0.1:0", noALPN, Config{}); err == nil {
		t.Error("Listen without ALPN succeeded")
	}
	if _, err := Listen("127.0.0.1:0", nil, Config{}); err == nil {
		t.Error("Listen without TLS succeeded")
	}
	if _, err := Listen("256.0.0.1:0", ServerTLS(p.nodes["n1"], p.ca), Config{}); err == nil {
		t.Error("Listen on a bad address succeeded")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := Dial(ctx, "127.0.0.1:1", nil, Config{}); err == nil {
		t.Error("Dial without TLS succeeded")
	}
	// A server that is not there: the dial ends with the context.
	short, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	_, err := Dial(short, "127.0.0.1:9", ClientTLS(p.ca, &p.client, "localhost"), Config{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Dial to nothing = %v, want deadline exceeded", err)
	}
	// The wrong ALPN is refused at handshake.
	addr := startEcho(t, p, Config{})
	if _, err := Dial(ctx, addr, ClientTLS(p.ca, &p.client, "localhost", "other/1"), Config{}); err == nil {
		t.Error("Dial with an unknown ALPN succeeded")
	}
}

func TestConfigDefaults(t *testing.T) {
	q := Config{}.QUIC()
	if q.MaxIncomingStreams != 4096 || q.MaxIdleTimeout != 5*time.Second || q.KeepAlivePeriod != time.Second ||
		q.HandshakeIdleTimeout != 5*time.Second || q.InitialStreamReceiveWindow != 1<<20 || q.MaxStreamReceiveWindow != 16<<20 ||
		q.InitialConnectionReceiveWindow != 4<<20 || q.MaxConnectionReceiveWindow != 64<<20 {
		t.Errorf("defaults: %+v", q)
	}
	if got := (Config{}).WithDefaults().MaxFrame; got != DefaultMaxFrame {
		t.Errorf("MaxFrame default %d", got)
	}
	if d := (Config{}).WithDefaults(); d.RetryHandshakes != 64 || d.MaxHandshakes != 256 {
		t.Errorf("RetryHandshakes default %d, MaxHandshakes default %d", d.RetryHandshakes, d.MaxHandshakes)
	}
	c := Config{MaxIncomingStreams: 5, KeepAlivePeriod: -1, InitialStreamWindow: 32 << 20, InitialConnWindow: 128 << 20}
	q = c.QUIC()
	if q.MaxIncomingStreams != 5 || q.KeepAlivePeriod != 0 || q.MaxStreamReceiveWindow != 32<<20 || q.MaxConnectionReceiveWindow != 128<<20 {
		t.Errorf("custom: %+v", q)
	}
	if c.MaxIncomingStreams != 5 || c.MaxFrame != 0 {
		t.Error("QUIC modified its receiver")
	}
}

func TestEchoProcess(t *testing.T) {
	p := newPKI(t, "n1")
	addr := startEchoProcess(t, p)
	conn := dial(t, addr, ClientTLS(p.ca, &p.client, "localhost"), Config{})
	ts := openStream(t, conn)
	for _, tc := range sampleFrames()[:5] {
		ts.roundTrip(t, tc.f)
	}
}

// TestClosedWith: a peer's close code is read back as the *Error of that
// code, which unwraps to quic-go's error; nothing else is.
func TestClosedWith(t *testing.T) {
	refused := &quic.ApplicationError{Remote: true, ErrorCode: quic.ApplicationErrorCode(CodeLimitExceeded), ErrorMessage: "over the limit"}
	for _, tc := range []struct {
		name string
		err  error
		want *Error // nil: not a peer's close code
	}{
		{"limit_exceeded", refused, ErrLimitExceeded},
		{"wrapped", fmt.Errorf("reading: %w", refused), ErrLimitExceeded},
		{"unauthorized", &quic.ApplicationError{Remote: true, ErrorCode: quic.ApplicationErrorCode(CodeUnauthorized)}, ErrUnauthorized},
		{"shutting_down", &quic.ApplicationError{Remote: true, ErrorCode: quic.ApplicationErrorCode(CodeShuttingDown)}, ErrShuttingDown},
		{"orderly", &quic.ApplicationError{Remote: true, ErrorCode: 0}, nil},
		{"local", &quic.ApplicationError{Remote: false, ErrorCode: quic.ApplicationErrorCode(CodeLimitExceeded)}, nil},
		{"too large", &quic.ApplicationError{Remote: true, ErrorCode: 1 << 20}, nil},
		{"idle", &quic.IdleTimeoutError{}, nil},
		{"nil", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ClosedWith(tc.err)
			if tc.want == nil {
				if got != nil {
					t.Fatalf("ClosedWith(%v) = %v, want nil", tc.err, got)
				}
				return
			}
			if !errors.Is(got, tc.want) {
				t.Fatalf("ClosedWith(%v) = %v, want code %s", tc.err, got, tc.want.Code)
			}
			var ae *quic.ApplicationError
			if !errors.As(got, &ae) {
				t.Fatalf("ClosedWith(%v) does not unwrap to the quic error", tc.err)
			}
		})
	}
	if got := ClosedWith(refused); got.Message != "over the limit" {
		t.Fatalf("message %q", got.Message)
	}
}

// TestListenerBoundsHandshakes: a listener holds at most MaxHandshakes
// connections in their handshake, refusing more, and from
// RetryHandshakes of them on it asks a new client to prove its address
// first (a QUIC Retry); below that a client's handshake has no Retry.
// The clients here stall in their handshake (they never send their
// certificate) from one real address, so they pass the Retry: the cap is
// what bounds them. Without it every client's first packet made a
// server connection, held until its handshake timed out.
func TestListenerBoundsHandshakes(t *testing.T) {
	p := newPKI(t, "n1")
	const retryAt, maxHS = 4, 16
	cfg := Config{RetryHandshakes: retryAt, MaxHandshakes: maxHS, HandshakeTimeout: time.Minute}
	ln, err := Listen("127.0.0.1:0", ServerTLS(p.nodes["n1"], p.ca), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	echoed := make(chan error, 1)
	go func() { echoed <- Echo(ctx, ln, 0) }()
	defer func() {
		cancel()
		ln.Close()
		<-echoed
	}()
	addr := ln.Addr().(*net.UDPAddr)
	clientTLS := ClientTLS(p.ca, &p.client, "localhost")

	// dial connects as a client would, on a socket of its own, and
	// returns the Retry packets it received.
	dial := func() int {
		t.Helper()
		udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		rc := &retryCounter{UDPConn: udp}
		tr := &quic.Transport{Conn: rc}
		defer func() { tr.Close(); udp.Close() }()
		dctx, dcancel := context.WithTimeout(ctx, 20*time.Second)
		defer dcancel()
		conn, err := tr.Dial(dctx, addr, clientTLS, cfg.QUIC())
		if err != nil {
			t.Fatalf("dial with %d handshakes in flight: %v", ln.handshakes.Load(), err)
		}
		conn.CloseWithError(0, "")
		return int(rc.retries.Load())
	}
	// The handshakes that never finish, from one socket, until Release.
	stall, err := quictest.NewStaller(ctx, addr, clientTLS, cfg.QUIC())
	if err != nil {
		t.Fatal(err)
	}
	defer stall.Release()
	waitHandshakes := func(want int64) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ln.handshakes.Load() != want; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d handshakes in flight; want %d", ln.handshakes.Load(), want)
			}
		}
	}

	if n := dial(); n != 0 {
		t.Errorf("with no handshake in flight a client was sent %d Retry packets; want none", n)
	}
	stall.Stall(2 * retryAt)
	waitHandshakes(2 * retryAt)
	if n := dial(); n == 0 {
		// One per Initial packet of the client's first flight: a
		// ClientHello with a post-quantum key share takes two.
		t.Errorf("with %d handshakes in flight (RetryHandshakes %d) a client was sent no Retry", 2*retryAt, retryAt)
	}
	stall.Stall(200)
	waitHandshakes(maxHS)
	time.Sleep(500 * time.Millisecond) // the refused ones had time to get in
	if n := ln.handshakes.Load(); n > maxHS {
		t.Errorf("%d handshakes in flight; MaxHandshakes is %d", n, maxHS)
	}
	if n := quictest.ServerHandshakes(); n > maxHS {
		t.Errorf("quic-go holds %d server connections in their handshake; MaxHandshakes is %d", n, maxHS)
	}
	stall.Release()
	waitHandshakes(0)
	if n := dial(); n != 0 {
		t.Errorf("once the handshakes in flight ended a client was sent %d Retry packets; want none", n)
	}
}

// retryCounter counts the QUIC Retry packets read from its socket: a
// long header (0x80), the fixed bit (0x40) and type Retry (0x30, QUIC
// version 1). quic-go reads it with ReadFrom: it is no
// quic.OOBCapablePacketConn.
type retryCounter struct {
	*net.UDPConn
	retries atomic.Int32
}

func (c *retryCounter) ReadMsgUDP() {} // hides UDPConn's: ReadFrom is used

func (c *retryCounter) ReadFrom(b []byte) (int, net.Addr, error) {
	n, addr, err := c.UDPConn.ReadFrom(b)
	if n > 0 && b[0]&0xf0 == 0xf0 {
		c.retries.Add(1)
	}
	return n, addr, err
}
