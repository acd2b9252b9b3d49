package servercmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// Dev runs the embedded default: the control plane in-process and brokers
// as processes of this same executable, on loopback, until interrupted.
//
// Its process is also the brokers' supervisor: its admin listener serves
// the control plane's /metrics, /healthz and /readyz, and POST
// /restart?broker=ID (`felixctl dev restart ID`), which starts a broker
// that died or was killed again (or restarts a running one), and GET
// /brokers, their processes. The connection file names every process's
// admin address.
type Dev struct {
	Dir      string   `help:"Directory for certificates, state, data and broker logs." default:"felix-dev" type:"path"`
	Brokers  int      `help:"Number of brokers." default:"3"`
	CtlPort  int      `help:"Control plane port (0: any free port)." default:"7000"`
	BasePort int      `help:"Port of broker-0; broker-N listens on BasePort+N (0: any free ports)." default:"7100"`
	Stream   []string `help:"Streams to create if missing, as NAME:SHARDS." default:"orders:1"`
	ConnFile string   `help:"Connection file felixctl and the SDK read when run from this directory." default:"${conn_file}" type:"path"`
	Admin    string   `help:"HTTP admin address of this process: the control plane's /metrics, /healthz and /readyz, and the supervisor's POST /restart?broker=ID (felixctl dev restart, served to loopback clients only). Keep it on loopback: it has no authentication." default:"127.0.0.1:0"`
	Pprof    bool     `help:"Serve /debug/pprof/ on each broker's admin listener (loopback)."`
}

// DevBroker is one broker process as GET /brokers and POST /restart of
// felix dev's admin listener describe it.
type DevBroker struct {
	ID      string `json:"id"`
	Addr    string `json:"addr"`
	Admin   string `json:"admin,omitempty"`
	Pid     int    `json:"pid,omitempty"`
	Running bool   `json:"running"`
	// WasRunning, in a /restart answer: the broker was running and was
	// stopped (SIGTERM) before it was started again.
	WasRunning bool `json:"was_running,omitempty"`
}

func (c *Dev) Run(log *slog.Logger) error {
	// SIGHUP too: the terminal it ran in was closed.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	if isGoRun(os.Args[0]) {
		// A `go run` that is killed passes no signal on (only a
		// terminal's Ctrl-C reaches the whole process group): end with it.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go endWithParent(ctx, cancel)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the felix executable: %w", err)
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return err
	}
	if err := connFileFree(c.ConnFile); err != nil {
		return err
	}
	opts := cluster.Options{Dir: c.Dir, Binary: self, Brokers: c.Brokers, CtlPort: c.CtlPort, Logger: log}
	if c.Pprof {
		opts.BrokerEnv = append(opts.BrokerEnv, "FELIX_PPROF=true")
	}
	if c.BasePort != 0 {
		for i := range c.Brokers {
			opts.BrokerPorts = append(opts.BrokerPorts, c.BasePort+i)
		}
	}

	// The admin listener comes first, so that the connection file can name
	// it; it answers 503 until the cluster is up.
	var running atomic.Pointer[cluster.Cluster]
	sup := &supervisor{cluster: &running, log: log}
	obs, err := startObservabilityWith("felix-dev", "dev", c.Admin, false, func() error {
		if running.Load() == nil {
			return errors.New("the cluster is starting")
		}
		return nil
	}, map[string]http.Handler{
		"POST /restart": localOnly(http.HandlerFunc(sup.restart)),
		"GET /brokers":  http.HandlerFunc(sup.brokers),
	}, log)
	if err != nil {
		return fmt.Errorf("%w\nis another `felix dev` running? try --admin 127.0.0.1:0", err)
	}
	defer obs.close()

	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	fmt.Printf("starting the control plane and %d brokers in %s ...\n", c.Brokers, c.Dir)
	cl, err := cluster.Start(startCtx, opts)
	if err != nil {
		// The hint is for the fixed ports (a broker's error reaches here
		// as the last line of its log, text); the embedded etcd's, kept
		// from the first start, say so themselves.
		if msg := err.Error(); strings.Contains(msg, "address already in use") && (c.CtlPort != 0 || c.BasePort != 0) && !strings.Contains(msg, "embedded etcd") {
			err = fmt.Errorf("%w\nis another `felix dev` already running on these ports? try --ctl-port 0 --base-port 0", err)
		}
		return err
	}
	defer cl.Close()
	reg, err := ctlMetrics(obs.prov.Meter, cl.Ctl())
	if err != nil {
		return err
	}
	defer reg.Unregister()

	for _, spec := range c.Stream {
		sc, err := parseStreamSpec(spec)
		if err != nil {
			return err
		}
		if _, ok := cl.Ctl().Map().Stream(sc.Name); ok {
			continue // kept from an earlier run: nothing to wait for a leader for
		}
		if err := cl.Ctl().CreateStream(sc); err != nil && !errors.Is(err, transport.ErrStreamExists) {
			return fmt.Errorf("creating stream %s: %w", sc.Name, err)
		}
	}
	m, err := cl.WaitMap(startCtx, func(m *shardmap.Map) bool { return true })
	if err != nil {
		return err
	}
	running.Store(cl)
	fmt.Println()
	cluster.WriteOwnership(os.Stdout, m)

	admin := obs.adminAdvertise("127.0.0.1")
	if err := c.writeConnFile(cl, m, admin); err != nil {
		return err
	}
	defer removeConnFile(c.ConnFile, admin)
	ctlcmd := FelixctlCommand()
	fmt.Printf("\nconnection file: %s (felixctl and client.ConnectFile read it from this directory)\n", c.ConnFile)
	fmt.Printf("try:  %s pub orders hello --via %s\n      %s sub orders --from earliest\n", ctlcmd, cl.Brokers()[0].ID, ctlcmd)
	fmt.Printf("admin (control plane metrics and health, broker restarts): http://%s\n", admin)
	fmt.Printf("broker logs: %s\nctrl-c stops the cluster\n", filepath.Join(c.Dir, "broker-*.log"))

	// Report liveness and ownership changes until interrupted, and keep
	// the connection file's admin addresses current (a restarted broker
	// has a new one). Each map is read as soon as it is current: a broker
	// marked down and live again 100 ms later is reported both times.
	last := m
	for {
		m, changed := cl.Ctl().WatchMap()
		if m.Epoch == last.Epoch {
			select {
			case <-ctx.Done():
				stop() // a second signal ends felix dev at once (its brokers die with it: Pdeathsig)
				fmt.Println("\nstopping the cluster ... (again to stop at once)")
				return nil
			case <-changed:
			}
			continue
		}
		changedAdmin := false
		for _, n := range m.Nodes {
			old, ok := last.Node(n.ID)
			if !ok || old.Live != n.Live {
				if n.Live {
					fmt.Printf("epoch %d: %s is live\n", m.Epoch, n.ID)
				} else {
					fmt.Printf("epoch %d: %s is down; restart it with `%s dev restart %s`\n", m.Epoch, n.ID, ctlcmd, n.ID)
				}
			}
			changedAdmin = changedAdmin || !ok || old.Admin != n.Admin
		}
		for _, mv := range shardmap.Diff(last, m) {
			switch {
			case mv.From == "":
				fmt.Printf("epoch %d: %s owned by %s\n", m.Epoch, mv.ShardID, mv.To)
			case mv.To == "":
				fmt.Printf("epoch %d: %s removed\n", m.Epoch, mv.ShardID)
			case mv.Recreated:
				fmt.Printf("epoch %d: %s created again, owned by %s\n", m.Epoch, mv.ShardID, mv.To)
			case mv.From == mv.To:
				fmt.Printf("epoch %d: %s replicas %s moved to %s\n", m.Epoch, mv.ShardID, strings.Join(mv.FromReplicas, ","), strings.Join(mv.ToReplicas, ","))
			default:
				fmt.Printf("epoch %d: %s moved from %s to %s\n", m.Epoch, mv.ShardID, mv.From, mv.To)
			}
		}
		if changedAdmin {
			if err := c.writeConnFile(cl, m, admin); err != nil {
				log.Warn("cannot update the connection file", "file", c.ConnFile, "err", err)
			}
		}
		last = m
	}
}

// writeConnFile writes the connection file: the brokers with their admin
// addresses from m, the certificates, and this process's admin address.
func (c *Dev) writeConnFile(cl *cluster.Cluster, m *shardmap.Map, admin string) error {
	cf := client.ClusterFile{Name: "dev", CAFile: cl.CAFile(), Admin: admin}
	cf.CertFile, cf.KeyFile = cl.AdminCert()
	for _, b := range cl.Brokers() {
		cb := client.ClusterBroker{ID: b.ID, Addr: b.Addr}
		if n, ok := m.Node(b.ID); ok {
			cb.Admin = n.Admin
		}
		cf.Brokers = append(cf.Brokers, cb)
	}
	return cf.Write(c.ConnFile)
}

// connFileFree refuses to start when the connection file at path is
// another felix dev's that still runs (its admin address answers): this
// one would take the file over, and remove it when it stops.
func connFileFree(path string) error {
	cf, err := client.LoadClusterFile(path)
	if err != nil || cf.Admin == "" {
		return nil // none, or not a felix dev's: written over
	}
	hc := http.Client{Timeout: time.Second}
	resp, err := hc.Get("http://" + cf.Admin + "/brokers")
	if err != nil {
		return nil // left by a felix dev that is gone
	}
	resp.Body.Close()
	return fmt.Errorf("%s is the connection file of a felix dev that is running (admin http://%s): stop it, or start this one from another directory or with --conn-file", path, cf.Admin)
}

// removeConnFile removes the connection file at path if it is still this
// felix dev's (names its admin address).
func removeConnFile(path, admin string) {
	if cf, err := client.LoadClusterFile(path); err == nil && cf.Admin == admin {
		os.Remove(path)
	}
}

// FelixctlCommand is how to run felixctl from where this process was
// started: `go run ./cmd/felixctl` when this process itself was started by
// `go run` (its executable is in the go command's temporary build
// directory, and felixctl is then most likely not installed), else
// `felixctl`.
func FelixctlCommand() string {
	if isGoRun(os.Args[0]) {
		return "go run ./cmd/felixctl"
	}
	return "felixctl"
}

// endWithParent calls end once this process's parent has exited (it is
// given another parent), or returns when ctx ends.
func endWithParent(ctx context.Context, end context.CancelFunc) {
	parent := os.Getppid()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if os.Getppid() != parent {
				end()
				return
			}
		}
	}
}

// isGoRun reports whether arg0 is an executable `go run` built: it lives
// in a go-build temporary directory (…/go-build1234/b001/exe/felix), or,
// since Go 1.24 caches them, in the build cache
// (…/go-build/d0/d087…-d/felix).
func isGoRun(arg0 string) bool {
	p := filepath.ToSlash(arg0)
	if strings.Contains(p, "/go-build") && strings.Contains(p, "/exe/") {
		return true
	}
	return strings.Contains(p, "/go-build/") && strings.HasSuffix(path.Dir(p), "-d")
}

// supervisor serves felix dev's broker restarts.
type supervisor struct {
	cluster *atomic.Pointer[cluster.Cluster] // nil until the cluster is up
	log     *slog.Logger
}

func (s *supervisor) describe(cl *cluster.Cluster, b *cluster.Broker) DevBroker {
	return DevBroker{ID: b.ID, Addr: b.Addr, Admin: cl.AdminAddr(b.ID), Pid: b.Pid(), Running: b.Running()}
}

// brokers serves GET /brokers: every broker process, as JSON.
func (s *supervisor) brokers(w http.ResponseWriter, r *http.Request) {
	cl := s.cluster.Load()
	if cl == nil {
		http.Error(w, "the cluster is starting", http.StatusServiceUnavailable)
		return
	}
	out := []DevBroker{}
	for _, b := range cl.Brokers() {
		out = append(out, s.describe(cl, b))
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

// restart serves POST /restart?broker=ID: it starts the broker again
// (stopping it first if it is running) and answers once it is live in the
// map, with the broker as JSON.
func (s *supervisor) restart(w http.ResponseWriter, r *http.Request) {
	cl := s.cluster.Load()
	if cl == nil {
		http.Error(w, "the cluster is starting", http.StatusServiceUnavailable)
		return
	}
	id := r.URL.Query().Get("broker")
	b := cl.Broker(id)
	if b == nil {
		var ids []string
		for _, b := range cl.Brokers() {
			ids = append(ids, b.ID)
		}
		http.Error(w, fmt.Sprintf("there is no broker %q; the brokers are %s", id, strings.Join(ids, ", ")), http.StatusNotFound)
		return
	}
	was := b.Running()
	if was {
		if err := cl.Stop(id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	if err := cl.Restart(ctx, id); err != nil {
		http.Error(w, fmt.Sprintf("%s did not come back: %v", id, err), http.StatusInternalServerError)
		return
	}
	s.log.Info("broker restarted on request", "broker", id, "pid", b.Pid(), "was_running", was)
	d := s.describe(cl, b)
	d.WasRunning = was
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(d)
}

// localOnly serves h only to requests from a loopback address that no
// browser made on a web page's behalf (one names its Origin, or says
// Sec-Fetch-Site: cross-site): the admin listener has no authentication,
// and --admin may bind it beyond loopback, where restarting brokers is
// not for anyone who can reach it; nor for a page open in the
// developer's browser, which could POST to it. Others get 403.
func localOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		ip := net.ParseIP(host)
		switch {
		case err != nil || ip == nil || !ip.IsLoopback():
			http.Error(w, "broker restarts are served to loopback clients only (the admin listener has no authentication)", http.StatusForbidden)
		case r.Header.Get("Origin") != "" || r.Header.Get("Sec-Fetch-Site") == "cross-site":
			http.Error(w, "broker restarts are not served to requests a browser makes for a web page", http.StatusForbidden)
		default:
			h.ServeHTTP(w, r)
		}
	})
}

// parseStreamSpec parses NAME:SHARDS (SHARDS defaults to 1).
func parseStreamSpec(spec string) (shardmap.StreamConfig, error) {
	name, shards, found := strings.Cut(spec, ":")
	sc := shardmap.StreamConfig{Name: name, Shards: 1}
	if found {
		n, err := strconv.Atoi(shards)
		if err != nil {
			return sc, fmt.Errorf("stream %q: shards must be a number, got %q", spec, shards)
		}
		sc.Shards = n
	}
	return sc, sc.Validate()
}
