package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/demo"
)

// TestBinary runs the built felixctl as a process: exit codes as a shell
// sees them, and `felixctl demo` starting brokers from its own executable.
func TestBinary(t *testing.T) {
	felixctl := binary(t)
	dir := t.TempDir()
	exitCode := func(args ...string) (string, int) {
		cmd := exec.Command(felixctl, args...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return string(out), exit.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	if out, code := exitCode("--help"); code != 0 || !strings.Contains(out, "Exit codes:") {
		t.Errorf("--help: exit %d\n%s", code, out)
	}
	// The version, from the build (telemetry.Version, as felix_build_info).
	for _, args := range [][]string{{"--version"}, {"version"}, {"stream", "ls", "--version"}} {
		if out, code := exitCode(args...); code != 0 || !regexp.MustCompile(`^felixctl \S+ \(.*go1\.\d+`).MatchString(out) {
			t.Errorf("%v: exit %d\n%s", args, code, out)
		}
	}
	// Completion scripts, generated from the command line's model.
	if out, code := exitCode("completion", "bash"); code != 0 || !strings.Contains(out, "complete -o default -F _felixctl felixctl") ||
		!strings.Contains(out, `"stream") echo "`) || !strings.Contains(out, "--json") {
		t.Errorf("completion bash: exit %d\n%s", code, out)
	}
	if out, code := exitCode("completion", "zsh"); code != 0 || !strings.Contains(out, "bashcompinit") {
		t.Errorf("completion zsh: exit %d\n%s", code, out)
	}
	if bash, err := exec.LookPath("bash"); err == nil {
		// The script loads, and completes subcommands and flags.
		script, _ := exitCode("completion", "bash")
		probe := script + "\nCOMP_WORDS=(felixctl stream c); COMP_CWORD=2; _felixctl; echo \"${COMPREPLY[@]}\"\n" +
			"COMP_WORDS=(felixctl sub orders --fr); COMP_CWORD=3; _felixctl; echo \"${COMPREPLY[@]}\"\n"
		out, err := exec.Command(bash, "-c", probe).CombinedOutput()
		if err != nil || string(out) != "create\n--from\n" {
			t.Errorf("bash completion: %v %q", err, out)
		}
	}
	if out, code := exitCode("frobnicate"); code != 2 {
		t.Errorf("unknown command: exit %d\n%s", code, out)
	}
	if out, code := exitCode("pub", "orders", "x"); code != 1 || !strings.Contains(out, "no cluster to talk to") {
		t.Errorf("nothing running: exit %d\n%s", code, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, felixctl, "demo", "--fast")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("felixctl demo: %v\n%s", err, out)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^published "hello" to orders via (broker-\d) → forwarded to (broker-\d) → acknowledged$`),
		regexp.MustCompile(`(?m)^published "direct" to orders via (broker-\d) \(the owner\) — written locally, no hop$`),
		regexp.MustCompile(`(?m)^all 24, each once`),
		regexp.MustCompile(`(?m)^cluster stopped\.$`),
	} {
		if !want.Match(out) {
			t.Errorf("felixctl demo printed no line matching %s:\n%s", want, out)
		}
	}
}

// TestDemoTmux drives `felixctl demo --tmux` in a real tmux server and
// asserts what each of the three panes shows, then that Ctrl-C tears
// everything down.
func TestDemoTmux(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("tmux is not installed")
	}
	felixctl := binary(t)
	socket := fmt.Sprintf("felixctl-test-%d", os.Getpid())
	tm := tmux{socket: socket}
	t.Cleanup(func() { tm.run(context.Background(), "kill-server") })

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, felixctl, "demo", "--tmux", "--no-attach", "--hold", "2m", "--fast", "--socket", socket, "--session", "demo")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait for the driver to say the story is told.
	lines := bufio.NewScanner(stdout)
	told := false
	for lines.Scan() {
		t.Logf("felixctl: %s", lines.Text())
		if strings.HasPrefix(lines.Text(), "the story is told") {
			told = true
			break
		}
	}
	if !told {
		cmd.Wait()
		t.Fatalf("felixctl demo --tmux ended before the story was told: %s", stderr.String())
	}
	go io.Copy(io.Discard, stdout)

	panes := map[string]string{} // title → whole history
	list, err := tm.run(ctx, "list-panes", "-t", "demo", "-F", "#{pane_id} #{pane_title}")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(list, "\n") {
		id, title, _ := strings.Cut(l, " ")
		text, err := tm.run(ctx, "capture-pane", "-p", "-J", "-S", "-", "-t", id)
		if err != nil {
			t.Fatal(err)
		}
		panes[title] = text
		t.Logf("--- pane %s %q ---\n%s", id, title, text)
	}
	clusterPane, subPane, pubPane := panes[titleCluster], panes[titleSubscriber], panes[titlePublisher]

	// Top left: the cluster and the ownership it settled on.
	m := regexp.MustCompile(`(?m)^orders +0 +(broker-\d)$`).FindStringSubmatch(clusterPane)
	if !strings.Contains(clusterPane, "$ felixctl dev") || m == nil {
		t.Fatalf("cluster pane shows no ownership")
	}
	owner := m[1]
	for _, id := range []string{"broker-0", "broker-1", "broker-2"} {
		if !regexp.MustCompile(`(?m)^` + id + ` +127\.0\.0\.1:\d+ +live +(no shards|1 shard)$`).MatchString(clusterPane) {
			t.Errorf("cluster pane: %s is not shown live", id)
		}
	}

	// Right: the publisher, choosing the broker.
	for _, want := range []string{
		`published "direct" to orders via ` + owner + ` (the owner) — written locally, no hop`,
		"$ felixctl pub orders seq --count 6 --via broker-0,broker-1,broker-2",
		"$ felixctl pub orders par --count 24 --concurrency 12 --via broker-0,broker-1,broker-2",
	} {
		if !strings.Contains(pubPane, want) {
			t.Errorf("publisher pane lacks %q", want)
		}
	}
	if !regexp.MustCompile(`(?m)^published "hello" to orders via broker-\d → forwarded to ` + owner + ` → acknowledged$`).MatchString(pubPane) {
		t.Errorf("publisher pane: no forwarded hello")
	}
	// The closing text, typed as comments wrapped between words to the
	// pane's width. A line typed before the shell printed its prompt is
	// echoed twice by the terminal ("# text$ # text"): read from the prompt.
	var why []string
	for _, m := range regexp.MustCompile(`(?m)\$ # (.*)$`).FindAllStringSubmatch(pubPane, -1) {
		why = append(why, strings.TrimSpace(m[1]))
	}
	if strings.Join(why, " ") != demo.Why {
		t.Errorf("publisher pane: the closing comments read %q, want %q", strings.Join(why, " "), demo.Why)
	}
	if n := len(regexp.MustCompile(`(?m)^published "par-\d{3}" `).FindAllString(pubPane, -1)); n != 24 {
		t.Errorf("publisher pane: %d of 24 concurrent records acknowledged", n)
	}

	// Bottom left: the subscriber attached to the owner got everything,
	// offsets dense, the six in order, the twenty-four all.
	if !strings.Contains(subPane, "$ felixctl sub orders --via "+owner+" --count 32") ||
		!strings.Contains(subPane, "subscribed to orders from earliest, attached to "+owner+" (the owner)") {
		t.Errorf("subscriber pane: not attached to the owner %s", owner)
	}
	var got []string
	for i, m := range regexp.MustCompile(`(?m)^received "([^"]*)" from orders \(shard 0, offset (\d+)\)$`).FindAllStringSubmatch(subPane, -1) {
		if m[2] != fmt.Sprint(i) {
			t.Errorf("subscriber pane: record %d has offset %s", i, m[2])
		}
		got = append(got, m[1])
	}
	if len(got) != 32 {
		t.Fatalf("subscriber pane shows %d records, want 32", len(got))
	}
	want := []string{"hello", "direct", "seq-000", "seq-001", "seq-002", "seq-003", "seq-004", "seq-005"}
	if !slices.Equal(got[:8], want) {
		t.Errorf("subscriber pane: first eight %v, want %v", got[:8], want)
	}
	par := slices.Sorted(slices.Values(got[8:]))
	for i, v := range par {
		if v != fmt.Sprintf("par-%03d", i) {
			t.Fatalf("subscriber pane: the 24 sorted are %v", par)
		}
	}

	// Ctrl-C tears down: the cluster, the session, the process.
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Errorf("felixctl demo --tmux after Ctrl-C: %v: %s", err, stderr.String())
	}
	if _, err := tm.run(context.Background(), "has-session", "-t", "=demo"); err == nil {
		t.Error("the tmux session is still there after teardown")
	}
}
