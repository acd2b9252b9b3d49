package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/felix-broker/felix/ctl"
	"github.com/felix-broker/felix/internal/freeport"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// Options configures a local cluster. Zero means the documented default.
type Options struct {
	// Dir holds certificates, the control plane's state and every broker's
	// data and log; required.
	Dir string
	// Binary is the felix executable the brokers run; required.
	Binary string
	// Brokers is how many brokers to start; default 3.
	Brokers int
	// LeaseTTL is the control plane lease; default 3s.
	LeaseTTL time.Duration
	// Host is the loopback address everything listens on; default 127.0.0.1.
	Host string
	// CtlPort and BrokerPorts fix the ports; zero picks free ones.
	CtlPort     int
	BrokerPorts []int
	// BrokerProcs sets GOMAXPROCS for each broker process: 0 gives each a
	// share of the CPUs when the brokers outnumber them (else Go's
	// default), negative leaves Go's default always. A GOMAXPROCS in this
	// process's environment wins over the share.
	BrokerProcs int
	// BrokerEnv is added to the brokers' environment (KEY=value), after
	// this process's own.
	BrokerEnv []string
	// BrokerOutput receives the brokers' logs; default a file per broker in
	// Dir (broker-N.log).
	BrokerOutput io.Writer
	// Logger is the control plane's logger; default discards.
	Logger *slog.Logger
}

// Cluster is a running local cluster.
type Cluster struct {
	opts    Options
	certDir string
	ctlAddr string
	brokers []*Broker

	mu  sync.Mutex // guards ctl across RestartCtl
	ctl *ctl.Server
}

// Broker is one broker process of a Cluster.
type Broker struct {
	ID      string
	Addr    string
	DataDir string

	mu     sync.Mutex // guards the running process and env
	env    []string   // added to this broker's environment after Options.BrokerEnv
	cmd    *exec.Cmd
	exited chan struct{}
	logf   *os.File
}

// Start generates certificates, starts the control plane in-process and the
// brokers as processes, and returns once every broker is live in the map.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Dir == "" || opts.Binary == "" {
		return nil, errors.New("cluster: Dir and Binary are required")
	}
	if opts.Brokers == 0 {
		opts.Brokers = 3
	}
	if opts.LeaseTTL == 0 {
		opts.LeaseTTL = 3 * time.Second
	}
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{opts: opts, certDir: filepath.Join(opts.Dir, "certs")}
	ids := []string{"ctl"}
	for i := range opts.Brokers {
		ids = append(ids, BrokerID(i))
	}
	if err := transport.GenerateDevCerts(c.certDir, ids...); err != nil {
		return nil, fmt.Errorf("cluster: generate dev certificates: %w", err)
	}
	port := opts.CtlPort
	if port == 0 {
		p, err := FreePort(opts.Host)
		if err != nil {
			return nil, err
		}
		port = p
	}
	c.ctlAddr = net.JoinHostPort(opts.Host, strconv.Itoa(port))
	if err := c.startCtl(); err != nil {
		return nil, err
	}
	for i := range opts.Brokers {
		port := 0
		if i < len(opts.BrokerPorts) {
			port = opts.BrokerPorts[i]
		}
		if port == 0 {
			p, err := FreePort(opts.Host)
			if err != nil {
				c.Close()
				return nil, err
			}
			port = p
		}
		c.brokers = append(c.brokers, &Broker{
			ID:      BrokerID(i),
			Addr:    net.JoinHostPort(opts.Host, strconv.Itoa(port)),
			DataDir: filepath.Join(opts.Dir, BrokerID(i)),
		})
	}
	for i := range c.brokers {
		if err := c.startBroker(i); err != nil {
			c.Close()
			return nil, err
		}
	}
	if err := c.waitUp(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// waitUp waits until every broker is live in the map, or one has exited.
func (c *Cluster) waitUp(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if m := c.Ctl().Map(); m != nil && c.liveIn(m) >= len(c.brokers) {
			return nil
		}
		if err := c.exitedErr(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: waiting for the brokers to be live: %w (see the broker logs in %s)", ctx.Err(), c.opts.Dir)
		case <-t.C:
		}
	}
}

// exitedErr says which broker process has exited, if one has, with the
// last line of its log: one that cannot start (its port taken, its data
// directory locked) exits at once, and the cluster will not come up.
func (c *Cluster) exitedErr() error {
	for _, b := range c.brokers {
		b.mu.Lock()
		exited := b.cmd != nil && b.exitedLocked()
		b.mu.Unlock()
		if !exited {
			continue
		}
		return fmt.Errorf("cluster: %s exited while the cluster started: %s (its log: %s)", b.ID, c.lastLog(b), c.logPath(b))
	}
	return nil
}

// ErrExited matches the error of Kill, Stop and Close for a broker whose
// process had exited on its own before they signalled it.
var ErrExited = errors.New("broker process exited on its own")

// logPath is where broker b's output goes, unless Options.BrokerOutput.
func (c *Cluster) logPath(b *Broker) string { return filepath.Join(c.opts.Dir, b.ID+".log") }

// lastLog returns the last line of broker b's log.
func (c *Cluster) lastLog(b *Broker) string {
	if c.opts.BrokerOutput != nil {
		return "(its output went to Options.BrokerOutput)"
	}
	return lastLine(c.logPath(b))
}

// lastLine returns the last line of the file at path that is not empty.
func lastLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// BrokerID names the i-th broker.
func BrokerID(i int) string { return "broker-" + strconv.Itoa(i) }

// FreePort returns a UDP port on host that was free a moment ago, below
// the kernel's range of ephemeral ports where it can (see package
// freeport): a broker restarted on its port after Kill finds it free
// again (TestPowerLoss once failed "address already in use" on a port
// of that range, taken meanwhile by another test's QUIC client).
func FreePort(host string) (int, error) { return freeport.UDP(host) }

func (c *Cluster) startCtl() error {
	tlsConf, err := CtlServerTLS(c.certDir)
	if err != nil {
		return err
	}
	s, err := ctl.New(ctl.Config{
		Addr:     c.ctlAddr,
		DataDir:  filepath.Join(c.opts.Dir, "ctl"),
		Etcd:     CtlEtcd(c.certDir, ""),
		TLS:      tlsConf,
		LeaseTTL: c.opts.LeaseTTL,
		// The dev PKI's admin client is the operator: it may do
		// everything, and grants everyone else their permissions.
		Superusers: []string{transport.DevAdminName},
		Logger:     c.opts.Logger,
	})
	if err != nil {
		return fmt.Errorf("cluster: control plane: %w", err)
	}
	if err := s.Start(); err != nil {
		return fmt.Errorf("cluster: start control plane on %s: %w", c.ctlAddr, err)
	}
	c.mu.Lock()
	c.ctl = s
	c.mu.Unlock()
	return nil
}

// startBroker starts broker i's process.
func (c *Cluster) startBroker(i int) error {
	b := c.brokers[i]
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd != nil && b.exitedLocked() {
		// It died on its own (or was killed from outside): reap it.
		b.cmd = nil
		if b.logf != nil {
			b.logf.Close()
			b.logf = nil
		}
	}
	if b.cmd != nil {
		return fmt.Errorf("cluster: %s is already running", b.ID)
	}
	cmd := exec.Command(c.opts.Binary, "broker",
		"--id", b.ID,
		"--listen", b.Addr,
		"--ctl", c.ctlAddr,
		"--data", b.DataDir,
		"--certs", c.certDir,
		"--lease-ttl", c.opts.LeaseTTL.String(),
		"--admin", net.JoinHostPort(c.opts.Host, "0"),
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Env = os.Environ()
	if n := c.BrokerProcs(); n > 0 {
		cmd.Env = append(cmd.Env, "GOMAXPROCS="+strconv.Itoa(n))
	}
	cmd.Env = append(cmd.Env, c.opts.BrokerEnv...)
	cmd.Env = append(cmd.Env, b.env...)
	out := c.opts.BrokerOutput
	if out == nil {
		f, err := openLog(filepath.Join(c.opts.Dir, b.ID+".log"))
		if err != nil {
			return fmt.Errorf("cluster: open log of %s: %w", b.ID, err)
		}
		b.logf = f
		out = f
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		if b.logf != nil { // Stop and Close close it only with a process
			b.logf.Close()
			b.logf = nil
		}
		return fmt.Errorf("cluster: start %s (%s): %w", b.ID, c.opts.Binary, err)
	}
	b.cmd = cmd
	b.exited = make(chan struct{})
	go func(exited chan struct{}) {
		cmd.Wait()
		close(exited)
	}(b.exited)
	return nil
}

// exitedLocked reports whether b's process has exited; b.mu is held and
// b.cmd is not nil.
func (b *Broker) exitedLocked() bool {
	select {
	case <-b.exited:
		return true
	default:
		return false
	}
}

// Running reports whether broker b's process is running (started and not
// exited, whether it was stopped, killed or died on its own).
func (b *Broker) Running() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cmd != nil && !b.exitedLocked()
}

// Pid returns the process id of broker b, or 0 when it is not running.
func (b *Broker) Pid() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil || b.cmd.Process == nil {
		return 0
	}
	return b.cmd.Process.Pid
}

// AdminAddr returns the HTTP admin address (/metrics, /healthz, /readyz)
// broker id registered in the control plane's map, or "" if it has none.
func (c *Cluster) AdminAddr(id string) string {
	if m := c.Ctl().Map(); m != nil {
		if n, ok := m.Node(id); ok {
			return n.Admin
		}
	}
	return ""
}

// BrokerProcs returns the GOMAXPROCS each broker process runs with, or 0
// for Go's default (Options.BrokerProcs).
//
// The brokers of a local cluster share one machine. Each Go runtime sizes
// itself to the whole of it, and when the brokers outnumber the CPUs that
// oversubscribes it: a goroutine made ready while a P is idle wakes
// another thread, which finds nothing and sleeps again, so each hand-off
// on the publish path costs context switches, and on a VM those are dear.
// On the 2-vCPU Firecracker guest the bench runs on, three brokers at Go's
// default, with one R=3 record in flight at a time, made about 17 context
// switches per record each and took 30–40% of a core each, a quarter of
// their profile samples in the kernel's task switch.
// One share each is what the same brokers would get as containers with a
// CPU limit, which Go's runtime reads. Measured there with three brokers,
// alternating runs: throughput 124k and 157k acked records/s against 107k
// and 97k, R=3 direct p50 lower in 5 of 5 pairs (745–975 µs against
// 953–1100), R=1 direct and e2e p50 lower in 3 of 5 and 4 of 5.
func (c *Cluster) BrokerProcs() int {
	switch {
	case c.opts.BrokerProcs != 0:
		return max(c.opts.BrokerProcs, 0)
	case os.Getenv("GOMAXPROCS") != "" || c.opts.Brokers <= runtime.NumCPU():
		return 0
	}
	return max(1, runtime.NumCPU()/c.opts.Brokers)
}

// Ctl returns the control plane.
func (c *Cluster) Ctl() *ctl.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ctl
}

// CtlAddr returns the control plane's address.
func (c *Cluster) CtlAddr() string { return c.ctlAddr }

// CertDir returns the directory holding ca.crt and every certificate.
func (c *Cluster) CertDir() string { return c.certDir }

// CAFile returns the cluster CA certificate's path.
func (c *Cluster) CAFile() string { return filepath.Join(c.certDir, "ca.crt") }

// AdminCert returns the paths of the admin client's certificate and key:
// the principal the cluster's control plane makes a superuser.
func (c *Cluster) AdminCert() (certFile, keyFile string) {
	return filepath.Join(c.certDir, transport.DevAdminName+".crt"), filepath.Join(c.certDir, transport.DevAdminName+".key")
}

// IssueClientCert issues a client certificate for principal name from the
// cluster CA and returns the paths of it and its key: a principal with no
// permission until one is granted.
func (c *Cluster) IssueClientCert(name string) (certFile, keyFile string, err error) {
	certFile, keyFile = filepath.Join(c.certDir, name+".crt"), filepath.Join(c.certDir, name+".key")
	ca, err := transport.LoadCAKeyPair(c.CAFile(), filepath.Join(c.certDir, "ca.key"))
	if err != nil {
		return "", "", err
	}
	cert, err := ca.Issue(transport.RoleClient, name)
	if err != nil {
		return "", "", err
	}
	return certFile, keyFile, transport.WriteKeyPair(cert, certFile, keyFile)
}

// Brokers returns the brokers, running or not.
func (c *Cluster) Brokers() []*Broker { return c.brokers }

// Broker returns the broker with id, or nil.
func (c *Cluster) Broker(id string) *Broker {
	for _, b := range c.brokers {
		if b.ID == id {
			return b
		}
	}
	return nil
}

// WaitLive waits until the control plane's map has at least n live brokers
// and returns that map.
func (c *Cluster) WaitLive(ctx context.Context, n int) (*shardmap.Map, error) {
	return c.WaitMap(ctx, func(m *shardmap.Map) bool { return c.liveIn(m) >= n })
}

// liveIn counts the brokers m shows live.
func (c *Cluster) liveIn(m *shardmap.Map) int {
	live := 0
	for _, node := range m.Nodes {
		if node.Live {
			live++
		}
	}
	return live
}

// WaitMap waits until the control plane's map satisfies ok.
func (c *Cluster) WaitMap(ctx context.Context, ok func(*shardmap.Map) bool) (*shardmap.Map, error) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if m := c.Ctl().Map(); m != nil && ok(m) {
			return m, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("cluster: waiting for the shard map: %w (see the broker logs in %s)", ctx.Err(), c.opts.Dir)
		case <-t.C:
		}
	}
}

// Kill sends SIGKILL to broker id and waits for it to die.
func (c *Cluster) Kill(id string) error { return c.signal(id, syscall.SIGKILL) }

// Stop sends SIGTERM to broker id (graceful shutdown) and waits for it.
func (c *Cluster) Stop(id string) error { return c.signal(id, syscall.SIGTERM) }

func (c *Cluster) signal(id string, sig syscall.Signal) error {
	b := c.Broker(id)
	if b == nil {
		return fmt.Errorf("cluster: no broker %q", id)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return nil
	}
	if b.exitedLocked() {
		// Nobody signalled it: a crash (a panic, say) that a fault test
		// must not take for the kill it was about to make.
		err := fmt.Errorf("cluster: %w: %s, %s, before it was sent %v: %s (its log: %s)", ErrExited, b.ID, b.cmd.ProcessState, sig, c.lastLog(b), c.logPath(b))
		b.cmd = nil
		if b.logf != nil {
			b.logf.Close()
			b.logf = nil
		}
		return err
	}
	b.cmd.Process.Signal(sig)
	select {
	case <-b.exited:
	case <-time.After(30 * time.Second):
		b.cmd.Process.Kill()
		<-b.exited
	}
	b.cmd = nil
	if b.logf != nil {
		b.logf.Close()
		b.logf = nil
	}
	return nil
}

// Restart starts broker id again (same id, address and data) after Kill,
// Stop, or its process dying on its own, and waits until it is live in the
// map. It fails if the broker is running.
func (c *Cluster) Restart(ctx context.Context, id string) error {
	if err := c.StartBroker(id); err != nil {
		return err
	}
	_, err := c.WaitMap(ctx, func(m *shardmap.Map) bool {
		n, ok := m.Node(id)
		return ok && n.Live
	})
	return err
}

// StartBroker starts broker id's process again (same id, address and
// data) after Kill, Stop, or its process dying on its own, and returns
// without waiting for it to join the control plane: Restart without the
// wait, for a broker restarted while the control plane is down. It fails
// if the broker is running.
func (c *Cluster) StartBroker(id string) error {
	for i, b := range c.brokers {
		if b.ID == id {
			return c.startBroker(i)
		}
	}
	return fmt.Errorf("cluster: no broker %q", id)
}

// RestartWithEnv is Restart with env (KEY=value) added to the broker's
// environment from now on, after Options.BrokerEnv: a flag for this
// broker only (FELIX_ACCEPT_LOSS, say).
func (c *Cluster) RestartWithEnv(ctx context.Context, id string, env ...string) error {
	b := c.Broker(id)
	if b == nil {
		return fmt.Errorf("cluster: no broker %q", id)
	}
	b.mu.Lock()
	b.env = append(b.env, env...)
	b.mu.Unlock()
	return c.Restart(ctx, id)
}

// RestartCtl closes the control plane and starts a new one on the same
// address and state directory.
func (c *Cluster) RestartCtl() error {
	if err := c.StopCtl(); err != nil {
		return err
	}
	return c.StartCtl()
}

// StopCtl closes the control plane, which stays down (an outage) until
// StartCtl; the brokers keep running. Ctl returns the closed server
// meanwhile, whose Map is the last it held.
func (c *Cluster) StopCtl() error {
	if err := c.Ctl().Close(); err != nil {
		return fmt.Errorf("cluster: close control plane: %w", err)
	}
	return nil
}

// StartCtl starts the control plane again after StopCtl, on the same
// address and state directory.
func (c *Cluster) StartCtl() error { return c.startCtl() }

// Close stops every broker (SIGTERM, then SIGKILL after a grace period) and
// the control plane.
// Its error matches ErrExited if a broker's process had exited on its own.
func (c *Cluster) Close() error {
	var wg sync.WaitGroup
	errs := make([]error, len(c.brokers)+1)
	for i, b := range c.brokers {
		wg.Go(func() { errs[i] = c.Stop(b.ID) })
	}
	wg.Wait()
	if s := c.Ctl(); s != nil {
		errs[len(c.brokers)] = s.Close()
	}
	return errors.Join(errs...)
}

// openLog opens a broker's log file to append to, creating it; never
// through a link planted at its name (O_NOFOLLOW: the directory may be
// one that other local users can write, and the process may be root).
func openLog(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_NOFOLLOW, 0o644)
}
