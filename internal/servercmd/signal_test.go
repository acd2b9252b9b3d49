package servercmd

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/internal/clustertest"
	"github.com/felix-broker/felix/internal/syncbuf"
)

// devRun is a `felix dev` process a test started.
type devRun struct {
	cmd    *exec.Cmd
	dir    string        // where it runs
	admin  string        // its admin address
	exited chan struct{} // closed when it has exited
}

// startDev runs `felix <global...> dev` on free ports in a directory of
// its own and returns once its cluster is up; the test's end kills what
// is left of it.
func startDev(t *testing.T, global ...string) *devRun {
	t.Helper()
	return startDevIn(t, t.TempDir(), append(global, "dev", "--ctl-port", "0", "--base-port", "0")...)
}

// startDevIn runs `felix args...` in dir, as startDev does.
func startDevIn(t *testing.T, dir string, args ...string) *devRun {
	t.Helper()
	d := &devRun{dir: dir, exited: make(chan struct{})}
	d.cmd = exec.Command(clustertest.Binary(t), args...)
	d.cmd.Dir = d.dir
	stdout, err := d.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncbuf.Buffer // where felix dev says why it did not start
	d.cmd.Stderr = &stderr
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() {
		syscall.Kill(-d.cmd.Process.Pid, syscall.SIGCONT)
		syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.exited
	})
	adminLine := regexp.MustCompile(`admin \(control plane.*\): http://(\S+)`)
	lines := bufio.NewScanner(stdout)
	watchdog := time.AfterFunc(time.Minute, func() { d.cmd.Process.Kill() })
	up := false
	var out []string
	for !up && lines.Scan() {
		out = append(out, lines.Text())
		if m := adminLine.FindStringSubmatch(lines.Text()); m != nil {
			d.admin = m[1]
		}
		up = strings.Contains(lines.Text(), "ctrl-c stops the cluster")
	}
	watchdog.Stop()
	go func() {
		for lines.Scan() {
		}
	}()
	if !up || d.admin == "" {
		d.cmd.Process.Kill()
		<-d.exited
		t.Fatalf("felix dev did not come up:\n%s\n%s", strings.Join(out, "\n"), stderr.String())
	}
	return d
}

// TestDevSecondInterruptStopsAtOnce: a second Ctrl-C ends felix dev at
// once while its shutdown waits for a broker that does not stop (it
// waited its 30 s for each, and ignored every further signal).
func TestDevSecondInterruptStopsAtOnce(t *testing.T) {
	d := startDev(t)
	resp, err := http.Get("http://" + d.admin + "/brokers")
	if err != nil {
		t.Fatal(err)
	}
	var brokers []struct{ Pid int }
	err = json.NewDecoder(resp.Body).Decode(&brokers)
	resp.Body.Close()
	if err != nil || len(brokers) == 0 || brokers[0].Pid == 0 {
		t.Fatalf("brokers of felix dev: %+v, %v", brokers, err)
	}
	syscall.Kill(brokers[0].Pid, syscall.SIGSTOP) // a broker that does not stop
	d.cmd.Process.Signal(os.Interrupt)
	time.Sleep(time.Second)
	d.cmd.Process.Signal(os.Interrupt) // the second Ctrl-C
	select {
	case <-d.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("felix dev still runs 10 s after a second interrupt")
	}
}

// TestDevBrokersFollowLogFlags: felix dev's brokers log as its own log
// flags say (they logged text at info whatever was asked).
func TestDevBrokersFollowLogFlags(t *testing.T) {
	d := startDev(t, "--log-format", "json", "--log-level", "warn")
	out, err := os.ReadFile(filepath.Join(d.dir, "felix-dev", "broker-0.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		if !strings.HasPrefix(line, "{") || strings.Contains(line, `"level":"INFO"`) {
			t.Fatalf("broker-0 of `felix --log-format json --log-level warn dev` logged %q", line)
		}
	}
}

// TestUsageErrorExitsTwo: a command line felix cannot parse exits 2, as
// felixctl's does (kong's default was 80).
func TestUsageErrorExitsTwo(t *testing.T) {
	for _, args := range [][]string{{"frobnicate"}, {"broker", "--no-such-flag"}, {"--log-format", "xml", "dev"}} {
		err := exec.Command(clustertest.Binary(t), args...).Run()
		if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 2 {
			t.Errorf("felix %v: %v, want exit status 2", args, err)
		}
	}
}

// TestDevStartsAgainAfterKill: felix dev killed -9 (or its terminal
// closed) starts again on its directory and ports at once. The dead
// control plane's election key outlives it by its session lease, and
// names the address the new one listens at: the new one forwarded the
// creation of `orders` to itself, round after round, and gave up after
// 10 s ("the control plane has no reachable leader"), every time. And
// the embedded etcd's ports, kept from the first start, were of the
// kernel's ephemeral range: in a full test run another test's connection
// took one meanwhile ("bind: address already in use"); they are now
// below it (package freeport), as the control plane's port here is.
func TestDevStartsAgainAfterKill(t *testing.T) {
	p, err := cluster.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(p)
	dir := t.TempDir()
	args := []string{"dev", "--ctl-port", port, "--base-port", "0"}
	d := startDevIn(t, dir, args...)
	syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
	<-d.exited
	startDevIn(t, dir, args...)
}

// TestDevLeavesAnotherDevsConnFile: a second felix dev started in the same
// directory (with another --dir) while the first runs is refused, and the
// first's connection file stays: the second wrote over it, and removed it
// when it stopped, so felixctl found no cluster while the first ran on.
func TestDevLeavesAnotherDevsConnFile(t *testing.T) {
	d := startDev(t)
	conn := filepath.Join(d.dir, "felix-cluster.json")
	before, err := os.ReadFile(conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // without the check, it runs
	defer cancel()
	second := exec.CommandContext(ctx, clustertest.Binary(t), "dev", "--dir", filepath.Join(d.dir, "other"), "--ctl-port", "0", "--base-port", "0")
	second.Dir = d.dir
	second.WaitDelay = time.Second
	out, err := second.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "connection file of a felix dev that is running") {
		t.Fatalf("a second felix dev in the directory of a running one: %v\n%s", err, out)
	}
	if after, err := os.ReadFile(conn); err != nil || string(after) != string(before) {
		t.Fatalf("the first felix dev's connection file after the second was refused: %v\n%s", err, after)
	}
}

// TestDevSaysWhichEtcdPortIsTaken: felix dev started again while another
// program holds its embedded etcd's client port (kept from its first
// start) fails naming the file that keeps the port, and does not tell a
// user who already asked for free ports to ask for them.
func TestDevSaysWhichEtcdPortIsTaken(t *testing.T) {
	dir := t.TempDir()
	args := []string{"dev", "--ctl-port", "0", "--base-port", "0"}
	d := startDevIn(t, dir, args...)
	syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
	<-d.exited
	kept := filepath.Join(dir, "felix-dev", "ctl", "etcd-urls.json")
	b, err := os.ReadFile(kept)
	if err != nil {
		t.Fatal(err)
	}
	var urls struct{ Client string }
	if err := json.Unmarshal(b, &urls); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", strings.TrimPrefix(urls.Client, "https://"))
	if err != nil {
		t.Fatalf("holding the etcd client port %s: %v", urls.Client, err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	again := exec.CommandContext(ctx, clustertest.Binary(t), args...)
	again.Dir = dir
	again.WaitDelay = time.Second
	out, err := again.CombinedOutput()
	if err == nil || !strings.Contains(string(out), kept) || strings.Contains(string(out), "try --ctl-port 0") {
		t.Fatalf("felix dev with its etcd client port taken: %v\n%s", err, out)
	}
}
