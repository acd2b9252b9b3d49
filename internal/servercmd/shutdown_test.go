package servercmd

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestShutdownWatchWritesStacksOfASlowShutdown: what runs after begin,
// until end, is watched: a shutdown stuck there past the watch's time
// gets its stacks written and a warning logged, before end returns.
func TestShutdownWatchWritesStacksOfASlowShutdown(t *testing.T) {
	var stacks, logged bytes.Buffer
	sw := &shutdownWatch{log: slog.New(slog.NewTextHandler(&logged, nil)), w: &stacks, after: 10 * time.Millisecond,
		what: "ctl", done: make(chan struct{})}
	stopped := false
	func() {
		defer sw.end() // as a Run defers it, before its other closes
		sw.begin(func() { stopped = true })
		time.Sleep(200 * time.Millisecond) // a deferred close stuck here
	}()
	if !stopped {
		t.Error("begin left the signal handling on: a second signal would not end the process")
	}
	if !strings.Contains(stacks.String(), "TestShutdownWatchWritesStacksOfASlowShutdown") {
		t.Errorf("the stacks written do not show the stuck shutdown:\n%s", stacks.String())
	}
	if !strings.Contains(logged.String(), "ctl: shutdown is slow") || !strings.Contains(logged.String(), "shutting down") {
		t.Errorf("want the shutdown and the warning logged: %q", logged.String())
	}
}

func TestShutdownWatchQuiet(t *testing.T) {
	for _, begun := range []bool{false, true} {
		var stacks bytes.Buffer
		sw := &shutdownWatch{log: slog.New(slog.NewTextHandler(io.Discard, nil)), w: &stacks, after: 50 * time.Millisecond,
			what: "broker", done: make(chan struct{})}
		if begun {
			sw.begin(func() {})
		}
		sw.end()
		time.Sleep(100 * time.Millisecond)
		if stacks.Len() != 0 {
			t.Errorf("begun %v: stacks written for a prompt shutdown: %d bytes", begun, stacks.Len())
		}
	}
}
