package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/shardmap"
)

// contextCmd manages contexts: named ways to reach a cluster, saved under
// $XDG_CONFIG_HOME/felix/ (default ~/.config/felix/), like `nats context`.
//
// Where felixctl finds the cluster, first match wins: the flags --broker,
// --cluster, --context; then the environment FELIX_BROKER, FELIX_CLUSTER,
// FELIX_CONTEXT; then ./felix-cluster.json; then the selected context
// (`felixctl context use NAME`). --ca, --cert and --cert-key (or FELIX_CA,
// FELIX_CERT, FELIX_CERT_KEY) override the certificates of whichever
// source was found.
type contextCmd struct {
	Add contextAddCmd `cmd:"" help:"Save a context from --cluster FILE, or from --broker ADDR --ca FILE --cert FILE --cert-key FILE."`
	Use contextUseCmd `cmd:"" aliases:"select" help:"Select the context felixctl uses when nothing else names a cluster."`
	Ls  contextLsCmd  `cmd:"" aliases:"list" help:"List the saved contexts; * marks the selected one."`
	Rm  contextRmCmd  `cmd:"" aliases:"delete" help:"Delete a saved context."`
}

type contextAddCmd struct {
	Name        string `arg:"" help:"Context name: letters, digits, '-', '_' and '.'."`
	Description string `help:"A note shown by context ls."`
	Use         bool   `help:"Also select it (felixctl context use NAME)."`
}

type contextUseCmd struct {
	Name string `arg:"" help:"Context to select."`
}

type contextLsCmd struct{}

type contextRmCmd struct {
	Name string `arg:"" help:"Context to delete."`
}

// savedContext is one context file. Paths are absolute.
type savedContext struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Cluster     string `json:"cluster,omitempty"` // a connection file
	Broker      string `json:"broker,omitempty"`  // or one broker's address ...
	CA          string `json:"ca,omitempty"`      // ... and the CA to verify it with
	Cert        string `json:"cert,omitempty"`
	CertKey     string `json:"cert_key,omitempty"`
}

// contextJSON is a context as --json prints it.
type contextJSON struct {
	savedContext
	Selected bool `json:"selected"`
}

// configDir is where felixctl keeps its contexts: $XDG_CONFIG_HOME/felix,
// default $HOME/.config/felix.
func configDir(a *app) (string, error) {
	if x := a.getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "felix"), nil
	}
	home := a.getenv("HOME")
	if home == "" {
		return "", errors.New("cannot find where to keep contexts: neither XDG_CONFIG_HOME nor HOME is set")
	}
	return filepath.Join(home, ".config", "felix"), nil
}

func contextPath(dir, name string) string { return filepath.Join(dir, "contexts", name+".json") }

// selectedContext returns the name of the selected context, "" if none.
func selectedContext(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "context"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// loadContext reads the context name from dir.
func loadContext(dir, name string) (*savedContext, error) {
	b, err := os.ReadFile(contextPath(dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		have := contextNames(dir)
		if len(have) == 0 {
			return nil, usagef("there is no context %q: none is saved; add one with `felixctl context add NAME --cluster FILE`", name)
		}
		return nil, usagef("there is no context %q; the saved ones are %s (felixctl context ls)", name, strings.Join(have, ", "))
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read context %q: %w", name, err)
	}
	var c savedContext
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("context %q (%s) is not valid JSON: %w", name, contextPath(dir, name), err)
	}
	c.Name = name
	return &c, nil
}

// contextNames lists the saved contexts, sorted.
func contextNames(dir string) []string {
	entries, _ := os.ReadDir(filepath.Join(dir, "contexts"))
	var names []string
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), ".json"); ok && !e.IsDir() {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// describe says where a context points, for context ls.
func (c *savedContext) describe() string {
	if c.Cluster != "" {
		return c.Cluster
	}
	return c.Broker + " (CA " + c.CA + ")"
}

func (c *contextAddCmd) Run(a *app) error {
	g := a.flags
	if err := shardmap.ValidateStreamName(c.Name); err != nil { // the same rules make it a safe file name
		return usagef("%q cannot name a context: use letters, digits, '-', '_' and '.', not starting with '.'", c.Name)
	}
	abs := func(p string) (string, error) {
		if p == "" {
			return "", nil
		}
		p, err := filepath.Abs(p)
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(p); err != nil {
			return "", usagef("cannot save context %q: %s does not exist", c.Name, p)
		}
		return p, nil
	}
	sc := savedContext{Name: c.Name, Description: c.Description}
	var err error
	switch {
	case g.Cluster != "" && g.Broker != "":
		return usagef("a context is either --cluster FILE or --broker ADDR, not both")
	case g.Cluster != "":
		if sc.Cluster, err = abs(g.Cluster); err != nil {
			return err
		}
		if _, err := client.LoadClusterFile(sc.Cluster); err != nil {
			return usagef("cannot save context %q: %s", c.Name, plainError(err))
		}
	case g.Broker != "":
		if g.CA == "" {
			return usagef("context add --broker needs the cluster CA certificate: add --ca FILE")
		}
		sc.Broker = g.Broker
	default:
		return usagef("say where the cluster is: felixctl context add %s --cluster FILE, or --broker ADDR --ca FILE --cert FILE --cert-key FILE", c.Name)
	}
	if g.Broker == "" && g.Cert == "" {
		// a connection file names its certificates; nothing to add
	} else if g.Cert == "" || g.CertKey == "" {
		if g.Broker != "" {
			return usagef("context add --broker needs a client certificate: add --cert FILE --cert-key FILE")
		}
		return usagef("--cert needs its private key: add --cert-key FILE")
	}
	for _, f := range []struct {
		dst *string
		src string
	}{{&sc.CA, g.CA}, {&sc.Cert, g.Cert}, {&sc.CertKey, g.CertKey}} {
		if *f.dst, err = abs(f.src); err != nil {
			return err
		}
	}
	dir, err := configDir(a)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, "contexts"), 0o700); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(sc, "", "  ")
	if err := os.WriteFile(contextPath(dir, c.Name), append(b, '\n'), 0o600); err != nil {
		return err
	}
	if c.Use {
		if err := os.WriteFile(filepath.Join(dir, "context"), []byte(c.Name+"\n"), 0o600); err != nil {
			return err
		}
	}
	if g.JSON {
		return printJSON(a.stdout, contextJSON{savedContext: sc, Selected: c.Use || selectedContext(dir) == c.Name})
	}
	fmt.Fprintf(a.stdout, "saved context %s: %s\n", c.Name, sc.describe())
	if c.Use {
		fmt.Fprintf(a.stdout, "selected context %s\n", c.Name)
	}
	return nil
}

func (c *contextUseCmd) Run(a *app) error {
	dir, err := configDir(a)
	if err != nil {
		return err
	}
	sc, err := loadContext(dir, c.Name)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "context"), []byte(c.Name+"\n"), 0o600); err != nil {
		return err
	}
	if a.flags.JSON {
		return printJSON(a.stdout, contextJSON{savedContext: *sc, Selected: true})
	}
	fmt.Fprintf(a.stdout, "selected context %s: %s\n", c.Name, sc.describe())
	if _, err := os.Stat(client.DefaultClusterFile); err == nil {
		fmt.Fprintf(a.stderr, "note: in this directory ./%s is used first; the context applies elsewhere (or with --context %s)\n", client.DefaultClusterFile, c.Name)
	}
	return nil
}

func (c *contextLsCmd) Run(a *app) error {
	dir, err := configDir(a)
	if err != nil {
		return err
	}
	names := contextNames(dir)
	sel := selectedContext(dir)
	if !a.flags.JSON && len(names) == 0 {
		fmt.Fprintf(a.stdout, "no contexts saved in %s: add one with `felixctl context add NAME --cluster FILE`\n", dir)
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	if !a.flags.JSON {
		fmt.Fprintln(tw, "\tCONTEXT\tCLUSTER\tDESCRIPTION")
	}
	for _, n := range names {
		sc, err := loadContext(dir, n)
		if err != nil {
			return err
		}
		if a.flags.JSON {
			if err := printJSON(a.stdout, contextJSON{savedContext: *sc, Selected: n == sel}); err != nil {
				return err
			}
			continue
		}
		mark := ""
		if n == sel {
			mark = "*"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", mark, n, sc.describe(), sc.Description)
	}
	return tw.Flush()
}

func (c *contextRmCmd) Run(a *app) error {
	dir, err := configDir(a)
	if err != nil {
		return err
	}
	if _, err := loadContext(dir, c.Name); err != nil {
		return err
	}
	if err := os.Remove(contextPath(dir, c.Name)); err != nil {
		return err
	}
	if selectedContext(dir) == c.Name {
		os.Remove(filepath.Join(dir, "context"))
	}
	if a.flags.JSON {
		return printJSON(a.stdout, map[string]string{"deleted": c.Name})
	}
	fmt.Fprintf(a.stdout, "deleted context %s\n", c.Name)
	return nil
}
