package ctl

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.uber.org/zap"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

func TestCheckPlaintext(t *testing.T) {
	three := "a=https://10.0.0.1:2380,b=https://10.0.0.2:2380,c=https://10.0.0.3:2380"
	for _, tc := range []struct {
		name string
		ec   EtcdConfig
		urls etcdURLs
		ok   bool
	}{
		{"single member on loopback", EtcdConfig{}, etcdURLs{"http://127.0.0.1:1", "http://127.0.0.1:2"}, false},
		{"single member, localhost", EtcdConfig{}, etcdURLs{"http://localhost:1", "http://[::1]:2"}, false},
		{"single member on loopback, plaintext client only", EtcdConfig{}, etcdURLs{"http://127.0.0.1:1", "https://127.0.0.1:2"}, false},
		{"single member on loopback, plaintext peer only", EtcdConfig{}, etcdURLs{"https://127.0.0.1:1", "http://127.0.0.1:2"}, false},
		{"single member on loopback over https (the default)", EtcdConfig{}, etcdURLs{"https://127.0.0.1:1", "https://127.0.0.1:2"}, true},
		{"single member on loopback, Insecure", EtcdConfig{Insecure: true}, etcdURLs{"http://127.0.0.1:1", "http://127.0.0.1:2"}, true},
		{"standalone member on loopback (felix etcd)", EtcdConfig{standalone: true}, etcdURLs{"http://127.0.0.1:1", "http://127.0.0.1:2"}, true},
		{"standalone member, localhost", EtcdConfig{standalone: true}, etcdURLs{"http://localhost:1", "http://[::1]:2"}, true},
		{"standalone member off loopback", EtcdConfig{standalone: true}, etcdURLs{"http://10.0.0.1:2379", "http://127.0.0.1:2"}, false},
		{"client url off loopback", EtcdConfig{}, etcdURLs{"http://0.0.0.0:2379", "http://127.0.0.1:2"}, false},
		{"client url by name", EtcdConfig{}, etcdURLs{"http://ctl-0:2379", "http://127.0.0.1:2"}, false},
		{"peer url off loopback", EtcdConfig{}, etcdURLs{"http://127.0.0.1:1", "http://10.0.0.1:2380"}, false},
		{"https off loopback", EtcdConfig{}, etcdURLs{"https://ctl-0:2379", "https://ctl-0:2380"}, true},
		{"three members over https", EtcdConfig{InitialCluster: three}, etcdURLs{"https://10.0.0.1:2379", "https://10.0.0.1:2380"}, true},
		{"three members, one http peer", EtcdConfig{InitialCluster: three + ",d=http://10.0.0.4:2380"}, etcdURLs{"https://10.0.0.1:2379", "https://10.0.0.1:2380"}, false},
		{"three members over http on loopback", EtcdConfig{InitialCluster: "a=http://127.0.0.1:1,b=http://127.0.0.1:2,c=http://127.0.0.1:3"},
			etcdURLs{"http://127.0.0.1:4", "http://127.0.0.1:1"}, false},
		{"three members over http, Insecure", EtcdConfig{InitialCluster: "a=http://10.0.0.1:2380,b=http://10.0.0.2:2380,c=http://10.0.0.3:2380", Insecure: true},
			etcdURLs{"http://10.0.0.1:2379", "http://10.0.0.1:2380"}, true},
		{"one member listed twice", EtcdConfig{InitialCluster: "a=http://127.0.0.1:1,a=http://[::1]:1", standalone: true}, etcdURLs{"http://127.0.0.1:4", "http://127.0.0.1:1"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkPlaintext(tc.ec, tc.urls)
			if tc.ok != (err == nil) {
				t.Fatalf("checkPlaintext(%+v, %+v) = %v, want ok=%v", tc.ec, tc.urls, err, tc.ok)
			}
			if err != nil && !errors.Is(err, errPlaintext) {
				t.Fatalf("error %v is not errPlaintext", err)
			}
		})
	}
}

// TestHAPlaintextPeersRefused: a multi-member embedded cluster over http
// does not start, before listening on anything.
func TestHAPlaintextPeersRefused(t *testing.T) {
	dir := t.TempDir()
	_, err := New(Config{DataDir: dir, Logger: testLogger(t), Etcd: EtcdConfig{Name: "a",
		PeerURL: "http://127.0.0.1:1", InitialCluster: "a=http://127.0.0.1:1,b=http://127.0.0.1:2,c=http://127.0.0.1:3"}})
	if !errors.Is(err, errPlaintext) {
		t.Fatalf("New with http peers: %v, want errPlaintext", err)
	}
}

// TestEarlierCtlCertificate: a ctl certificate issued before ctl
// certificates named their member in transport.CtlMemberDomain (which
// the peers' etcd now require) keeps a single ctl starting, which has no
// peer; a member of several does not start, saying to issue it again.
func TestEarlierCtlCertificate(t *testing.T) {
	p := newPKI(t)
	ca, err := transport.LoadCAKeyPair(filepath.Join(p.dir, "ca.crt"), filepath.Join(p.dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "ctl", Organization: []string{"Felix"}, OrganizationalUnit: []string{string(transport.RoleCtl)}},
		NotBefore:    time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"ctl", "localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	old := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	certFile, keyFile := filepath.Join(t.TempDir(), "ctl.crt"), filepath.Join(t.TempDir(), "ctl.key")
	if err := transport.WriteKeyPair(old, certFile, keyFile); err != nil {
		t.Fatal(err)
	}

	cfg := p.ctlConfig(t, t.TempDir(), "127.0.0.1:0")
	cfg.Etcd.CertFile, cfg.Etcd.KeyFile = certFile, keyFile
	startConfig(t, cfg)

	cfg = planHA(t, p, 3)[0]
	cfg.Etcd.CertFile, cfg.Etcd.KeyFile = certFile, keyFile
	if srv, err := New(cfg); err == nil {
		srv.Close()
		t.Fatal("a member of three started with a ctl certificate its peers refuse")
	} else if !strings.Contains(err.Error(), "felix certs ctl ctl") {
		t.Fatalf("New: %v, want an error saying to issue the certificate again", err)
	}
}

// TestEmbeddedEtcdServesCtlCertificatesOnly: a ctl started with the
// defaults serves its embedded etcd on https://127.0.0.1 (client and peer
// URLs, recorded in DataDir/etcd-urls.json), to ctl certificates of the
// cluster CA only. A local process with no credential (plaintext, or TLS
// with no certificate), or with a client or node certificate, can neither
// list ctl's keys nor grant itself cluster.admin by writing a grant key,
// as any local user could through the plaintext loopback URL earlier
// versions served. The data dir, found open to others (0755), is made
// the owner's only.
func TestEmbeddedEtcdServesCtlCertificatesOnly(t *testing.T) {
	p := newPKI(t)
	dir := filepath.Join(t.TempDir(), "ctl")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	srv := startCtl(t, p, dir, "127.0.0.1:0")
	if err := srv.Grant(auth.Grant{Principal: "alice", Action: auth.Publish, Pattern: "payroll"}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("data dir: %v, %v; want mode 0700", fi.Mode(), err)
	}
	urls := recordedURLs(t, dir)
	for _, u := range []string{urls.Client, urls.Peer} {
		if !strings.HasPrefix(u, "https://127.0.0.1:") {
			t.Errorf("embedded etcd URL %s, want https://127.0.0.1:<port>", u)
		}
	}
	withCert := func(name string) *tls.Config {
		cert := p.cert(t, name)
		return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: p.ca, Certificates: []tls.Certificate{cert}}
	}
	for _, a := range []struct {
		name string
		url  string
		tls  *tls.Config
	}{
		{"no credential, plaintext", "http://" + strings.TrimPrefix(urls.Client, "https://"), nil},
		{"TLS with no certificate", urls.Client, &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: p.ca}},
		{"client certificate", urls.Client, withCert(transport.DevAdminName)},
		{"node certificate", urls.Client, withCert("b0")},
	} {
		t.Run(a.name, func(t *testing.T) {
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{a.url}, TLS: a.tls, DialTimeout: time.Second, Logger: zap.NewNop()})
			if err != nil {
				t.Logf("refused: %v", err)
				return
			}
			defer cli.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if resp, err := cli.Get(ctx, "/felix/", clientv3.WithPrefix(), clientv3.WithKeysOnly()); err == nil {
				t.Errorf("listed %d keys of ctl's state", len(resp.Kvs))
			} else {
				t.Logf("read refused: %v", err)
			}
			ctx, cancel = context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if _, err := cli.Put(ctx, "/felix/default/grants/mallory/cluster.admin/%2A", `{"principal":"mallory","action":"cluster.admin","pattern":"*"}`); err == nil {
				t.Errorf("wrote a grant of cluster.admin into ctl's state")
			} else {
				t.Logf("write refused: %v", err)
			}
		})
	}
	// The same read with a ctl certificate succeeds: the refusals above
	// are about the credentials.
	if err := readState(t, urls.Client, filepath.Join(p.dir, "ctl.crt"), filepath.Join(p.dir, "ctl.key"), filepath.Join(p.dir, "ca.crt")); err != nil {
		t.Fatalf("an etcd client with a ctl certificate: %v", err)
	}
	srv.Close()
	srv = startCtl(t, p, dir, "127.0.0.1:0")
	if acl := srv.Map().ACL; acl.Allows("mallory", auth.ClusterAdmin, "") || !acl.Allows("alice", auth.Publish, "payroll") {
		t.Errorf("after restart, grants %v: want alice's alone", acl.Grants)
	}
}

// TestEmbeddedEtcdPlaintextURLsUpgraded: the plaintext loopback URLs an
// earlier version chose and recorded in DataDir/etcd-urls.json (its
// member created with them) are served as https:// on the same ports
// once ctl restarts without EtcdConfig.Insecure, the state kept; with
// Insecure they are kept as they are.
func TestEmbeddedEtcdPlaintextURLsUpgraded(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	ports, err := freeTCPPorts(2)
	if err != nil {
		t.Fatal(err)
	}
	old := etcdURLs{Client: fmt.Sprintf("http://127.0.0.1:%d", ports[0]), Peer: fmt.Sprintf("http://127.0.0.1:%d", ports[1])}
	start := func(ec EtcdConfig) (*Server, etcdURLs) {
		t.Helper()
		srv, err := New(Config{DataDir: dir, Etcd: ec, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		urls := recordedURLs(t, dir)
		return srv, urls
	}
	ec := p.etcd()
	ec.ClientURL, ec.PeerURL, ec.Insecure = old.Client, old.Peer, true
	srv, _ := start(ec)
	if err := srv.CreateStream(shardmap.StreamConfig{Name: "orders", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	srv.Close()

	ec = p.etcd()
	ec.Insecure = true
	srv, urls := start(ec)
	srv.Close()
	if urls != old {
		t.Errorf("with Insecure, recorded URLs %+v, want %+v as they were", urls, old)
	}

	srv, urls = start(p.etcd())
	defer srv.Close()
	want := etcdURLs{Client: fmt.Sprintf("https://127.0.0.1:%d", ports[0]), Peer: fmt.Sprintf("https://127.0.0.1:%d", ports[1])}
	if urls != want {
		t.Errorf("recorded URLs %+v, want %+v", urls, want)
	}
	if got := srv.etcd.clientURL; got != want.Client {
		t.Errorf("serves clients on %s, want %s", got, want.Client)
	}
	if _, ok := srv.Map().Stream("orders"); !ok {
		t.Errorf("state lost: %+v", srv.Map())
	}
}

// TestEmbeddedEtcdNeedsCertificates: with no certificate files, ctl's
// embedded etcd does not start, saying which files it needs.
func TestEmbeddedEtcdNeedsCertificates(t *testing.T) {
	_, err := New(Config{DataDir: t.TempDir(), Logger: testLogger(t)})
	if err == nil || !strings.Contains(err.Error(), "CertFile, KeyFile and CAFile") {
		t.Fatalf("New with no certificate files: %v, want an error naming them", err)
	}
}

// TestHARefusesIntruders starts two ctls of a three-member cluster over
// TLS, a quorum, and puts an etcd member presenting a certificate that is
// not a ctl member's in the third one's place: it must not join (never
// ready, none of the state in its store); a member's peer port must not
// answer such a certificate; and an etcd client presenting one must not
// read from a member's client URL. Among them, certificates of the CA
// of other roles under a member's name: the peer port checked names
// only (the CN), and took them for the member.
func TestHARefusesIntruders(t *testing.T) {
	p := newPKI(t)
	awaitPeerConnsClosed(t)
	plan := planHA(t, p, 3)
	srvs := make([]*Server, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range srvs {
		wg.Add(1)
		go func() { defer wg.Done(); srvs[i], errs[i] = New(plan[i]) }()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("ctl-%d: %v", i, err)
		}
	}
	startAll(t, srvs)
	leader := waitLeader(t, srvs, nil)
	if err := leader.CreateStream(shardmap.StreamConfig{Name: "secret", Shards: 1}); err != nil {
		t.Fatal(err)
	}

	other := t.TempDir()
	if err := transport.GenerateDevCerts(other, "ctl"); err != nil {
		t.Fatal(err)
	}
	// Certificates of the cluster's CA named as the missing member
	// (ctl-2), or as the ctl certificate the members share (ctl): a
	// client's with no host names, as `felix certs client` issued them
	// before it refused such names, and a broker's naming its host
	// (issued here past that check, as a CA run by other tools would).
	named := t.TempDir()
	p.issue(t, named, transport.RoleClient, "ctl-2")
	p.issue(t, named, transport.RoleNode, "ctl", "127.0.0.1")
	intruders := []struct {
		name, dir, cert string
	}{
		{"node certificate", p.dir, "b0"},
		{"client certificate", p.dir, transport.DevAdminName},
		{"ctl certificate of another CA", other, "ctl"},
		{"node certificate named as the members' certificate", named, "ctl"},
		{"client certificate named as the member", named, "ctl-2"},
	}
	for _, in := range intruders {
		t.Run(in.name, func(t *testing.T) {
			certFile, keyFile := filepath.Join(in.dir, in.cert+".crt"), filepath.Join(in.dir, in.cert+".key")
			caFile := filepath.Join(in.dir, "ca.crt")

			// As a peer asking ctl-0's peer port for the members.
			if err := peerMembers(t, plan[0].Etcd.PeerURL, certFile, keyFile, caFile); err == nil {
				t.Errorf("ctl-0's etcd peer port answered a %s", in.name)
			} else {
				t.Logf("peer port to a %s: %v", in.name, err)
			}

			// As a member in ctl-2's place.
			e, stop := startIntruder(t, plan[2], certFile, keyFile, caFile)
			select {
			case <-e.Server.ReadyNotify():
				t.Errorf("a member with a %s joined the cluster", in.name)
			case err := <-e.Err():
				t.Logf("intruder stopped: %v", err)
			case <-time.After(3 * time.Second): // ctl-0 and ctl-1 elected a leader in less
			}
			r, err := e.Server.KV().Range(context.Background(), []byte("/felix/"), []byte("/felix0"), mvcc.RangeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Count != 0 {
				t.Errorf("a member with a %s holds %d keys of the state", in.name, r.Count)
			}
			stop()

			// As an etcd client of ctl-0's client URL.
			if err := readState(t, plan[0].Etcd.ClientURL, certFile, keyFile, caFile); err == nil {
				t.Errorf("an etcd client with a %s read the state", in.name)
			} else {
				t.Logf("client with a %s: %v", in.name, err)
			}
		})
	}
	// The same read and request with a ctl certificate succeed: the
	// refusals above are about the certificates.
	if err := readState(t, plan[0].Etcd.ClientURL, plan[0].Etcd.CertFile, plan[0].Etcd.KeyFile, plan[0].Etcd.CAFile); err != nil {
		t.Fatalf("an etcd client with a ctl certificate: %v", err)
	}
	if err := peerMembers(t, plan[0].Etcd.PeerURL, plan[0].Etcd.CertFile, plan[0].Etcd.KeyFile, plan[0].Etcd.CAFile); err != nil {
		t.Fatalf("ctl-0's etcd peer port to a ctl certificate: %v", err)
	}
	// And the two ctls still serve.
	if _, ok := waitLeader(t, srvs, nil).Map().Stream("secret"); !ok {
		t.Fatal("stream lost")
	}
}

// startIntruder starts a bare etcd member under the name and URLs of cfg
// (a ctl's), presenting certFile, trusting caFile, with none of ctl's own
// checks of its configuration: what an attacker holding those files would
// run. stop stops it (also done when the test ends).
func startIntruder(t *testing.T, cfg Config, certFile, keyFile, caFile string) (e *embed.Etcd, stop func()) {
	t.Helper()
	ec := cfg.Etcd
	c := embed.NewConfig()
	c.Name = ec.Name
	c.Dir = filepath.Join(t.TempDir(), "etcd")
	cu, pu := mustURL(t, ec.ClientURL), mustURL(t, ec.PeerURL)
	c.ListenClientUrls, c.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	c.ListenPeerUrls, c.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	c.InitialCluster = ec.InitialCluster
	c.InitialClusterToken = "felix-" + clusterName(ec)
	c.TickMs, c.ElectionMs = ec.TickMs, ec.ElectionMs
	c.PeerTLSInfo.CertFile, c.PeerTLSInfo.KeyFile, c.PeerTLSInfo.TrustedCAFile = certFile, keyFile, caFile
	c.PeerTLSInfo.ClientCertAuth = true
	c.PeerTLSInfo.SkipClientSANVerify = true
	c.ClientTLSInfo = c.PeerTLSInfo
	c.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(c)
	if err != nil {
		t.Fatalf("intruder: %v", err)
	}
	// A member that never became ready serves no clients; Close waits
	// for its client servers unless the server is stopped first.
	var once sync.Once
	stop = func() { once.Do(func() { e.Server.Stop(); e.Close() }) }
	t.Cleanup(stop)
	return e, stop
}

// readState reads ctl's keys from the etcd client URL u with an etcd
// client presenting certFile and trusting caFile.
func readState(t *testing.T, u, certFile, keyFile, caFile string) error {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{u},
		TLS:         filesTLS(t, certFile, keyFile, caFile),
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	r, err := cli.Get(ctx, "/felix/", clientv3.WithPrefix())
	if err != nil {
		return err
	}
	if len(r.Kvs) == 0 {
		return fmt.Errorf("no keys under /felix/")
	}
	return nil
}

// filesTLS is client TLS presenting certFile and trusting caFile.
func filesTLS(t *testing.T, certFile, keyFile, caFile string) *tls.Config {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := transport.LoadCA(caFile)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: ca, Certificates: []tls.Certificate{cert}}
}

// peerMembers asks the etcd peer port at u for its cluster's members
// (GET /members), presenting certFile and trusting caFile.
func peerMembers(t *testing.T, u, certFile, keyFile, caFile string) error {
	tr := &http.Transport{TLSClientConfig: filesTLS(t, certFile, keyFile, caFile)}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 3 * time.Second}
	resp, err := c.Get(u + "/members")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /members: %s", resp.Status)
	}
	return nil
}

func mustURL(t *testing.T, s string) url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return *u
}

// recordedURLs reads the embedded member's URLs as ctl recorded them in
// dir.
func recordedURLs(t *testing.T, dir string) etcdURLs {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, etcdURLsFile))
	if err != nil {
		t.Fatal(err)
	}
	var urls etcdURLs
	if err := json.Unmarshal(b, &urls); err != nil {
		t.Fatal(err)
	}
	return urls
}
