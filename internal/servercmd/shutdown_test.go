package servercmd

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/felix-broker/felix/internal/dirlock"
	"github.com/felix-broker/felix/transport"
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

// TestCtlRunOnABusyPortClosesWhatItStarted: felix ctl whose listen
// port is taken fails, and closes what it had started before it returns:
// the embedded etcd, the control plane's goroutines, its data directory's
// lock. They were left running.
func TestCtlRunOnABusyPortClosesWhatItStarted(t *testing.T) {
	before := goleak.IgnoreCurrent()
	dir := t.TempDir()
	if err := transport.GenerateDevCerts(filepath.Join(dir, "certs"), "ctl"); err != nil {
		t.Fatal(err)
	}
	busy, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	c := &Ctl{Listen: busy.LocalAddr().String(), Data: filepath.Join(dir, "data"), Certs: filepath.Join(dir, "certs"),
		LeaseTTL: time.Second, Superuser: []string{"admin"}, MaxShardsTotal: 16384, MaxGrants: 16384}
	c.Etcd.Cluster = "default"
	c.Etcd.StartTimeout = 30 * time.Second
	if err := c.Run(slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("Run on a busy port succeeded")
	}
	lock, err := dirlock.Take(c.Data)
	if err != nil {
		t.Errorf("the data directory after Run returned: %v", err)
	} else {
		lock.Release()
	}
	if err := goleak.Find(before); err != nil {
		t.Errorf("still running after Run returned:\n%.3000s", err.Error())
	}
}
