package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/internal/clustertest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	clustertest.Cleanup()
	if bin.dir != "" {
		os.RemoveAll(bin.dir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// result is what one felixctl run printed and its exit code.
type result struct {
	stdout, stderr string
	code           int
}

// felixctl runs felixctl in-process with args and the environment env
// (nothing else of the process's environment is visible to it).
func felixctl(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr, func(k string) string { return env[k] })
	t.Logf("felixctl %v → exit %d\n%s%s", args, code, stdout.String(), stderr.String())
	return result{stdout.String(), stderr.String(), code}
}

// felixctlIn is felixctl with stdin as its standard input.
func felixctlIn(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := runIO(args, strings.NewReader(stdin), &stdout, &stderr, func(k string) string { return env[k] })
	t.Logf("felixctl %v < %q → exit %d\n%s%s", args, stdin, code, stdout.String(), stderr.String())
	return result{stdout.String(), stderr.String(), code}
}

// writeClusterFile writes the connection file of c into dir, as felix dev
// does, and returns its path.
func writeClusterFile(t *testing.T, c *cluster.Cluster, dir string) string {
	t.Helper()
	cf := client.ClusterFile{Name: "test", CAFile: c.CAFile()}
	cf.CertFile, cf.KeyFile = c.AdminCert()
	for _, b := range c.Brokers() {
		cf.Brokers = append(cf.Brokers, client.ClusterBroker{ID: b.ID, Addr: b.Addr})
	}
	path := filepath.Join(dir, client.DefaultClusterFile)
	if err := cf.Write(path); err != nil {
		t.Fatal(err)
	}
	return path
}

var bin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// binary builds felixctl once per test process, for the tests that need a
// real process (exit codes, tmux panes).
func binary(t *testing.T) string {
	t.Helper()
	bin.once.Do(func() {
		bin.dir, bin.err = os.MkdirTemp("", "felixctl-bin-")
		if bin.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		bin.path = filepath.Join(bin.dir, "felixctl")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin.path, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			bin.err = &buildError{err: err, out: string(out)}
		}
	})
	if bin.err != nil {
		t.Fatalf("building felixctl: %v", bin.err)
	}
	return bin.path
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }
