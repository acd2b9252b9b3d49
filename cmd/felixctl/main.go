// Command felixctl is the operator and user CLI of Felix: publish and
// subscribe (`pub`, `sub`), manage streams (`stream create|ls|info|rm`),
// check the cluster (`cluster status`), and watch the seed's story on a
// cluster it starts itself (`demo`, `demo --tmux`).
//
// It finds the cluster with no flags after `felix dev` (the connection file
// felix-cluster.json in the working directory), or from --cluster FILE /
// FELIX_CLUSTER, or --broker ADDR with --ca FILE (FELIX_BROKER, FELIX_CA);
// flags beat the environment, which beats the file.
//
// Exit codes: 0 success, 1 failure, 2 usage, 3 the cluster is unhealthy
// (`cluster status` with a broker down).
//
// felixctl also carries the hidden server commands `broker`, `echo` and
// `dev` (internal/servercmd), so that `demo` starts real broker processes
// from its own executable with nothing else installed.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/alecthomas/kong"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/servercmd"
)

// cli is the command line.
type cli struct {
	globals

	Pub     pubCmd     `cmd:"" help:"Publish records and print the path each took."`
	Sub     subCmd     `cmd:"" help:"Subscribe to a stream and print its records."`
	Stream  streamCmd  `cmd:"" help:"Create, list, describe and delete streams."`
	Cluster clusterCmd `cmd:"" help:"Inspect the cluster."`
	ACL     aclCmd     `cmd:"" name:"acl" help:"Grant, revoke and list permissions."`
	Demo    demoCmd    `cmd:"" help:"Watch the cross-broker publishing story on a cluster started (and stopped) for it."`
	benchMount

	// Server commands run from felixctl's own executable by demo (and
	// bench): hidden, for the harness, not for users.
	Broker servercmd.Broker `cmd:"" hidden:"" help:"Run one broker (used by demo)."`
	Echo   servercmd.Echo   `cmd:"" hidden:"" help:"Serve a QUIC echo (used by bench)."`
	Dev    servercmd.Dev    `cmd:"" hidden:"" help:"Run a local cluster like felix dev (used by demo --tmux)."`
}

// clientFlags are the flags of every command that talks to a cluster. They
// are per command rather than global because `bench` (package bench)
// defines --cluster, --broker and --ca of its own, with the same meaning.
type clientFlags struct {
	Cluster     string        `name:"cluster" help:"Cluster connection file (env FELIX_CLUSTER; default ./${conn_file}, written by felix dev)." placeholder:"FILE"`
	Broker      string        `name:"broker" help:"Broker address to connect to, instead of a connection file (env FELIX_BROKER); needs --ca." placeholder:"ADDR"`
	CA          string        `name:"ca" help:"Cluster CA certificate to verify brokers with, for --broker (env FELIX_CA)." placeholder:"FILE"`
	Cert        string        `name:"cert" help:"Client certificate to authenticate with (env FELIX_CERT; default the connection file's)." placeholder:"FILE"`
	CertKey     string        `name:"cert-key" help:"Private key of --cert (env FELIX_CERT_KEY)." placeholder:"FILE"`
	JSON        bool          `name:"json" help:"Print data as JSON (one object per record for pub and sub)."`
	Timeout     time.Duration `help:"Bound on the command's requests (sub: on connecting)." default:"15s"`
	DialTimeout time.Duration `help:"Bound on connecting to one broker." default:"3s"`
}

// globals are the flags of every command.
type globals struct {
	LogFormat string `hidden:"" help:"Log format of the server commands: text or json." enum:"text,json" default:"text" env:"FELIX_LOG_FORMAT"`
	LogLevel  string `hidden:"" help:"Log level: debug, info, warn or error (default: info for server commands, warn otherwise)." enum:",debug,info,warn,error" default:"" env:"FELIX_LOG_LEVEL"`
}

// app is what commands are given besides their flags: where to write,
// the environment, and the logger.
type app struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	log            *slog.Logger
	// ctx ends on SIGINT or SIGTERM.
	ctx context.Context
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

// exitPanic carries kong's exit code (after --help, say) out of Parse.
type exitPanic struct{ code int }

// run runs felixctl with args and returns its exit code; main and the
// tests call it.
func run(args []string, stdout, stderr io.Writer, getenv func(string) string) (code int) {
	var c cli
	parser, err := kong.New(&c,
		kong.Name("felixctl"),
		kong.Description("felixctl publishes, subscribes and manages a Felix cluster.\n\nAfter `felix dev` it needs no flags: it reads ./"+client.DefaultClusterFile+". Exit codes: 0 ok, 1 failure, 2 usage, 3 cluster unhealthy."),
		kong.Writers(stdout, stderr),
		kong.Exit(func(code int) { panic(exitPanic{code}) }),
		kong.Vars{"conn_file": client.DefaultClusterFile},
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
	)
	if err != nil {
		panic(err) // the command structs are wrong: a bug
	}
	defer func() {
		if r := recover(); r != nil {
			e, ok := r.(exitPanic)
			if !ok {
				panic(r)
			}
			code = e.code
		}
	}()
	kctx, err := parser.Parse(args)
	if err != nil {
		fmt.Fprintf(stderr, "felixctl: %v\nrun `felixctl --help` for usage\n", err)
		return exitUsage
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a := &app{stdout: stdout, stderr: stderr, getenv: getenv, ctx: ctx}
	server := false
	switch kctx.Selected().Name {
	case "broker", "echo", "dev":
		server = true
	}
	level := c.LogLevel
	if level == "" {
		level = "warn"
		if server {
			level = "info"
		}
	}
	a.log = servercmd.NewLogger(c.LogFormat, level)

	if err := kctx.Run(a, a.log); err != nil {
		if server {
			fmt.Fprintf(stderr, "felixctl: %v\n", err)
			return exitFailure
		}
		msg, code := explain(err)
		fmt.Fprintf(stderr, "felixctl: %s\n", msg)
		return code
	}
	return exitOK
}
