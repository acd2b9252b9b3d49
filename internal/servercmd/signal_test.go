package servercmd

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/clustertest"
)

// TestDevSecondInterruptStopsAtOnce: a second Ctrl-C ends felix dev at
// once while its shutdown waits for a broker that does not stop (it
// waited its 30 s for each, and ignored every further signal).
func TestDevSecondInterruptStopsAtOnce(t *testing.T) {
	cmd := exec.Command(clustertest.Binary(t), "dev", "--ctl-port", "0", "--base-port", "0")
	cmd.Dir = t.TempDir()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT)
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	})
	adminLine := regexp.MustCompile(`admin \(control plane.*\): http://(\S+)`)
	lines := bufio.NewScanner(stdout)
	admin := ""
	watchdog := time.AfterFunc(time.Minute, func() { cmd.Process.Kill() })
	for lines.Scan() && !strings.Contains(lines.Text(), "ctrl-c stops the cluster") {
		if m := adminLine.FindStringSubmatch(lines.Text()); m != nil {
			admin = m[1]
		}
	}
	watchdog.Stop()
	go func() {
		for lines.Scan() {
		}
	}()
	if admin == "" {
		t.Fatal("felix dev did not come up")
	}
	resp, err := http.Get("http://" + admin + "/brokers")
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
	cmd.Process.Signal(os.Interrupt)
	time.Sleep(time.Second)
	cmd.Process.Signal(os.Interrupt) // the second Ctrl-C
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("felix dev still runs 10 s after a second interrupt")
	}
}
