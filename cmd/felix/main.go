// Command felix is the Felix server: `felix broker` runs one broker,
// `felix ctl` runs the control plane, and `felix dev` runs the embedded
// default, a local cluster of the control plane and three broker
// processes on loopback.
package main

import (
	"fmt"
	"os"
	"runtime"

	"github.com/alecthomas/kong"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/servercmd"
	"github.com/felix-broker/felix/internal/sysmon"
	"github.com/felix-broker/felix/internal/telemetry"
)

// cli is the command line; kong fills it from flags and FELIX_* variables.
type cli struct {
	Version   kong.VersionFlag `help:"Print the version (the build's module version and commit, as felix_build_info reports it) and exit."`
	LogFormat string           `help:"Log format: text or json." enum:"text,json" default:"text" env:"FELIX_LOG_FORMAT"`
	LogLevel  string           `help:"Log level: debug, info, warn or error." enum:"debug,info,warn,error" default:"info" env:"FELIX_LOG_LEVEL"`

	Broker servercmd.Broker `cmd:"" help:"Run one broker."`
	Ctl    servercmd.Ctl    `cmd:"" help:"Run the control plane."`
	Dev    servercmd.Dev    `cmd:"" help:"Run a local cluster: the control plane and three brokers on loopback (the embedded default)."`
	Certs  servercmd.Certs  `cmd:"" help:"Issue the cluster's certificates: ca, then node, ctl and client (offline steps), or dev (a development PKI)."`
	Health servercmd.Health `cmd:"" help:"Check an admin endpoint (for container health checks): exit 0 if it answers 2xx."`
	Echo   servercmd.Echo   `cmd:"" hidden:"" help:"Serve a QUIC echo (the bench's round-trip floor)."`
	Etcd   servercmd.Etcd   `cmd:"" hidden:"" help:"Run one member of an etcd cluster for felix ctl --etcd-endpoints (the etcd server built into felix; no TLS yet)."`
	Pause  servercmd.Pause  `cmd:"" hidden:"" help:"Do nothing until stopped: hold a network namespace that containers share (the compose brokers')."`
}

// init keeps the main goroutine on the process's first thread until main
// knows whether it re-executes itself as a broker (sysmon.Reexec): the
// parent-death signal a local cluster starts its brokers with
// (internal/cluster) is the first thread's, and an exec from another
// thread loses it, so that brokers of a felix or felixctl dev killed with
// SIGKILL outlived it, holding their ports and data. main unlocks it then:
// a locked goroutine cannot run a coroutine (iter.Pull) on another thread.
func init() { runtime.LockOSThread() }

func main() {
	var c cli
	ctx := kong.Parse(&c,
		kong.Name("felix"),
		kong.Description("Felix: a clustered, durable, low-latency publish/subscribe broker."),
		kong.UsageOnError(),
		// A usage error exits 2, as felixctl's and most tools' do, not
		// kong's 80.
		kong.Exit(func(code int) {
			if code == 80 {
				code = 2
			}
			os.Exit(code)
		}),
		kong.Vars{"conn_file": client.DefaultClusterFile, "version": "felix " + telemetry.VersionLine()},
	)
	logger := servercmd.NewLogger(c.LogFormat, c.LogLevel)
	if ctx.Command() == "dev" {
		// Its brokers are processes of their own, which take the log
		// flags from their environment.
		os.Setenv("FELIX_LOG_FORMAT", c.LogFormat)
		os.Setenv("FELIX_LOG_LEVEL", c.LogLevel)
	}
	switch ctx.Command() {
	case "broker", "echo":
		// Returns only without the exec (see package sysmon).
		if err := sysmon.Reexec(); err != nil {
			logger.Warn("felix: going on with the Go runtime's sysmon parking when idle", "err", err)
		}
	}
	runtime.UnlockOSThread() // locked by init for the re-exec
	if err := ctx.Run(logger); err != nil {
		fmt.Fprintf(os.Stderr, "felix: %v\n", err)
		os.Exit(1)
	}
}
