package main

import "github.com/felix-broker/felix/bench"

// benchMount is where `felixctl bench` mounts: bench.Command is package
// bench's kong command (Run(*slog.Logger) error, served by run's
// bindings). It starts brokers and the echo floor from felixctl's own
// executable through the hidden `broker` and `echo` commands (main.go).
type benchMount struct {
	Bench bench.Command `cmd:"" help:"Measure publish latency and throughput against a cluster it starts."`
}
