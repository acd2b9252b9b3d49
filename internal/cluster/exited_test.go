package cluster

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestKillOfACrashedBroker: a broker process that died on its own (a
// panic, exit 2) is no broker to kill: Kill says so, with its exit status
// and the last line of its log, and so does Close (Kill once returned
// nil, and a crash under a kill loop went unreported).
func TestKillOfACrashedBroker(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "fakebroker")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho 'panic: boom' >&2\nexit 2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := &Cluster{opts: Options{Dir: dir, Binary: bin}, brokers: []*Broker{{ID: "broker-0", Addr: "127.0.0.1:1", DataDir: dir}}}
	crash := func() {
		t.Helper()
		if err := c.StartBroker("broker-0"); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); c.Broker("broker-0").Running(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the fake broker did not exit")
			}
		}
	}
	crash()
	err := c.Kill("broker-0")
	if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "exit status 2") || !strings.Contains(err.Error(), "panic: boom") {
		t.Fatalf("Kill of a broker that had crashed: %v; want ErrExited with its status and log", err)
	}
	if err := c.Kill("broker-0"); err != nil {
		t.Fatalf("Kill of a broker killed before: %v", err)
	}
	crash()
	if err := c.Close(); !errors.Is(err, ErrExited) {
		t.Fatalf("Close with a crashed broker: %v; want ErrExited", err)
	}
}
