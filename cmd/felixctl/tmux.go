package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/demo"
)

// Pane titles; the tmux test finds the panes by them.
const (
	titleCluster    = "cluster: control plane + 3 brokers"
	titleSubscriber = "subscriber"
	titlePublisher  = "publisher"
)

// tmux runs tmux commands on one private server.
type tmux struct {
	socket string
}

func (t tmux) cmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "tmux", append([]string{"-L", t.socket}, args...)...)
	cmd.Env = withoutEnv(os.Environ(), "TMUX") // drive our server even from inside another tmux
	return cmd
}

// run runs one tmux command and returns its trimmed output.
func (t tmux) run(ctx context.Context, args ...string) (string, error) {
	var stderr bytes.Buffer
	cmd := t.cmd(ctx, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("tmux %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// pane is one pane of the demo: a bash whose prompt signals a tmux
// wait-for channel, so the driver knows when a command it typed is done.
type pane struct {
	t       tmux
	id      string // tmux pane id, "%3"
	channel string
}

// typeLine types line into the pane and presses Enter.
func (p *pane) typeLine(ctx context.Context, line string) error {
	if _, err := p.t.run(ctx, "send-keys", "-t", p.id, "-l", line); err != nil {
		return err
	}
	_, err := p.t.run(ctx, "send-keys", "-t", p.id, "Enter")
	return err
}

// waitPrompt waits until the pane's shell prints its next prompt (the
// command typed last has ended), or d passes.
func (p *pane) waitPrompt(ctx context.Context, d time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if _, err := p.t.run(wctx, "wait-for", p.channel); err != nil {
		if wctx.Err() != nil {
			return fmt.Errorf("the %s pane's command did not finish within %s", p.id, d)
		}
		return err
	}
	return nil
}

// run types line and waits for the command to end.
func (p *pane) run(ctx context.Context, line string, d time.Duration) error {
	if err := p.typeLine(ctx, line); err != nil {
		return err
	}
	return p.waitPrompt(ctx, d)
}

// runTmux tells the story in three tmux panes driven with real felixctl
// commands: top left `felixctl dev` (the cluster and its ownership),
// bottom left `felixctl sub` attached to the owner, right `felixctl pub`
// through the broker it names. Everything is torn down afterwards: the
// cluster is stopped with Ctrl-C in its pane, then the session is killed.
func (d *demoCmd) runTmux(a *app, self string) error {
	if _, err := exec.LookPath("tmux"); err != nil {
		return errors.New("demo --tmux needs tmux, which is not installed (apt-get install tmux, brew install tmux); `felixctl demo` tells the same story in one pane")
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		return errors.New("demo --tmux runs bash in its panes, which is not installed; `felixctl demo` tells the same story in one pane")
	}
	t := tmux{socket: d.Socket}
	ctx := a.ctx
	if _, err := t.run(ctx, "has-session", "-t", "="+d.Session); err == nil {
		return fmt.Errorf("a tmux session %s is already running on socket %s: watch it with `tmux -L %s attach -t %s`, or end it with `tmux -L %s kill-session -t %s`",
			d.Session, d.Socket, d.Socket, d.Session, d.Socket, d.Session)
	}

	dir, err := os.MkdirTemp("", "felix-demo-tmux-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// The panes type `felixctl`: put this executable on their PATH under
	// that name.
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		return err
	}
	if err := os.Symlink(self, filepath.Join(bin, "felixctl")); err != nil {
		return err
	}
	work := filepath.Join(dir, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		return err
	}

	// newPane runs a tmux command creating a pane (its args, then the
	// pane's shell command) and returns the new pane.
	newPane := func(args ...string) (*pane, error) {
		n := len(args) - 1
		args = append(append(args[:n:n], "-P", "-F", "#{pane_id}", "-c", work), args[n])
		id, err := t.run(ctx, args...)
		if err != nil {
			return nil, err
		}
		return &pane{t: t, id: id}, nil
	}
	shell := func(channel string) string {
		return fmt.Sprintf("exec env PATH=%s FELIX_LOG_LEVEL=warn PS1='$ ' PROMPT_COMMAND=%s %s --noprofile --norc -i",
			shellQuote(bin+":"+os.Getenv("PATH")), shellQuote("tmux wait-for -S "+channel), shellQuote(bash))
	}
	chan0 := d.Session + "-cluster"
	// 60 rows: the cluster's output (about 18 lines) on top, and below it
	// the subscriber's 35 (its command, its header, 32 records, a prompt).
	top, err := newPane("new-session", "-d", "-s", d.Session, "-x", "220", "-y", "60", shell(chan0))
	if err != nil {
		return err
	}
	top.channel = chan0
	defer func() {
		// Stop the cluster the way a person would, then the panes.
		tctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		t.run(tctx, "send-keys", "-t", top.id, "C-c")
		top.waitPrompt(tctx, 20*time.Second)
		t.run(tctx, "kill-session", "-t", "="+d.Session)
	}()
	right, err := newPane("split-window", "-h", "-l", "52%", "-t", top.id, shell(d.Session+"-publisher"))
	if err != nil {
		return err
	}
	right.channel = d.Session + "-publisher"
	bottom, err := newPane("split-window", "-v", "-l", "39", "-t", top.id, shell(d.Session+"-subscriber"))
	if err != nil {
		return err
	}
	bottom.channel = d.Session + "-subscriber"
	for _, o := range [][]string{
		{"set-option", "-t", d.Session, "pane-border-status", "top"},
		{"set-option", "-t", d.Session, "pane-border-format", " #{pane_title} "},
		{"set-option", "-t", d.Session, "status", "off"},
		{"select-pane", "-t", top.id, "-T", titleCluster},
		{"select-pane", "-t", bottom.id, "-T", titleSubscriber},
		{"select-pane", "-t", right.id, "-T", titlePublisher},
	} {
		if _, err := t.run(ctx, o...); err != nil {
			return err
		}
	}
	// Each shell signals its channel at its first prompt: consume that.
	for _, p := range []*pane{top, bottom, right} {
		if err := p.waitPrompt(ctx, 10*time.Second); err != nil {
			return err
		}
	}

	attach := d.Attach && isTerminal(os.Stdin)
	fmt.Fprintf(a.stdout, "tmux session %s started: watch it with `tmux -L %s attach -t %s`\n", d.Session, d.Socket, d.Session)
	story := make(chan error, 1)
	sctx, stopStory := context.WithCancel(ctx)
	defer stopStory()
	go func() { story <- d.drive(sctx, a, work, top, bottom, right) }()

	if !attach {
		err := <-story
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "the story is told; %s\n", holdText(d.Hold))
		return hold(ctx, d.Hold, nil)
	}
	// Attached: this terminal shows the session until the story is told
	// and held, or until the person detaches.
	att := t.cmd(context.Background(), "attach-session", "-t", "="+d.Session)
	att.Stdin, att.Stdout, att.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := att.Start(); err != nil {
		return fmt.Errorf("attaching to the tmux session: %w", err)
	}
	detached := make(chan struct{})
	go func() { att.Wait(); close(detached) }()
	select {
	case err = <-story:
		if err == nil {
			err = hold(ctx, d.Hold, detached)
		}
	case <-detached:
		stopStory()
		<-story
	}
	t.run(context.Background(), "kill-session", "-t", "="+d.Session) // ends the attach
	<-detached
	return err
}

// drive types the story into the panes.
func (d *demoCmd) drive(ctx context.Context, a *app, work string, top, bottom, right *pane) error {
	if err := top.typeLine(ctx, "felixctl dev --ctl-port 0 --base-port 0"); err != nil {
		return err
	}
	connFile := filepath.Join(work, client.DefaultClusterFile)
	if err := waitFile(ctx, connFile, 60*time.Second); err != nil {
		return fmt.Errorf("the cluster did not start in the top-left pane: %w (its logs are in %s)", err, filepath.Join(work, "felix-dev"))
	}
	owner, ids, err := ownership(ctx, connFile, "orders", a.log)
	if err != nil {
		return err
	}
	other := ids[0]
	if other == owner {
		other = ids[1]
	}
	pause := func() error {
		select {
		case <-time.After(d.pace()):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	const step = 30 * time.Second
	total := 2 + 6 + 24
	if err := bottom.typeLine(ctx, fmt.Sprintf("felixctl sub orders --via %s --count %d", owner, total)); err != nil {
		return err
	}
	if err := pause(); err != nil {
		return err
	}
	all := strings.Join(ids, ",")
	for _, line := range []string{
		"felixctl pub orders hello --via " + other,
		"felixctl pub orders direct --via " + owner,
		"felixctl pub orders seq --count 6 --via " + all,
		"felixctl pub orders par --count 24 --concurrency 12 --via " + all,
	} {
		if err := right.run(ctx, line, step); err != nil {
			return err
		}
		if err := pause(); err != nil {
			return err
		}
	}
	if err := bottom.waitPrompt(ctx, step); err != nil {
		return fmt.Errorf("the subscriber did not receive all %d records: %w", total, err)
	}
	// The explanation of the last burst, as shell comments wrapped to the
	// pane's width (a terminal would break the line mid-word).
	width := 100
	if out, err := right.t.run(ctx, "display-message", "-p", "-t", right.id, "#{pane_width}"); err == nil {
		if n, err := strconv.Atoi(out); err == nil && n > 20 {
			width = n
		}
	}
	for _, line := range wrapWords(demo.Why, width-len("$ # ")-1) {
		if err := right.run(ctx, "# "+line, step); err != nil {
			return err
		}
	}
	return nil
}

// wrapWords breaks text into lines of at most width runes, between words.
func wrapWords(text string, width int) []string {
	var lines []string
	var cur []string
	n := 0
	for _, w := range strings.Fields(text) {
		l := utf8.RuneCountInString(w)
		if n > 0 && n+1+l > width {
			lines = append(lines, strings.Join(cur, " "))
			cur, n = nil, 0
		}
		if n > 0 {
			n++
		}
		cur = append(cur, w)
		n += l
	}
	if len(cur) > 0 {
		lines = append(lines, strings.Join(cur, " "))
	}
	return lines
}

// ownership connects to the cluster in connFile and returns the owner of
// stream's shard 0 and the broker ids, once every broker has the stream.
func ownership(ctx context.Context, connFile, stream string, log *slog.Logger) (string, []string, error) {
	cf, err := client.LoadClusterFile(connFile)
	if err != nil {
		return "", nil, err
	}
	var ids []string
	for _, b := range cf.Brokers {
		ids = append(ids, b.ID)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := client.ConnectFile(cctx, connFile, client.WithLogger(log))
	if err != nil {
		return "", nil, err
	}
	defer c.Close()
	for {
		if m, err := c.Map(cctx); err == nil {
			if o, err := m.Owner(stream, 0); err == nil {
				return o.ID, ids, nil
			}
		}
		select {
		case <-cctx.Done():
			return "", nil, fmt.Errorf("stream %s never appeared in the shard map: %w", stream, cctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func waitFile(ctx context.Context, path string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %s", path, d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// hold waits d (forever when 0) or until ctx ends or done closes.
func hold(ctx context.Context, d time.Duration, done <-chan struct{}) error {
	var timeout <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-timeout:
	case <-ctx.Done():
	case <-done:
	}
	return nil
}

func holdText(d time.Duration) string {
	if d > 0 {
		return fmt.Sprintf("tearing down in %s (Ctrl-C here to do it now)", d)
	}
	return "press Ctrl-C here to tear it down"
}

// isTerminal says whether f is a terminal: one that answers a terminal's
// ioctl, not any character device (/dev/null is one: a script run with
// stdin from it, by cron, systemd or `docker run` without -t, was asked
// to confirm, and read no answer).
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

func withoutEnv(env []string, name string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
