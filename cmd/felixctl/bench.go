package main

import (
	"context"
	"errors"

	"github.com/felix-broker/felix/bench"
)

// benchMount is where `felixctl bench` mounts: bench.Command is package
// bench's kong command. It starts brokers and the echo floor from
// felixctl's own executable through the hidden `broker` and `echo`
// commands (main.go).
type benchMount struct {
	Bench benchCmd `cmd:"" help:"Measure publish latency, latency under load and throughput against the floors measured in the same run: on a cluster it starts (--local), or on the one felixctl finds like every other command. --shards 6,96,768 sweeps shard counts; --local --ab FELIX compares two builds side by side."`
}

// benchCmd runs bench.Command on the cluster felixctl's discovery finds
// (the global --cluster, --broker, --context, the environment,
// ./felix-cluster.json, the selected context), or on its own with --local.
type benchCmd struct {
	bench.Command `embed:""`
}

func (b *benchCmd) Run(a *app) error {
	c := &b.Command
	c.JSON = a.flags.JSON
	if !c.Local {
		ctx, cancel := context.WithTimeout(a.ctx, a.flags.Timeout)
		defer cancel()
		home, err := a.flags.connect(ctx, a, "")
		var noFile *noFileError
		if errors.As(err, &noFile) && noFile.source == "" {
			return usagef("bench needs a cluster: run it where `felix dev` runs (it reads ./felix-cluster.json), point it at one (--cluster FILE, --broker ADDR --ca FILE, --context NAME), or add --local to start one for the bench")
		}
		if err != nil {
			return err
		}
		home.Close()
		t, err := a.flags.discover(a)
		if err != nil {
			return err
		}
		c.Broker, c.CA, c.Cert, c.Key, c.Source = home.addr, t.caFile, t.certFile, t.keyFile, t.source
	}
	return c.Run(a.log)
}

// Validate defers bench.Command's checks to Run, once discovery has named
// the cluster (kong would otherwise call the promoted one at parse time).
func (b *benchCmd) Validate() error { return nil }
