package servercmd

import (
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"time"
)

// slowShutdown is how long a server's shutdown may take before
// closeWatched writes every goroutine's stack: docker stop kills after
// 10 s, and a shutdown killed that way says nothing of where it hung.
const slowShutdown = 6 * time.Second

// closeWatched runs shut, a server's shutdown after SIGTERM, and writes
// every goroutine's stack to stderr, once, if it has not returned after
// slowShutdown.
func closeWatched(log *slog.Logger, what string, shut func() error) error {
	return closeWatchedTo(log, os.Stderr, slowShutdown, what, shut)
}

func closeWatchedTo(log *slog.Logger, w io.Writer, after time.Duration, what string, shut func() error) error {
	done := make(chan struct{})
	t := time.AfterFunc(after, func() {
		log.Warn(what+": shutdown is slow; every goroutine's stack follows on stderr", "after", after)
		_ = pprof.Lookup("goroutine").WriteTo(w, 2)
		close(done)
	})
	err := shut()
	if !t.Stop() {
		<-done // the stacks are written before the process goes on to exit
	}
	return err
}
