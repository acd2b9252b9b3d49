package main

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/clustertest"
)

// TestSubCountInterrupted: `sub --count` stopped by a signal before its
// records came has not done what it was asked, and exits 1 saying so (a
// script's `timeout 10 felixctl sub orders --count 3` exited 0 having
// received nothing); an open-ended `sub` stopped so exits 0.
func TestSubCountInterrupted(t *testing.T) {
	felixctl := binary(t)
	c := clustertest.Start(t, 1)
	dir := t.TempDir()
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "FELIX_CLUSTER=" + writeClusterFile(t, c, dir)}
	create := exec.Command(felixctl, "stream", "create", "orders")
	create.Env = env
	if out, err := create.CombinedOutput(); err != nil {
		t.Fatalf("stream create: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"sub", "orders", "--from", "latest", "--count", "3"}, 1, "interrupted after 0 of 3 records from orders"},
		{[]string{"sub", "orders", "--from", "latest"}, 0, ""},
	} {
		cmd := exec.Command(felixctl, tc.args...)
		cmd.Env = env
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := bufio.NewScanner(stderr)
		var said strings.Builder
		for lines.Scan() && !strings.Contains(lines.Text(), "subscribed to orders") {
			said.WriteString(lines.Text() + "\n")
		}
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		for lines.Scan() {
			said.WriteString(lines.Text() + "\n")
		}
		err = cmd.Wait()
		code := 0
		if exit := (*exec.ExitError)(nil); errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code || !strings.Contains(said.String(), tc.says) {
			t.Errorf("%v stopped by SIGTERM: exit %d, stderr %q; want exit %d saying %q", tc.args, code, said.String(), tc.code, tc.says)
		}
	}
}

// TestPubTimeoutPerPublish: --timeout bounds each publish of `pub
// --count`, not the whole run: a run longer than it, each publish well
// within it, succeeds (it failed after the first second's records, as if
// the cluster had not answered).
func TestPubTimeoutPerPublish(t *testing.T) {
	c := clustertest.Start(t, 1)
	env := map[string]string{"FELIX_CLUSTER": writeClusterFile(t, c, t.TempDir())}
	if r := felixctl(t, env, "stream", "create", "orders"); r.code != 0 {
		t.Fatal(r)
	}
	start := time.Now()
	r := felixctl(t, env, "pub", "orders", "x", "--count", "2000", "--timeout", "500ms", "--json")
	took := time.Since(start)
	if r.code != 0 || strings.Count(r.stdout, "\n") != 2000 {
		t.Fatalf("pub --count 2000 --timeout 500ms: exit %d after %v with %d acks: %s", r.code, took, strings.Count(r.stdout, "\n"), r.stderr)
	}
	if took < 500*time.Millisecond {
		t.Logf("the run took %v, less than --timeout: this run shows nothing", took)
	}
}
