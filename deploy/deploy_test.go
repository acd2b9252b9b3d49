package deploy

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// The felix binary of this checkout, built once for the tests.
var felixBin struct {
	once sync.Once
	path string
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if felixBin.dir != "" {
		os.RemoveAll(felixBin.dir)
	}
	os.Exit(code)
}

func felix(t *testing.T) string {
	t.Helper()
	felixBin.once.Do(func() {
		felixBin.dir, felixBin.err = os.MkdirTemp("", "felix-deploy-test-")
		if felixBin.err != nil {
			return
		}
		felixBin.path = filepath.Join(felixBin.dir, "felix")
		out, err := exec.Command("go", "build", "-o", felixBin.path, "../cmd/felix").CombinedOutput()
		if err != nil {
			felixBin.err = fmt.Errorf("go build ./cmd/felix: %v\n%s", err, out)
		}
	})
	if felixBin.err != nil {
		t.Fatal(felixBin.err)
	}
	return felixBin.path
}

// command is what `felix <path> --help` says a command takes.
type command struct {
	flags map[string]bool // without the leading --
	env   map[string]bool // FELIX_* variables
}

var (
	helpMu   sync.Mutex
	helpSeen = map[string]command{}
	// A flag's definition starts a help line, indented a few spaces; its
	// description's continuation lines are indented further.
	flagDef = regexp.MustCompile(`(?m)^ {2,6}(?:-\w, )?--([a-z0-9][a-z0-9-]*)`)
	envRef  = regexp.MustCompile(`\(\$(FELIX_[A-Z0-9_]+)\)`)
)

// help runs `felix <path> --help` and returns its flags and variables.
func help(t *testing.T, path ...string) command {
	t.Helper()
	key := strings.Join(path, " ")
	helpMu.Lock()
	defer helpMu.Unlock()
	if c, ok := helpSeen[key]; ok {
		return c
	}
	out, err := exec.Command(felix(t), append(slices.Clone(path), "--help")...).CombinedOutput()
	if err != nil {
		t.Fatalf("felix %s --help: %v\n%s", key, err, out)
	}
	c := command{flags: map[string]bool{}, env: map[string]bool{}}
	for _, m := range flagDef.FindAllStringSubmatch(string(out), -1) {
		c.flags[m[1]] = true
	}
	for _, m := range envRef.FindAllStringSubmatch(string(out), -1) {
		c.env[m[1]] = true
	}
	if len(c.flags) < 3 {
		t.Fatalf("felix %s --help: found only flags %v in\n%s", key, c.flags, out)
	}
	helpSeen[key] = c
	return c
}

// subcommands are felix's commands with subcommands of their own.
var subcommands = map[string][]string{"certs": {"ca", "node", "ctl", "client", "dev"}}

// splitArgs splits felix's arguments into the command path and the
// flags given to it (names without -- or =value).
func splitArgs(args []string) (path, flags []string) {
	if len(args) == 0 {
		return nil, nil
	}
	path = []string{args[0]}
	rest := args[1:]
	if subs, ok := subcommands[args[0]]; ok && len(rest) > 0 && slices.Contains(subs, rest[0]) {
		path, rest = append(path, rest[0]), rest[1:]
	}
	for _, a := range rest {
		if name, ok := strings.CutPrefix(a, "--"); ok {
			name, _, _ = strings.Cut(name, "=")
			flags = append(flags, name)
		}
	}
	return path, flags
}

// checkInvocation fails the test unless every flag in args and every
// FELIX_* name in env is one the command of args has.
func checkInvocation(t *testing.T, where string, args []string, env []string) {
	t.Helper()
	path, flags := splitArgs(args)
	if len(path) == 0 {
		t.Errorf("%s: no felix command", where)
		return
	}
	c := help(t, path...)
	for _, f := range flags {
		if !c.flags[f] {
			t.Errorf("%s: felix %s has no flag --%s", where, strings.Join(path, " "), f)
		}
	}
	for _, e := range env {
		if strings.HasPrefix(e, "FELIX_") && !c.env[e] {
			t.Errorf("%s: felix %s reads no variable %s", where, strings.Join(path, " "), e)
		}
	}
}

// argValue returns the value of flag --name in args ("--name v" or
// "--name=v").
func argValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// initialCluster parses name=url,... into a map.
func initialCluster(t *testing.T, where, s string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		name, u, ok := strings.Cut(kv, "=")
		if !ok {
			t.Fatalf("%s: initial cluster %q: %q is not name=url", where, s, kv)
		}
		m[name] = u
	}
	return m
}

func mustURL(t *testing.T, where, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		t.Fatalf("%s: %q is not a URL: %v", where, s, err)
	}
	return u
}

func splitHostPort(t *testing.T, where, s string) (string, int) {
	t.Helper()
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		t.Fatalf("%s: %q: %v", where, s, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("%s: %q: %v", where, s, err)
	}
	return h, port
}

func TestSplitArgs(t *testing.T) {
	for _, tc := range []struct {
		args        []string
		path, flags []string
	}{
		{[]string{"ctl", "--listen", "0.0.0.0:7000", "--etcd-insecure"}, []string{"ctl"}, []string{"listen", "etcd-insecure"}},
		{[]string{"certs", "ctl", "ctl-0", "--ca-dir=/ca", "--out", "/certs"}, []string{"certs", "ctl"}, []string{"ca-dir", "out"}},
		{[]string{"broker"}, []string{"broker"}, nil},
	} {
		path, flags := splitArgs(tc.args)
		if !slices.Equal(path, tc.path) || !slices.Equal(flags, tc.flags) {
			t.Errorf("splitArgs(%q) = %q, %q; want %q, %q", tc.args, path, flags, tc.path, tc.flags)
		}
	}
}

// TestHelpParsing checks the help parser against flags felix surely has
// and does not have, so that the checks below cannot pass by finding
// nothing or everything.
func TestHelpParsing(t *testing.T) {
	c := help(t, "ctl")
	for _, f := range []string{"listen", "etcd-name", "etcd-initial-cluster", "etcd-insecure", "certs"} {
		if !c.flags[f] {
			t.Errorf("felix ctl --help: flag --%s not found", f)
		}
	}
	for _, e := range []string{"FELIX_LISTEN", "FELIX_ETCD_NAME", "FELIX_ETCD_PEER_URL"} {
		if !c.env[e] {
			t.Errorf("felix ctl --help: variable %s not found", e)
		}
	}
	// "--etcd-name NAME" appears in --certs' description, not as a flag
	// of its own line; "id" is a broker's flag.
	if c.flags["id"] || c.flags["NAME"] {
		t.Errorf("felix ctl --help: parsed flags %v", c.flags)
	}
	if !help(t, "broker").flags["id"] {
		t.Error("felix broker --help: no --id")
	}
}
