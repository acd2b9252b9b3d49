package servercmd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// Dev runs the embedded default: the control plane in-process and brokers
// as processes of this same executable, on loopback, until interrupted.
type Dev struct {
	Dir      string   `help:"Directory for certificates, state, data and broker logs." default:"felix-dev" type:"path"`
	Brokers  int      `help:"Number of brokers." default:"3"`
	CtlPort  int      `help:"Control plane port (0: any free port)." default:"7000"`
	BasePort int      `help:"Port of broker-0; broker-N listens on BasePort+N (0: any free ports)." default:"7100"`
	Stream   []string `help:"Streams to create if missing, as NAME:SHARDS." default:"orders:1"`
	ConnFile string   `help:"Connection file felixctl and the SDK read when run from this directory." default:"${conn_file}" type:"path"`
	Pprof    bool     `help:"Serve /debug/pprof/ on each broker's admin listener (loopback)."`
}

func (c *Dev) Run(log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the felix executable: %w", err)
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
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
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	fmt.Printf("starting the control plane and %d brokers in %s ...\n", c.Brokers, c.Dir)
	cl, err := cluster.Start(startCtx, opts)
	if err != nil {
		return fmt.Errorf("%w\nis another `felix dev` already running on these ports? try --ctl-port 0 --base-port 0", err)
	}
	defer cl.Close()

	for _, spec := range c.Stream {
		sc, err := parseStreamSpec(spec)
		if err != nil {
			return err
		}
		if err := cl.Ctl().CreateStream(sc); err != nil && !errors.Is(err, transport.ErrStreamExists) {
			return fmt.Errorf("creating stream %s: %w", sc.Name, err)
		}
	}
	m, err := cl.WaitMap(startCtx, func(m *shardmap.Map) bool { return true })
	if err != nil {
		return err
	}
	fmt.Println()
	cluster.WriteOwnership(os.Stdout, m)

	cf := client.ClusterFile{Name: "dev", CAFile: cl.CAFile()}
	cf.CertFile, cf.KeyFile = cl.AdminCert()
	for _, b := range cl.Brokers() {
		cf.Brokers = append(cf.Brokers, client.ClusterBroker{ID: b.ID, Addr: b.Addr})
	}
	if err := cf.Write(c.ConnFile); err != nil {
		return err
	}
	defer os.Remove(c.ConnFile)
	fmt.Printf("\nconnection file: %s (felixctl and client.ConnectFile read it from this directory)\n", c.ConnFile)
	fmt.Printf("try:  felixctl pub orders hello --via %s\n      felixctl sub orders --from earliest\n", cl.Brokers()[0].ID)
	fmt.Printf("broker logs: %s\nctrl-c stops the cluster\n", filepath.Join(c.Dir, "broker-*.log"))

	// Report liveness and ownership changes until interrupted.
	last := m
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Println("\nstopping the cluster ...")
			return nil
		case <-t.C:
		}
		m := cl.Ctl().Map()
		if m.Epoch == last.Epoch {
			continue
		}
		for _, n := range m.Nodes {
			if old, ok := last.Node(n.ID); !ok || old.Live != n.Live {
				state := "live"
				if !n.Live {
					state = "down"
				}
				fmt.Printf("epoch %d: %s is %s\n", m.Epoch, n.ID, state)
			}
		}
		for _, mv := range shardmap.Diff(last, m) {
			switch {
			case mv.From == "":
				fmt.Printf("epoch %d: %s owned by %s\n", m.Epoch, mv.ShardID, mv.To)
			case mv.To == "":
				fmt.Printf("epoch %d: %s removed\n", m.Epoch, mv.ShardID)
			default:
				fmt.Printf("epoch %d: %s moved from %s to %s\n", m.Epoch, mv.ShardID, mv.From, mv.To)
			}
		}
		last = m
	}
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
