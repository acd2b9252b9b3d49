package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/servercmd"
)

// TestDevRestart runs `felixctl dev` as a process, kills one of its
// brokers with SIGKILL, and brings it back with `felixctl dev restart`;
// on the way it checks the connection file names every process's admin
// address, that felix dev's own admin listener serves the control plane's
// metrics, and `cluster stats` piped through the real binary.
func TestDevRestart(t *testing.T) {
	felixctlBin := binary(t)
	dir := t.TempDir()
	logPath := filepath.Join(dir, "dev.out")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	dev := exec.Command(felixctlBin, "dev", "--ctl-port", "0", "--base-port", "0")
	dev.Dir = dir
	dev.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
	dev.Stdout, dev.Stderr = logf, logf
	dev.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		dev.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- dev.Wait() }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			dev.Process.Kill()
			<-done
		}
	}
	defer stop()
	defer func() {
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("felixctl dev output:\n%s", b)
		}
	}()

	file := filepath.Join(dir, client.DefaultClusterFile)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := waitFile(ctx, file, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	cf, err := client.LoadClusterFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if cf.Admin == "" {
		t.Fatalf("the connection file names no admin address for felix dev: %+v", cf)
	}
	for _, b := range cf.Brokers {
		if b.Admin == "" {
			t.Errorf("the connection file names no admin address for %s", b.ID)
		}
	}
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get("http://" + cf.Admin + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %s: %s", path, resp.Status, b)
		}
		return string(b)
	}
	if m := get("/metrics"); !strings.Contains(m, "felix_map_epoch") || !strings.Contains(m, `felix_build_info{`) {
		t.Errorf("felix dev's /metrics lacks the control plane's metrics:\n%.2000s", m)
	}
	if h := get("/healthz"); !strings.HasPrefix(h, "ok") {
		t.Errorf("/healthz: %q", h)
	}
	var brokers []servercmd.DevBroker
	if err := json.Unmarshal([]byte(get("/brokers")), &brokers); err != nil || len(brokers) != 3 {
		t.Fatalf("/brokers: %v %+v", err, brokers)
	}
	victim := brokers[1]
	if !victim.Running || victim.Pid == 0 {
		t.Fatalf("%+v", victim)
	}

	// kill -9 from outside, as a person would.
	if err := syscall.Kill(victim.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"FELIX_CLUSTER": file}
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := felixctl(t, env, "cluster", "status")
		if r.code == exitUnhealthy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed %s is not reported down: %+v", victim.ID, r)
		}
		time.Sleep(300 * time.Millisecond)
	}

	r := felixctl(t, env, "dev", "restart", victim.ID)
	if r.code != 0 || !regexp.MustCompile(`^`+victim.ID+` started again \(pid \d+\): live at `+regexp.QuoteMeta(victim.Addr)+"\n$").MatchString(r.stdout) {
		t.Fatalf("dev restart: %+v", r)
	}
	if r := felixctl(t, env, "cluster", "status"); r.code != 0 {
		t.Errorf("after the restart: %+v", r)
	}
	if r := felixctl(t, env, "pub", "orders", "back", "--via", victim.ID); r.code != 0 {
		t.Errorf("publish through the restarted broker: %+v", r)
	}
	if r := felixctl(t, env, "dev", "restart", "broker-7"); r.code != 2 || !strings.Contains(r.stderr, `there is no broker "broker-7"; the brokers are broker-0, broker-1, broker-2`) {
		t.Errorf("dev restart of an unknown broker: %+v", r)
	}
	// The connection file follows the restarted broker's new admin address.
	deadline = time.Now().Add(10 * time.Second)
	for {
		cf2, err := client.LoadClusterFile(file)
		if err == nil {
			if b, _ := cf2.Broker(victim.ID); b.Admin != "" && b.Admin != victim.Admin {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Errorf("the connection file still names %s's old admin address", victim.ID)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}

	// cluster stats, piped: every table, no escapes.
	stats := exec.Command(felixctlBin, "cluster", "stats", "--count", "2", "--interval", "200ms")
	stats.Dir = dir
	stats.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
	out, err := stats.Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) || err != nil || strings.Count(string(out), "felix cluster: epoch") != 2 || strings.Contains(string(out), "\x1b") {
		t.Errorf("cluster stats | cat: %v\n%q", err, out)
	}

	stop()
	b, _ := os.ReadFile(logPath)
	for _, want := range []string{
		"try:  felixctl pub orders hello --via broker-0",
		victim.ID + " is down; restart it with `felixctl dev restart " + victim.ID + "`",
		victim.ID + " is live",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("felix dev's output lacks %q", want)
		}
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("the connection file outlived felix dev: %v", err)
	}
}

// TestDevBrokersDieWithFelixctl: felixctl dev (and demo, bench --local)
// start brokers as `felixctl broker` with a parent-death signal, so that
// they die with it; the broker re-executes itself (sysmon.Reexec), which
// kept the signal only from the process's first thread. It once ran from
// whichever thread the main goroutine was on, and the brokers outlived a
// felixctl killed with SIGKILL (or SIGPIPE from `| head`).
func TestDevBrokersDieWithFelixctl(t *testing.T) {
	exe := binary(t)
	dir := t.TempDir()
	cmd := exec.Command(exe, "dev", "--ctl-port", "0", "--base-port", "0")
	cmd.Dir = dir
	cmd.Env = withoutEnv(os.Environ(), "GODEBUG")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pids []int
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) && len(pids) == 0 {
		time.Sleep(500 * time.Millisecond)
		cf, err := client.LoadClusterFile(filepath.Join(dir, client.DefaultClusterFile))
		if err != nil || cf.Admin == "" {
			continue
		}
		resp, err := http.Get("http://" + cf.Admin + "/brokers")
		if err != nil {
			continue
		}
		var bs []struct{ Pid int }
		json.NewDecoder(resp.Body).Decode(&bs)
		resp.Body.Close()
		for _, b := range bs {
			if b.Pid > 0 {
				pids = append(pids, b.Pid)
			}
		}
	}
	if len(pids) == 0 {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("felixctl dev did not come up")
	}
	cmd.Process.Kill() // SIGKILL: no graceful Close
	cmd.Wait()
	time.Sleep(2 * time.Second)
	var alive []int
	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			alive = append(alive, pid)
			syscall.Kill(pid, syscall.SIGKILL) // clean up what we started
		}
	}
	if len(alive) > 0 {
		t.Errorf("brokers %v outlived their felixctl dev (SIGKILLed): Pdeathsig lost in the re-exec", alive)
	}
}
