// Package servercmd holds the server commands shared by the felix and
// felixctl executables: `broker`, `ctl`, `dev` and the RTT `echo` floor.
// felixctl carries `broker` and `echo` as hidden commands so that its demo
// and bench can start real broker and echo processes from its own
// executable, with nothing else installed.
//
// Each command is a kong command struct whose Run takes the process's
// *slog.Logger. A broker, ctl or etcd member that takes longer than 6 s to shut down
// after SIGTERM writes every goroutine's stack to stderr (shutdown.go),
// so that a shutdown an orchestrator kills says where it hung.
package servercmd
