package ctl

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"go.uber.org/goleak"

	"github.com/felix-broker/felix/ctl/ctlclient"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// Tests that start a multi-member etcd cluster wait for its peer
// connections to end (see startHA), so nothing is ignored here.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// shortTTL is the lease in network tests: short so expiry is quick,
// long enough for heartbeats on a loaded 2-core machine.
const shortTTL = 300 * time.Millisecond

// waitFor bounds every wait in network tests.
const waitFor = 10 * time.Second

// testPKI is a dev PKI with a ctl node, brokers b0..b3 and a client.
type testPKI struct {
	dir string
	ca  *x509.CertPool
}

func newPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	if err := transport.GenerateDevCerts(dir, "ctl", "b0", "b1", "b2", "b3"); err != nil {
		t.Fatal(err)
	}
	ca, err := transport.LoadCA(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	return &testPKI{dir: dir, ca: ca}
}

func (p *testPKI) cert(t *testing.T, name string) tls.Certificate {
	t.Helper()
	c, err := transport.LoadKeyPair(filepath.Join(p.dir, name+".crt"), filepath.Join(p.dir, name+".key"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// issue issues a certificate of role named name (with hosts) from the
// PKI's CA, as it is: none of `felix certs`' checks of the name. It
// writes name.crt, name.key and ca.crt into dir.
func (p *testPKI) issue(t *testing.T, dir string, role transport.Role, name string, hosts ...string) {
	t.Helper()
	ca, err := transport.LoadCAKeyPair(filepath.Join(p.dir, "ca.crt"), filepath.Join(p.dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.Issue(role, name, hosts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := transport.WriteKeyPair(cert, filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")); err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteCert(filepath.Join(dir, "ca.crt")); err != nil {
		t.Fatal(err)
	}
}

// etcd returns the embedded etcd config of a ctl of this PKI: its
// certificate and the CA as files, which secure the member's https URLs.
func (p *testPKI) etcd() EtcdConfig {
	return EtcdConfig{CertFile: filepath.Join(p.dir, "ctl.crt"), KeyFile: filepath.Join(p.dir, "ctl.key"), CAFile: filepath.Join(p.dir, "ca.crt")}
}

// clientTLS returns ctl client TLS presenting the certificate named name
// (transport.DevAdminName for the admin client certificate, or a node id).
func (p *testPKI) clientTLS(t *testing.T, name string) *tls.Config {
	cert := p.cert(t, name)
	return transport.ClientTLS(p.ca, &cert, "", transport.ALPNCtl)
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(b[:len(b)-1]))
	return len(b), nil
}

// startCtl starts a ctl on addr ("127.0.0.1:0" for any port) with state in
// dataDir, closed when the test ends.
func startCtl(t *testing.T, p *testPKI, dataDir, addr string) *Server {
	t.Helper()
	return startCtlLease(t, p, dataDir, addr, shortTTL)
}

// startCtlLease is startCtl with a lease of its own.
func startCtlLease(t *testing.T, p *testPKI, dataDir, addr string, lease time.Duration) *Server {
	t.Helper()
	cfg := p.ctlConfig(t, dataDir, addr)
	cfg.LeaseTTL = lease
	return startConfig(t, cfg)
}

// ctlConfig is the config of a ctl of this PKI on addr with state in
// dataDir, as startCtl starts it.
func (p *testPKI) ctlConfig(t *testing.T, dataDir, addr string) Config {
	t.Helper()
	return Config{
		Addr:       addr,
		DataDir:    dataDir,
		Etcd:       p.etcd(),
		TLS:        transport.ServerTLS(p.cert(t, "ctl"), p.ca, transport.ALPNCtl),
		LeaseTTL:   shortTTL,
		Superusers: []string{transport.DevAdminName},
		Logger:     testLogger(t),
	}
}

// startConfig makes and starts a ctl of cfg, closed when the test ends.
func startConfig(t *testing.T, cfg Config) *Server {
	t.Helper()
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

func join(t *testing.T, p *testPKI, addr, id string) *ctlclient.Member {
	t.Helper()
	return joinWith(t, p, addr, id, nil)
}

// joinWith is join registering with features (nil: this build's, as a
// broker does; empty: none, as a broker of an earlier version).
func joinWith(t *testing.T, p *testPKI, addr, id string, features []string) *ctlclient.Member {
	t.Helper()
	return joinConfig(t, p, addr, id, func(c *ctlclient.MemberConfig) { c.Node.Features = features })
}

// joinConfig is join with the member's config changed by tweak.
func joinConfig(t *testing.T, p *testPKI, addr, id string, tweak func(*ctlclient.MemberConfig)) *ctlclient.Member {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	cfg := ctlclient.MemberConfig{
		CtlAddr:    addr,
		TLS:        p.clientTLS(t, id),
		Node:       transport.Register{NodeID: id, Addr: "127.0.0.1:74" + id[1:], Admin: "127.0.0.1:94" + id[1:]},
		LeaseTTL:   shortTTL,
		MaxBackoff: 100 * time.Millisecond,
		Logger:     testLogger(t),
	}
	tweak(&cfg)
	m, err := ctlclient.Join(ctx, cfg)
	if err != nil {
		t.Fatalf("join %s: %v", id, err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// waitMap waits until m holds a map for which ok is true, failing the test
// after waitFor.
func waitMap(t *testing.T, m *ctlclient.Member, what string, ok func(*shardmap.Map) bool) *shardmap.Map {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		changed := m.Changed()
		if mp := m.Map(); ok(mp) {
			return mp
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("member %s: no map where %s within %v; holding epoch %d: %+v", m.NodeID(), what, waitFor, m.Map().Epoch, m.Map())
		}
	}
}

func liveCount(m *shardmap.Map) int {
	n := 0
	for _, node := range m.Nodes {
		if node.Live {
			n++
		}
	}
	return n
}

// rawConn is a hand-driven ctl connection, for what a Member never sends.
type rawConn struct {
	t    *testing.T
	conn *quic.Conn
}

func dialRaw(t *testing.T, p *testPKI, addr, certName string) *rawConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	conn, err := transport.Dial(ctx, addr, p.clientTLS(t, certName), transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.CloseWithError(0, "") })
	return &rawConn{t: t, conn: conn}
}

// relayClient makes admin requests to a ctl as a broker relaying them
// for principal, which each request with no Principal of its own is
// made for: ctl refuses client certificates.
type relayClient struct {
	*ctlclient.AdminClient
	principal string
}

func (c relayClient) Request(ctx context.Context, req *transport.Request) (*transport.Response, error) {
	if req.Principal == "" {
		r := *req
		r.Principal = c.principal
		req = &r
	}
	return c.AdminClient.Request(ctx, req)
}

// dialAs dials the ctl at addr with the node certificate b3 for admin
// requests made for principal.
func dialAs(ctx context.Context, t *testing.T, p *testPKI, addr, principal string) (relayClient, error) {
	c, err := ctlclient.Dial(ctx, addr, p.clientTLS(t, "b3"), transport.Config{})
	return relayClient{AdminClient: c, principal: principal}, err
}

// countGoroutines returns how many goroutines have fn in their stack.
func countGoroutines(fn string) int {
	var buf bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&buf, 1)
	n := 0
	for _, blk := range strings.Split(buf.String(), "\n\n") {
		if !strings.Contains(blk, fn) {
			continue
		}
		var c int
		blk = blk[strings.LastIndex(blk[:strings.Index(blk, " @ ")], "\n")+1:]
		fmt.Sscanf(blk, "%d @", &c)
		n += c
	}
	return n
}

// stream opens a stream and writes raw bytes to it.
func (c *rawConn) stream(b []byte) (*quic.Stream, *transport.Reader) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	str, err := c.conn.OpenStreamSync(ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	str.SetDeadline(time.Now().Add(waitFor))
	if _, err := str.Write(b); err != nil {
		c.t.Fatal(err)
	}
	return str, transport.NewReader(str, mapFrameMax)
}

// send opens a stream and writes the frames fs to it.
func (c *rawConn) send(fs ...transport.Frame) (*quic.Stream, *transport.Reader) {
	c.t.Helper()
	var b []byte
	for _, f := range fs {
		var err error
		if b, err = transport.AppendFrame(b, f); err != nil {
			c.t.Fatal(err)
		}
	}
	return c.stream(b)
}

// readFrame reads one frame, failing the test on error.
func readFrame(t *testing.T, r *transport.Reader) transport.Frame {
	t.Helper()
	f, err := r.Read()
	if err != nil {
		t.Fatalf("read frame: %v", err)
	}
	return f
}

// readEOF reads until the stream ends and fails if a frame arrives first.
func readEOF(t *testing.T, r *transport.Reader) {
	t.Helper()
	f, err := r.Read()
	if err == nil {
		t.Fatalf("read %T %+v, want the stream to end", f, f)
	}
	if err != io.EOF {
		t.Logf("stream ended with %v", err)
	}
}
