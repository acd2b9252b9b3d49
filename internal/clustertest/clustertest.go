// Package clustertest starts a real local cluster in one line of a test:
// the control plane in-process, brokers as `felix broker` processes built
// from the code under test, all torn down when the test ends, pass or fail.
package clustertest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
)

var build struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// Binary returns the felix binary built once per test process.
func Binary(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		build.dir, build.err = os.MkdirTemp("", "felix-bin-")
		if build.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		build.path, build.err = cluster.BuildFelix(ctx, build.dir)
	})
	if build.err != nil {
		t.Fatalf("building felix: %v", build.err)
	}
	return build.path
}

// Cleanup removes the binary built by Binary; call it from TestMain after
// m.Run.
func Cleanup() {
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
}

// Start starts a cluster of n brokers with a short lease, and stops it when
// the test ends. Broker logs are in the test's temp dir and are printed if
// the test fails.
func Start(t testing.TB, n int, tweak ...func(*cluster.Options)) *cluster.Cluster {
	t.Helper()
	dir := t.TempDir()
	opts := cluster.Options{Dir: dir, Binary: Binary(t), Brokers: n, LeaseTTL: time.Second}
	for _, f := range tweak {
		f(&opts)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		t.Fatalf("starting a %d-broker cluster: %v", n, err)
	}
	t.Cleanup(func() {
		// A broker that died on its own (a panic) fails the test, even
		// if no check looked at it: a fault test's kill of it would have
		// been no fault.
		if err := c.Close(); errors.Is(err, cluster.ErrExited) {
			t.Errorf("%v", err)
		}
		if t.Failed() {
			for _, b := range c.Brokers() {
				if out, err := os.ReadFile(filepath.Join(dir, b.ID+".log")); err == nil {
					t.Logf("--- %s log ---\n%s", b.ID, out)
				}
			}
		}
	})
	return c
}

// Connect connects an SDK client to broker id of c, verifying it against
// the cluster CA; the client is closed when the test ends.
func Connect(t testing.TB, c *cluster.Cluster, id string, opts ...client.Opt) *client.Client {
	t.Helper()
	b := c.Broker(id)
	if b == nil {
		t.Fatalf("no broker %q", id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts = append([]client.Opt{client.WithCAFile(c.CAFile()), client.WithClientCertFile(c.AdminCert())}, opts...)
	cl, err := client.Connect(ctx, b.Addr, opts...)
	if err != nil {
		t.Fatalf("connecting to %s at %s: %v", id, b.Addr, err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}
