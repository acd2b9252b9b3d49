package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"go.uber.org/goleak"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/ctl"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const waitFor = 15 * time.Second

// inproc is a control plane and brokers in this test process.
type inproc struct {
	t       testing.TB
	dir     string
	ctl     *ctl.Server
	brokers []*Broker
	tweak   func(*Config) // applied to each broker's config, if set
	// ctlTweak is applied to the control plane's config, if set.
	ctlTweak func(*ctl.Config)
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// startInproc starts a control plane and n brokers in-process, creates the
// given streams, and waits until every broker holds a map with them.
func startInproc(t *testing.T, n int, streams ...shardmap.StreamConfig) *inproc {
	t.Helper()
	return startInprocWith(t, nil, n, streams...)
}

// startInprocWith is startInproc with tweak applied to every broker's
// config (providers, say).
func startInprocWith(t testing.TB, tweak func(*Config), n int, streams ...shardmap.StreamConfig) *inproc {
	t.Helper()
	return startInprocTweaked(t, tweak, nil, n, streams...)
}

// startInprocTweaked is startInprocWith with ctlTweak applied to the
// control plane's config too.
func startInprocTweaked(t testing.TB, tweak func(*Config), ctlTweak func(*ctl.Config), n int, streams ...shardmap.StreamConfig) *inproc {
	t.Helper()
	dir := t.TempDir()
	ids := []string{"ctl"}
	for i := range n + 2 { // spares for brokers a test adds later
		ids = append(ids, cluster.BrokerID(i))
	}
	if err := transport.GenerateDevCerts(filepath.Join(dir, "certs"), ids...); err != nil {
		t.Fatal(err)
	}
	ip := &inproc{t: t, dir: dir, tweak: tweak, ctlTweak: ctlTweak}
	c := ip.startCtl("ctl")
	t.Cleanup(ip.close)
	for i := range n {
		ip.brokers = append(ip.brokers, ip.startBroker(i))
	}
	// Streams are created once every broker is a member, so their shards
	// are placed over all of them.
	for _, s := range streams {
		if err := c.CreateStream(s); err != nil {
			t.Fatal(err)
		}
	}
	ip.waitEpoch(c.Map().Epoch)
	return ip
}

// startCtl starts a control plane whose data (its embedded etcd) is in
// the directory sub of ip's and makes it ip's, which close closes.
func (ip *inproc) startCtl(sub string) *ctl.Server {
	t := ip.t
	t.Helper()
	ctlTLS, err := cluster.CtlServerTLS(filepath.Join(ip.dir, "certs"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := ctl.Config{Addr: "127.0.0.1:0", DataDir: filepath.Join(ip.dir, sub), TLS: ctlTLS, Etcd: cluster.CtlEtcd(filepath.Join(ip.dir, "certs"), ""), LeaseTTL: time.Second,
		Superusers: []string{transport.DevAdminName}, Logger: quiet()}
	if ip.ctlTweak != nil {
		ip.ctlTweak(&cfg)
	}
	c, err := ctl.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	ip.ctl = c
	return c
}

func (ip *inproc) startBroker(i int) *Broker {
	t := ip.t
	t.Helper()
	b := ip.newBroker(i)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

// newBroker returns broker i of ip, not started, with its data directory
// and the control plane's address.
func (ip *inproc) newBroker(i int) *Broker {
	ip.t.Helper()
	b, err := New(ip.brokerConfig(i))
	if err != nil {
		ip.t.Fatal(err)
	}
	return b
}

// brokerConfig is the configuration of broker i of ip.
func (ip *inproc) brokerConfig(i int) Config {
	t := ip.t
	t.Helper()
	id := cluster.BrokerID(i)
	nt, err := cluster.LoadNodeTLS(filepath.Join(ip.dir, "certs"), id)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		NodeID: id, Listen: "127.0.0.1:0", DataDir: filepath.Join(ip.dir, id),
		ServerTLS: nt.Server, PeerTLS: nt.Peer, CtlTLS: nt.Ctl, CtlAddr: ip.ctl.Addr(),
		LeaseTTL: time.Second, Logger: quiet(),
	}
	if ip.tweak != nil {
		ip.tweak(&cfg)
	}
	return cfg
}

// waitEpoch waits until every running broker holds a map of at least epoch.
func (ip *inproc) waitEpoch(epoch uint64) {
	ip.t.Helper()
	deadline := time.Now().Add(waitFor)
	for _, b := range ip.brokers {
		for b.Map().Epoch < epoch {
			if time.Now().After(deadline) {
				ip.t.Fatalf("%s still at epoch %d, want %d", b.NodeID(), b.Map().Epoch, epoch)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

func (ip *inproc) close() {
	for _, b := range ip.brokers {
		b.Close()
	}
	ip.ctl.Close()
}

// dial opens a client connection to b as the admin principal (a
// superuser), verified against the cluster CA.
func (ip *inproc) dial(b *Broker) *quic.Conn {
	ip.t.Helper()
	return ip.dialAs(b, transport.DevAdminName)
}

// dialAs opens a client connection to b as principal name, issuing its
// client certificate first if the certificate directory has none.
func (ip *inproc) dialAs(b *Broker, name string) *quic.Conn {
	ip.t.Helper()
	return ip.dialAsWith(b, name, transport.Config{})
}

// clientCert returns the client certificate of principal name, issued
// from the cluster CA the first time.
func (ip *inproc) clientCert(name string) tls.Certificate {
	t := ip.t
	t.Helper()
	dir := filepath.Join(ip.dir, "certs")
	certFile, keyFile := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if cert, err := transport.LoadKeyPair(certFile, keyFile); err == nil {
		return cert
	}
	ca, err := transport.LoadCAKeyPair(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.Issue(transport.RoleClient, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := transport.WriteKeyPair(cert, certFile, keyFile); err != nil {
		t.Fatal(err)
	}
	return cert
}

// adminCert is the client option presenting the admin (superuser)
// certificate from the directory of the cluster CA file caFile.
func adminCert(caFile string) client.Opt {
	dir := filepath.Dir(caFile)
	return client.WithClientCertFile(filepath.Join(dir, transport.DevAdminName+".crt"), filepath.Join(dir, transport.DevAdminName+".key"))
}

// owner returns the broker owning shard of stream.
func (ip *inproc) owner(stream string, shard int) *Broker {
	ip.t.Helper()
	n, err := ip.ctl.Map().Owner(stream, shard)
	if err != nil {
		ip.t.Fatal(err)
	}
	for _, b := range ip.brokers {
		if b.NodeID() == n.ID {
			return b
		}
	}
	ip.t.Fatalf("no broker %s", n.ID)
	return nil
}

// nonOwner returns a broker not owning shard of stream.
func (ip *inproc) nonOwner(stream string, shard int) *Broker {
	o := ip.owner(stream, shard)
	for _, b := range ip.brokers {
		if b != o {
			return b
		}
	}
	ip.t.Fatal("every broker owns the shard")
	return nil
}

// wireStream is a raw stream speaking frames.
type wireStream struct {
	t *testing.T
	s *quic.Stream
	r *transport.Reader
	w *transport.Writer
}

func openStream(t *testing.T, conn *quic.Conn) *wireStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	s, err := conn.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.SetReadDeadline(time.Now().Add(waitFor))
	return &wireStream{t: t, s: s, r: transport.NewReader(s, 0), w: transport.NewWriter(s)}
}

func (ws *wireStream) send(f transport.Frame) {
	ws.t.Helper()
	if err := ws.w.Write(f); err != nil {
		ws.t.Fatal(err)
	}
}

func (ws *wireStream) recv() transport.Frame {
	ws.t.Helper()
	f, err := ws.r.Read()
	if err != nil {
		ws.t.Fatalf("reading a frame: %v", err)
	}
	return f
}

// recvEnd expects the broker to end the stream.
func (ws *wireStream) recvEnd() {
	ws.t.Helper()
	f, err := ws.r.Read()
	if err == nil {
		ws.t.Fatalf("expected the stream to end, got %T %+v", f, f)
	}
	var serr *quic.StreamError
	if !errors.Is(err, io.EOF) && !errors.As(err, &serr) {
		ws.t.Fatalf("expected the stream to end, got %v", err)
	}
}

// pooled returns the pool's connection to the peer id, nil if it has none.
func (p *peerPool) pooled(id string) *quic.Conn {
	p.mu.Lock()
	pc := p.mu.conns[id]
	p.mu.Unlock()
	if pc == nil {
		return nil
	}
	<-pc.ready
	return pc.conn
}

// sdk connects an admin SDK client to the cluster's first broker.
func (ip *inproc) sdk(t *testing.T, opts ...client.Opt) *client.Client {
	t.Helper()
	return ip.sdkAt(t, ip.brokers[0], opts...)
}

// sdkAt connects an admin SDK client whose home is b.
func (ip *inproc) sdkAt(t *testing.T, b *Broker, opts ...client.Opt) *client.Client {
	t.Helper()
	caFile := filepath.Join(ip.dir, "certs", "ca.crt")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Connect(ctx, b.Addr().String(),
		append([]client.Opt{client.WithCAFile(caFile), adminCert(caFile), client.WithLogger(quiet())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// dialAsPeer connects to target as broker node would, with node's own
// certificate from the cluster's certs directory; the connection is closed
// when the test ends.
func (ip *inproc) dialAsPeer(t *testing.T, target *Broker, node string) *quic.Conn {
	t.Helper()
	nt, err := cluster.LoadNodeTLS(filepath.Join(ip.dir, "certs"), node)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	conn, err := transport.Dial(ctx, target.Addr().String(), transport.VerifyPeer(nt.Peer, transport.RoleNode, target.NodeID()), transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.CloseWithError(0, "test done") })
	return conn
}
