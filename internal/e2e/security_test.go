package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"io/fs"
	"path/filepath"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/internal/clustertest"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestHostileIdentity runs the identity and authorization attacks against
// real `felix broker` processes: a client with no certificate, a principal
// with no permission, and certificates of the wrong role on the peer
// protocol. Nothing they try may change what is on disk, and an allowed
// principal keeps working.
func TestHostileIdentity(t *testing.T) {
	ctx := testCtx(t)
	c := clustertest.Start(t, 3)
	admin := clustertest.Connect(t, c, "broker-0")
	m := createStream(t, ctx, admin, shardmap.StreamConfig{Name: "orders", Shards: 1})
	owner, other := ownerAndOther(t, c, m, "orders")
	for i := range 5 {
		if _, err := admin.Publish(ctx, "orders", nil, []byte{byte('a' + i)}); err != nil {
			t.Fatal(err)
		}
	}
	ownerDir := c.Broker(owner).DataDir
	before := dirBytes(t, ownerDir)
	ca, err := transport.LoadCA(c.CAFile())
	if err != nil {
		t.Fatal(err)
	}

	t.Run("no certificate", func(t *testing.T) {
		for _, b := range c.Brokers() {
			if err := rawPublish(ctx, b.Addr, transport.ClientTLS(ca, nil, "", transport.ALPNClient), publishFrame("orders", "", "anonymous")); err == nil {
				t.Errorf("%s took a publish from a client with no certificate", b.ID)
			}
		}
		if _, err := client.Connect(ctx, c.Broker(other).Addr, client.WithCAFile(c.CAFile())); err == nil {
			t.Error("the SDK connected with no client certificate")
		}
	})

	mallory := issue(t, c, "mallory")
	t.Run("principal without permission", func(t *testing.T) {
		cl := clustertest.Connect(t, c, other, client.WithClientCertFile(mallory.cert, mallory.key))
		if _, err := cl.Publish(ctx, "orders", nil, []byte("forged")); !errors.Is(err, transport.ErrUnauthorized) {
			t.Errorf("publish: %v, want unauthorized", err)
		}
		if err := cl.CreateStream(ctx, shardmap.StreamConfig{Name: "mallory", Shards: 1}); !errors.Is(err, transport.ErrUnauthorized) {
			t.Errorf("create: %v, want unauthorized", err)
		}
		if err := cl.DeleteStream(ctx, "orders"); !errors.Is(err, transport.ErrUnauthorized) {
			t.Errorf("delete: %v, want unauthorized", err)
		}
		if streams, err := cl.Streams(ctx); err != nil || len(streams) != 0 {
			t.Errorf("mallory's stream list: %v, %v; want none visible", streams, err)
		}
		// Subscribing on the wire, at the owner itself.
		tlsConf := transport.ClientTLS(ca, loadCert(t, mallory), "", transport.ALPNClient)
		if err := rawSubscribe(ctx, c.Broker(owner).Addr, tlsConf, "orders"); !errors.Is(err, transport.ErrUnauthorized) {
			t.Errorf("subscribe: %v, want unauthorized", err)
		}
	})

	t.Run("wrong certificates on the peer protocol", func(t *testing.T) {
		dir := c.CertDir()
		for name, cert := range map[string]*tls.Certificate{
			"client certificate":        loadCert(t, mallory),
			"control plane certificate": loadCert(t, certFiles{filepath.Join(dir, "ctl.crt"), filepath.Join(dir, "ctl.key")}),
			"no certificate":            nil,
		} {
			if err := rawPublish(ctx, c.Broker(owner).Addr, transport.ClientTLS(ca, cert, "", transport.ALPNPeer), publishFrame("orders", owner, "peer")); err == nil {
				t.Errorf("%s: the owner took a forward", name)
			}
		}
		// A real node certificate claiming to forward for another node.
		liar := other
		for _, b := range c.Brokers() {
			if b.ID != owner && b.ID != other {
				liar = b.ID
			}
		}
		node := loadCert(t, certFiles{filepath.Join(dir, other+".crt"), filepath.Join(dir, other+".key")})
		p := publishFrame("orders", liar, "replayed")
		p.Epoch = m.Epoch
		if err := rawPublish(ctx, c.Broker(owner).Addr, transport.ClientTLS(ca, node, "", transport.ALPNPeer), p); !errors.Is(err, transport.ErrUnauthorized) {
			t.Errorf("%s's certificate forwarding as %s: %v, want unauthorized", other, liar, err)
		}
	})

	// Nothing of the above reached the disk or the registry.
	if after := dirBytes(t, ownerDir); after != before {
		t.Errorf("the owner's data grew from %d to %d bytes under refused requests", before, after)
	}
	sub, err := admin.Subscribe(ctx, "orders", client.Earliest())
	if err != nil {
		t.Fatal(err)
	}
	next, stop := iterPull(ctx, sub)
	for i := range 5 {
		if v := next(t); v != string(rune('a'+i)) {
			t.Fatalf("record %d = %q after the attacks", i, v)
		}
	}
	stop()
	sub.Stop()
	if streams, err := admin.Streams(ctx); err != nil || len(streams) != 1 {
		t.Fatalf("streams after the attacks: %v, %v", streams, err)
	}

	t.Run("allowed principal", func(t *testing.T) {
		for _, a := range []auth.Action{auth.Publish, auth.Subscribe} {
			if err := admin.Grant(ctx, auth.Grant{Principal: "mallory", Action: a, Pattern: "orders"}); err != nil {
				t.Fatal(err)
			}
		}
		cl := clustertest.Connect(t, c, other, client.WithClientCertFile(mallory.cert, mallory.key))
		var ack client.Ack
		// The grant reaches each broker with the next map.
		deadline := time.Now().Add(10 * time.Second)
		for {
			ack, err = cl.Publish(ctx, "orders", nil, []byte("granted"))
			if err == nil || time.Now().After(deadline) || !errors.Is(err, transport.ErrUnauthorized) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil || ack.Offset != 5 || ack.Owner != owner {
			t.Fatalf("mallory's granted publish: %+v, %v; want offset 5 on %s", ack, err, owner)
		}
		sub, err := cl.Subscribe(ctx, "orders", client.AtOffset(5))
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Stop()
		next, stop := iterPull(ctx, sub)
		defer stop()
		if v := next(t); v != "granted" {
			t.Fatalf("mallory reads %q", v)
		}
	})
}

type certFiles struct{ cert, key string }

func issue(t *testing.T, c *cluster.Cluster, name string) certFiles {
	t.Helper()
	cert, key, err := c.IssueClientCert(name)
	if err != nil {
		t.Fatal(err)
	}
	return certFiles{cert, key}
}

func loadCert(t *testing.T, f certFiles) *tls.Certificate {
	t.Helper()
	cert, err := transport.LoadKeyPair(f.cert, f.key)
	if err != nil {
		t.Fatal(err)
	}
	return &cert
}

func publishFrame(stream, via, value string) *transport.Publish {
	return &transport.Publish{Seq: 1, Stream: stream, Shard: -1, Via: via, Value: []byte(value)}
}

// rawPublish dials addr with tlsConf, publishes p on a new stream and
// returns nil only if it was acked. Every failure on the way (handshake,
// connection closed by the broker, an Error frame) is returned.
func rawPublish(ctx context.Context, addr string, tlsConf *tls.Config, p *transport.Publish) error {
	return rawExchange(ctx, addr, tlsConf, p)
}

// rawSubscribe subscribes to shard 0 of stream and returns the broker's
// error, or nil if it sent records or nothing.
func rawSubscribe(ctx context.Context, addr string, tlsConf *tls.Config, stream string) error {
	return rawExchange(ctx, addr, tlsConf, &transport.Subscribe{Stream: stream, Start: transport.StartEarliest, Credit: 10})
}

func rawExchange(ctx context.Context, addr string, tlsConf *tls.Config, f transport.Frame) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := transport.Dial(ctx, addr, tlsConf, transport.Config{})
	if err != nil {
		return err
	}
	defer conn.CloseWithError(0, "")
	s, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	defer s.CancelRead(0)
	s.SetDeadline(time.Now().Add(5 * time.Second))
	if err := transport.NewWriter(s).Write(f); err != nil {
		return err
	}
	reply, err := transport.NewReader(s, 0).Read()
	if err != nil {
		var appErr *quic.ApplicationError
		if errors.As(err, &appErr) && transport.ErrorCode(appErr.ErrorCode) == transport.CodeUnauthorized {
			return &transport.Error{Code: transport.CodeUnauthorized, Message: appErr.ErrorMessage}
		}
		return err
	}
	if e, ok := reply.(*transport.Error); ok {
		return e
	}
	return nil
}

// dirBytes returns the total size of the files under dir.
func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err == nil {
			n += info.Size()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
