package servercmd

import (
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"time"
)

// slowShutdown is how long a server's shutdown may take before its watch
// writes every goroutine's stack: docker stop kills after 10 s, and a
// shutdown killed that way says nothing of where it hung.
const slowShutdown = 6 * time.Second

// shutdownWatch writes every goroutine's stack to stderr, once, if a
// server has not finished shutting down slowShutdown after it began. A
// Run makes it first (watchShutdown) and defers end, so that the watch
// covers everything up to the return, the closes deferred after it
// (observability, the admin listener) included; begin starts it when the
// signal to stop arrives. Both are called from Run's goroutine.
type shutdownWatch struct {
	log   *slog.Logger
	w     io.Writer
	after time.Duration
	what  string
	t     *time.Timer
	done  chan struct{} // closed once the stacks are written
}

func watchShutdown(log *slog.Logger, what string) *shutdownWatch {
	return &shutdownWatch{log: log, w: os.Stderr, after: slowShutdown, what: what, done: make(chan struct{})}
}

// begin logs that the shutdown begins and starts the watch. stop ends
// the server's signal handling (signal.NotifyContext's): a second
// SIGINT or SIGTERM then ends the process at once, as its default
// action, however the shutdown stands (a close that hangs, on a disk
// that does not answer, could otherwise be ended only by SIGKILL; the
// logs are crash-safe, so that loses nothing acknowledged).
func (sw *shutdownWatch) begin(stop func()) {
	stop()
	sw.log.Info("shutting down (a second signal stops the process at once)")
	sw.t = time.AfterFunc(sw.after, func() {
		sw.log.Warn(sw.what+": shutdown is slow; every goroutine's stack follows on stderr", "after", sw.after)
		_ = pprof.Lookup("goroutine").WriteTo(sw.w, 2)
		close(sw.done)
	})
}

// end stops the watch; if it fired, it waits for the stacks to be
// written before the process goes on to exit. A no-op before begin.
func (sw *shutdownWatch) end() {
	if sw.t != nil && !sw.t.Stop() {
		<-sw.done
	}
}
