// Command felixctl is the operator and user CLI of Felix: publish and
// subscribe (`pub`, `sub`), manage streams (`stream create|ls|info|rm`,
// and `stream move` of a replica off a broker lost for good),
// permissions (`acl`) and saved clusters (`context`), check the cluster
// (`cluster status|stats`), retire a broker lost for good (`cluster
// drain|remove`), run a local one (`dev`, `dev restart ID`),
// measure it (`bench`), and watch the seed's story on a cluster it starts
// itself (`demo`, `demo --tmux`).
//
// It finds the cluster, first match wins: the flags --broker ADDR (with
// --ca FILE), --cluster FILE, --context NAME; the environment
// FELIX_BROKER (FELIX_CA), FELIX_CLUSTER, FELIX_CONTEXT; the connection
// file felix-cluster.json in the working directory (written by `felix
// dev`); the selected context (`felixctl context use NAME`). The
// connection flags and --json are global: they go before or after the
// command. --json prints one JSON object per line.
//
// Exit codes: 0 success, 1 failure, 2 usage, 3 the cluster is unhealthy
// (`cluster status` or `cluster stats` with a broker down).
//
// felixctl also carries the hidden server commands `broker` and `echo`
// (internal/servercmd), so that `demo`, `dev` and `bench` start real
// broker processes from its own executable with nothing else installed.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/kong"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/servercmd"
	"github.com/felix-broker/felix/internal/sysmon"
)

// cli is the command line. The connection and output flags are global:
// they are accepted anywhere on the line (`felixctl --json stream ls` and
// `felixctl stream ls --json` are the same), and every command shares them.
type cli struct {
	clientFlags
	globals

	Pub     pubCmd     `cmd:"" help:"Publish records and print the path each took."`
	Sub     subCmd     `cmd:"" help:"Subscribe to a stream and print its records."`
	Stream  streamCmd  `cmd:"" help:"Create, list, describe and delete streams; move a replica off a broker lost for good."`
	Cluster clusterCmd `cmd:"" help:"Inspect the cluster; drain and remove a broker lost for good."`
	ACL     aclCmd     `cmd:"" name:"acl" help:"Grant, revoke and list permissions."`
	Context contextCmd `cmd:"" help:"Save, select and list named clusters (contexts), like nats context."`
	Demo    demoCmd    `cmd:"" help:"Watch the cross-broker publishing story on a cluster started (and stopped) for it."`
	Dev     devCmd     `cmd:"" help:"Run a local cluster in this directory (like felix dev), or restart one of its brokers."`
	benchMount
	Version    versionCmd    `cmd:"" help:"Print felixctl's version (the build's module version and commit)."`
	Completion completionCmd `cmd:"" help:"Print a shell completion script: eval \"$(felixctl completion bash)\" (bash or zsh)."`

	// Server commands run from felixctl's own executable by demo (and
	// bench): hidden, for the harness, not for users.
	Broker servercmd.Broker `cmd:"" hidden:"" help:"Run one broker (used by demo)."`
	Echo   servercmd.Echo   `cmd:"" hidden:"" help:"Serve a QUIC echo (used by bench)."`
}

// clientFlags are the flags of every command that talks to a cluster,
// global so that they may come before or after the command.
type clientFlags struct {
	Cluster     string        `name:"cluster" group:"Connection" help:"Cluster connection file (env FELIX_CLUSTER; default ./${conn_file}, written by felix dev)." placeholder:"FILE"`
	Broker      string        `name:"broker" group:"Connection" help:"Broker address to connect to, instead of a connection file (env FELIX_BROKER); needs --ca." placeholder:"ADDR"`
	CA          string        `name:"ca" group:"Connection" help:"Cluster CA certificate to verify brokers with, for --broker (env FELIX_CA)." placeholder:"FILE"`
	Cert        string        `name:"cert" group:"Connection" help:"Client certificate to authenticate with (env FELIX_CERT; default the connection file's)." placeholder:"FILE"`
	CertKey     string        `name:"cert-key" group:"Connection" help:"Private key of --cert (env FELIX_CERT_KEY)." placeholder:"FILE"`
	ContextName string        `name:"context" group:"Connection" help:"Use the saved context NAME (env FELIX_CONTEXT; see felixctl context)." placeholder:"NAME"`
	JSON        bool          `name:"json" help:"Print data as JSON: one object per line (NDJSON), for every command."`
	Timeout     time.Duration `group:"Connection" help:"Bound on the command's requests (sub: on connecting)." default:"15s"`
	DialTimeout time.Duration `group:"Connection" help:"Bound on connecting to one broker." default:"3s"`
}

// globals are the flags of every command.
type globals struct {
	VersionFlag kong.VersionFlag `name:"version" help:"Print the version and exit."`
	LogFormat   string           `hidden:"" help:"Log format of the server commands: text or json." enum:"text,json" default:"text" env:"FELIX_LOG_FORMAT"`
	LogLevel    string           `hidden:"" help:"Log level: debug, info, warn or error (default: info for server commands, warn otherwise)." enum:",debug,info,warn,error" default:"" env:"FELIX_LOG_LEVEL"`
}

// app is what commands are given besides their flags: where to write,
// the environment, and the logger.
type app struct {
	stdout, stderr io.Writer
	stdin          io.Reader
	// interactive is whether stdin is a terminal: a command that destroys
	// data asks first (confirm).
	interactive bool
	getenv      func(string) string
	// flags are the global connection and output flags.
	flags *clientFlags
	// model is the parsed command line model (for completion).
	model *kong.Application
	log   *slog.Logger
	// ctx ends on SIGINT or SIGTERM.
	ctx context.Context
}

// init keeps the main goroutine on the process's first thread until main
// knows whether it re-executes itself as a broker (sysmon.Reexec): the
// parent-death signal a local cluster starts its brokers with
// (internal/cluster) is the first thread's, and an exec from another
// thread loses it, so that brokers of a felix or felixctl dev killed with
// SIGKILL outlived it, holding their ports and data. main unlocks it then:
// a locked goroutine cannot run a coroutine (iter.Pull) on another thread.
func init() { runtime.LockOSThread() }

// reexec is sysmon.Reexec in the felixctl executable, nil in its tests
// (which run commands in-process).
var reexec func() error

func main() {
	reexec = sysmon.Reexec
	os.Exit(runIO(os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv))
}

// exitPanic carries kong's exit code (after --help, say) out of Parse.
type exitPanic struct{ code int }

// run runs felixctl with args and returns its exit code; main and the
// tests call it.
func run(args []string, stdout, stderr io.Writer, getenv func(string) string) (code int) {
	return runIO(args, strings.NewReader(""), stdout, stderr, getenv)
}

// runIO is run with standard input (read by `pub STREAM -`).
func runIO(args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) (code int) {
	var c cli
	parser, err := kong.New(&c,
		kong.Name("felixctl"),
		kong.Description("felixctl publishes, subscribes and manages a Felix cluster.\n\nAfter `felix dev` it needs no flags: it reads ./"+client.DefaultClusterFile+". Exit codes: 0 ok, 1 failure, 2 usage, 3 cluster unhealthy."),
		kong.Writers(stdout, stderr),
		kong.Exit(func(code int) { panic(exitPanic{code}) }),
		kong.Vars{"conn_file": client.DefaultClusterFile, "version": "felixctl " + versionLine(), "max_record": maxRecordText},
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		kong.Help(helpPrinter),
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
		fmt.Fprintf(stderr, "felixctl: %s\nrun `felixctl --help` for usage\n", parseMessage(err))
		return exitUsage
	}

	switch cmd := kctx.Command(); cmd {
	case "demo", "dev", "dev run":
		if c.JSON {
			// Their output is a story and a server's log for people; a
			// script reads the cluster they start with the other
			// commands, which do print JSON.
			fmt.Fprintf(stderr, "felixctl: %s has no --json output (run it without; `felixctl --json cluster status` and the other commands print JSON about the cluster it starts)\n", strings.TrimSuffix(cmd, " run"))
			return exitUsage
		}
	}

	ctx, stop := context.Background(), func() {}
	if cmd := kctx.Command(); cmd != "dev" && cmd != "dev run" {
		// felixctl dev takes its signals itself (servercmd.Dev.Run), and
		// lets a second one end it at once: a registration here would
		// catch that one.
		ctx, stop = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	}
	defer stop()
	a := &app{stdout: stdout, stderr: stderr, stdin: stdin, getenv: getenv, ctx: ctx, flags: &c.clientFlags, model: parser.Model}
	if f, ok := stdin.(*os.File); ok {
		a.interactive = isTerminal(f)
	}
	server := false
	switch kctx.Command() {
	case "broker", "echo", "dev", "dev run":
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
	if cmd := kctx.Command(); reexec != nil && (cmd == "broker" || cmd == "echo") {
		// Returns only without the exec (see package sysmon).
		if err := reexec(); err != nil {
			a.log.Warn("felixctl: going on with the Go runtime's sysmon parking when idle", "err", err)
		}
	}
	runtime.UnlockOSThread() // locked by init for the re-exec (a no-op on a goroutine not locked)

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

// helpPrinter is kong's help, except that a command's help does not repeat
// the global connection flags (they are in `felixctl --help`), only says
// they exist.
func helpPrinter(options kong.HelpOptions, ctx *kong.Context) error {
	if ctx.Selected() == nil {
		return kong.DefaultHelpPrinter(options, ctx)
	}
	var hidden []*kong.Flag
	for _, f := range ctx.Model.Flags {
		if f.Group != nil && f.Group.Key == "Connection" && !f.Hidden {
			f.Hidden = true
			hidden = append(hidden, f)
		}
	}
	defer func() {
		for _, f := range hidden {
			f.Hidden = false
		}
	}()
	if err := kong.DefaultHelpPrinter(options, ctx); err != nil {
		return err
	}
	_, err := fmt.Fprintln(ctx.Stdout, "\nConnection flags (--cluster, --broker, --ca, --cert, --cert-key, --context, --timeout, --dial-timeout)\ngo before or after the command: see `felixctl --help`.")
	return err
}
