package dockertest

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/transport"
)

// Options configures a cluster; the zero value of every field means its
// default.
type Options struct {
	// Ctls is the number of `felix ctl` containers, which form an
	// embedded etcd cluster of as many members. Default 3.
	Ctls int
	// Brokers is the number of `felix broker` containers. Default 3.
	Brokers int
	// LeaseTTL is the brokers' lease (felix ctl and felix broker
	// --lease-ttl). Default 3s, the binaries' default.
	LeaseTTL time.Duration
	// ExternalEtcd runs the state in an etcd cluster of three `felix etcd`
	// containers, which the ctls reach with --etcd-endpoints, instead of
	// the ctls' embedded members.
	ExternalEtcd bool
}

func (o Options) withDefaults() Options {
	if o.Ctls <= 0 {
		o.Ctls = 3
	}
	if o.Brokers <= 0 {
		o.Brokers = 3
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = 3 * time.Second
	}
	return o
}

// Ports inside every container.
const (
	quicPort     = 7000 // felix ctl's and felix broker's QUIC listener
	etcdClient   = 2379
	etcdPeer     = 2380
	adminPort    = 9100
	ctlIPBase    = 10 // ctl-i has host address ctlIPBase+i on the cluster's /24
	brokerIPBase = 20
	etcdIPBase   = 30 // etcd-i, with Options.ExternalEtcd
	externalEtcd = 3  // members of the external etcd cluster
)

// Node is one container of the cluster.
type Node struct {
	// Name is the node's name: its node id and certificate name
	// ("broker-1") or its ctl and etcd member name ("ctl-0").
	Name string
	// Container is the container's name.
	Container string
	// IP is its address on the cluster's network, which the host
	// reaches too.
	IP string
	// Addr is its QUIC address, IP:7000.
	Addr string

	args  []string // docker run arguments
	certs bool     // whether it has a certificate directory to mount
}

// Cluster is a Felix cluster of containers on a Docker network of its
// own: Options.Ctls control plane members and Options.Brokers brokers,
// every one reachable from the test process at its Node.IP.
type Cluster struct {
	t       testing.TB
	opts    Options
	id      string // the run's id, in every name
	network string
	prefix  string // the network's first three octets and a dot
	image   string
	dir     string

	ca    *x509.CertPool
	admin tls.Certificate
	// etcdCert is a ctl certificate the test's own etcd clients present:
	// the etcd members serve only felix-ctl certificates.
	etcdCert tls.Certificate

	Ctls    []*Node
	Brokers []*Node
	// Etcds are the members of the external etcd cluster
	// (Options.ExternalEtcd), else none.
	Etcds []*Node

	etcdCli *clientv3.Client // see Etcd
}

var build struct {
	once  sync.Once
	dir   string
	image string
	err   error
}

// Image returns the felix image built once per test process from the code
// under test.
func Image(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		build.dir, build.err = os.MkdirTemp("", "felix-dockertest-")
		if build.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		build.image, build.err = BuildImage(ctx, build.dir)
	})
	if build.err != nil {
		t.Fatalf("building the felix image: %v", build.err)
	}
	return build.image
}

// Cleanup removes the build directory of Image; call it from TestMain
// after m.Run. The image stays, for the next run of the same code.
func Cleanup() {
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
}

// Start starts a cluster and removes it (containers and network) when the
// test ends, printing the containers' logs first if it failed. It skips
// the test when no Docker engine is available. It returns once every
// broker is live in the map and one ctl leads.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := Available(ctx); err != nil {
		t.Skipf("the multi-host tests need a Docker engine: %v", err)
	}
	c := &Cluster{t: t, opts: opts.withDefaults(), image: Image(t), dir: t.TempDir()}
	c.id = randomHex(4)
	if err := c.createNetwork(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.remove)
	if err := c.writePKI(); err != nil {
		t.Fatal(err)
	}
	c.plan()
	// The external etcd first: a ctl that finds no etcd quorum exits.
	for _, n := range c.Etcds {
		if _, err := docker(ctx, n.args...); err != nil {
			t.Fatalf("starting %s: %v", n.Name, err)
		}
	}
	if err := c.waitEtcd(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range append(append([]*Node{}, c.Ctls...), c.Brokers...) {
		if _, err := docker(ctx, n.args...); err != nil {
			t.Fatalf("starting %s: %v", n.Name, err)
		}
	}
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatalf("the cluster did not come up: %v", err)
	}
	return c
}

// createNetwork creates the cluster's network on a /24 of 10.0.0.0/8 that
// no other network uses.
func (c *Cluster) createNetwork(ctx context.Context) error {
	c.network = "felix-dt-" + c.id
	var last error
	for range 20 {
		a, _ := rand.Int(rand.Reader, big.NewInt(50))
		b, _ := rand.Int(rand.Reader, big.NewInt(256))
		prefix := fmt.Sprintf("10.%d.%d.", 200+a.Int64(), b.Int64())
		_, err := docker(ctx, "network", "create", "--label", label+"="+c.id, "--subnet", prefix+"0/24", c.network)
		if err == nil {
			c.prefix = prefix
			return nil
		}
		last = err
		if !strings.Contains(err.Error(), "overlap") {
			break
		}
	}
	return fmt.Errorf("dockertest: create a network: %w", last)
}

// plan names the nodes and their docker run arguments.
func (c *Cluster) plan() {
	// The etcd members: the ctls' embedded ones, or felix etcd
	// containers. Either way, the same flags name them.
	var etcdNodes []*Node
	for i := range c.opts.Ctls {
		n := c.node("ctl-"+strconv.Itoa(i), ctlIPBase+i)
		n.certs = true
		c.Ctls = append(c.Ctls, n)
	}
	etcdNodes = c.Ctls
	if c.opts.ExternalEtcd {
		for i := range externalEtcd {
			n := c.node("etcd-"+strconv.Itoa(i), etcdIPBase+i)
			n.certs = true
			c.Etcds = append(c.Etcds, n)
		}
		etcdNodes = c.Etcds
	}
	var peers []string
	for _, n := range etcdNodes {
		peers = append(peers, fmt.Sprintf("%s=https://%s:%d", n.Name, n.IP, etcdPeer))
	}
	// member names n's etcd member with flags of prefix: "--etcd-" for
	// felix ctl, "--" for felix etcd.
	member := func(prefix string, n *Node) []string {
		return []string{prefix + "name", n.Name,
			prefix + "client-url", etcdURL(n),
			prefix + "peer-url", fmt.Sprintf("https://%s:%d", n.IP, etcdPeer),
			prefix + "initial-cluster", strings.Join(peers, ",")}
	}
	for _, n := range c.Etcds {
		n.args = c.runArgs(n, "etcd", append([]string{"--data", "/data", "--certs", "/certs"}, member("--", n)...)...)
	}

	var ctlAddrs []string
	for _, n := range c.Ctls {
		ctlAddrs = append(ctlAddrs, n.Addr)
	}
	lease := c.opts.LeaseTTL.String()
	for _, n := range c.Ctls {
		args := []string{"--listen", fmt.Sprintf("0.0.0.0:%d", quicPort), "--advertise", n.Addr,
			"--data", "/data", "--certs", "/certs", "--superuser", transport.DevAdminName,
			"--lease-ttl", lease, "--admin", fmt.Sprintf("0.0.0.0:%d", adminPort)}
		if c.opts.ExternalEtcd {
			args = append(args, "--etcd-name", n.Name, "--etcd-endpoints", strings.Join(c.EtcdEndpoints(), ","),
				"--etcd-ca", "/certs/ca.crt", "--etcd-cert", "/certs/ctl.crt", "--etcd-key", "/certs/ctl.key")
		} else {
			args = append(args, member("--etcd-", n)...)
		}
		n.args = c.runArgs(n, "ctl", args...)
	}
	for i := range c.opts.Brokers {
		n := c.node("broker-"+strconv.Itoa(i), brokerIPBase+i)
		n.certs = true
		c.Brokers = append(c.Brokers, n)
		n.args = c.runArgs(n, "broker", "--id", n.Name,
			"--listen", fmt.Sprintf("0.0.0.0:%d", quicPort), "--advertise", n.Addr,
			"--ctl", strings.Join(ctlAddrs, ","),
			"--data", "/data", "--certs", "/certs", "--lease-ttl", lease,
			"--admin", fmt.Sprintf("0.0.0.0:%d", adminPort))
	}
}

func (c *Cluster) node(name string, host int) *Node {
	ip := c.prefix + strconv.Itoa(host)
	return &Node{Name: name, Container: "felix-dt-" + c.id + "-" + name, IP: ip, Addr: fmt.Sprintf("%s:%d", ip, quicPort)}
}

func (c *Cluster) runArgs(n *Node, cmd string, args ...string) []string {
	run := []string{"run", "--detach", "--name", n.Container, "--hostname", n.Name,
		"--label", label + "=" + c.id, "--network", c.network, "--ip", n.IP}
	if n.certs {
		run = append(run, "--volume", filepath.Join(c.dir, n.Name)+":/certs:ro")
	}
	return append(append(run, c.image, cmd), args...)
}

// etcdURL is the client URL of the etcd member n runs (a ctl's embedded
// member, or an external one).
func etcdURL(n *Node) string { return fmt.Sprintf("https://%s:%d", n.IP, etcdClient) }

// EtcdEndpoints are the client URLs of the cluster's etcd members: the
// external ones, else the ctls' embedded ones.
func (c *Cluster) EtcdEndpoints() []string {
	nodes := c.Etcds
	if len(nodes) == 0 {
		nodes = c.Ctls
	}
	var out []string
	for _, n := range nodes {
		out = append(out, etcdURL(n))
	}
	return out
}

// writePKI writes a CA and each node's certificate directory (ca.crt and
// its key pair; the ctls' files named ctl.crt and ctl.key, as felix ctl
// reads them), with the node's IP address as a subject alternative name,
// and keeps the admin client certificate for the test's clients.
func (c *Cluster) writePKI() error {
	ca, err := transport.NewCA("Felix dockertest CA " + c.id)
	if err != nil {
		return err
	}
	c.ca = ca.Pool()
	if c.admin, err = ca.Issue(transport.RoleClient, transport.DevAdminName); err != nil {
		return err
	}
	issue := func(role transport.Role, name, file string, host int) error {
		dir := filepath.Join(c.dir, name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		if err := ca.WriteCert(filepath.Join(dir, "ca.crt")); err != nil {
			return err
		}
		cert, err := ca.Issue(role, name, c.prefix+strconv.Itoa(host))
		if err != nil {
			return err
		}
		return transport.WriteKeyPair(cert, filepath.Join(dir, file+".crt"), filepath.Join(dir, file+".key"))
	}
	for i := range c.opts.Ctls {
		if err := issue(transport.RoleCtl, "ctl-"+strconv.Itoa(i), "ctl", ctlIPBase+i); err != nil {
			return err
		}
	}
	if c.opts.ExternalEtcd {
		for i := range externalEtcd {
			if err := issue(transport.RoleCtl, "etcd-"+strconv.Itoa(i), "ctl", etcdIPBase+i); err != nil {
				return err
			}
		}
	}
	if c.etcdCert, err = ca.Issue(transport.RoleCtl, "dockertest"); err != nil {
		return err
	}
	for i := range c.opts.Brokers {
		name := "broker-" + strconv.Itoa(i)
		if err := issue(transport.RoleNode, name, name, brokerIPBase+i); err != nil {
			return err
		}
	}
	return nil
}

// Client connects an SDK client, as the superuser admin, to broker b.
func (c *Cluster) Client(ctx context.Context, b *Node, opts ...client.Opt) (*client.Client, error) {
	opts = append([]client.Opt{client.WithCA(c.ca), client.WithClientCert(c.admin)}, opts...)
	return client.Connect(ctx, b.Addr, opts...)
}

// Kill kills n's process with SIGKILL (docker kill): no goodbye to anyone.
// Its container stays, with its data, for Restart.
func (c *Cluster) Kill(ctx context.Context, n *Node) error {
	_, err := docker(ctx, "kill", "--signal", "KILL", n.Container)
	return err
}

// Restart starts n's container again after Kill: the same process
// arguments, address and data.
func (c *Cluster) Restart(ctx context.Context, n *Node) error {
	_, err := docker(ctx, "start", n.Container)
	return err
}

// Ctl returns the ctl node named name, or nil.
func (c *Cluster) Ctl(name string) *Node {
	for _, n := range c.Ctls {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// ControlPlane asks broker b for the control plane's members, with a
// fresh client (the broker relays the request to the ctl it is
// registered with).
func (c *Cluster) ControlPlane(ctx context.Context, b *Node) ([]client.CtlMember, error) {
	cl, err := c.Client(ctx, b)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	return cl.ControlPlane(ctx)
}

// WaitHealthy waits until, as every broker sees it, every broker is live,
// every ctl is a member with a healthy etcd member, and one of them
// leads.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	return poll(ctx, func() error { return c.healthy(ctx) })
}

// poll calls f every 200ms until it returns nil or ctx ends, and then
// returns ctx's error with f's last.
func poll(ctx context.Context, f func() error) error {
	for {
		last := f()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w; last: %v", ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (c *Cluster) healthy(ctx context.Context) error {
	for _, b := range c.Brokers {
		if err := c.healthyVia(ctx, b); err != nil {
			return fmt.Errorf("via %s: %w", b.Name, err)
		}
	}
	return nil
}

func (c *Cluster) healthyVia(ctx context.Context, b *Node) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cl, err := c.Client(ctx, b)
	if err != nil {
		return err
	}
	defer cl.Close()
	m, err := cl.ClusterStatus(ctx)
	if err != nil {
		return err
	}
	live := 0
	for _, n := range m.Nodes {
		if n.Live {
			live++
		}
	}
	if live != len(c.Brokers) {
		return fmt.Errorf("%d of %d brokers live at epoch %d", live, len(c.Brokers), m.Epoch)
	}
	members, err := cl.ControlPlane(ctx)
	if err != nil {
		return err
	}
	leaders := 0
	for _, m := range members {
		if !m.EtcdHealthy {
			return fmt.Errorf("%s's etcd member is not healthy: %s", m.Name, m.EtcdError)
		}
		if m.Role == "leader" {
			leaders++
		}
	}
	if len(members) != len(c.Ctls) || leaders != 1 {
		return fmt.Errorf("control plane %+v: want %d members, one leading", members, len(c.Ctls))
	}
	return nil
}

// Logs returns the last lines of n's output.
func (c *Cluster) Logs(n *Node, lines int) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out strings.Builder
	cmd := dockerCmd(ctx, "logs", "--tail", strconv.Itoa(lines), n.Container)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(&out, "(docker logs: %v)", err)
	}
	return out.String()
}

// Metric returns the value of the Prometheus series name (without
// labels other than the exporter's scope labels, summed over any it
// has) that broker n serves on its admin listener, or an error if it
// serves none.
func (c *Cluster) Metric(ctx context.Context, n *Node, name string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/metrics", net.JoinHostPort(n.IP, strconv.Itoa(adminPort))), nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s's metrics: %w", n.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s's metrics: %s", n.Name, resp.Status)
	}
	var sum float64
	found := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		fields := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, fmt.Errorf("%s's metrics: %q: %w", n.Name, line, err)
		}
		sum += v
		found = true
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("%s's metrics: %w", n.Name, err)
	}
	if !found {
		return 0, fmt.Errorf("%s serves no %s", n.Name, name)
	}
	return sum, nil
}

// remove prints the logs if the test failed, then removes the containers
// and the network.
func (c *Cluster) remove() {
	if c.etcdCli != nil {
		c.etcdCli.Close()
	}
	nodes := c.nodes()
	if c.t.Failed() {
		for _, n := range nodes {
			c.t.Logf("--- %s (%s) ---\n%s", n.Name, n.Container, c.Logs(n, 150))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var names []string
	for _, n := range nodes {
		names = append(names, n.Container)
	}
	if len(names) > 0 {
		if _, err := docker(ctx, append([]string{"rm", "--force", "--volumes"}, names...)...); err != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			c.t.Logf("removing the containers: %v", err)
		}
	}
	if _, err := docker(ctx, "network", "rm", c.network); err != nil {
		c.t.Logf("removing the network: %v", err)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
