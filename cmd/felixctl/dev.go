package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/felix-broker/felix/internal/servercmd"
)

// devCmd is `felixctl dev`: the local cluster felix dev runs (so that the
// demo, and a person with only felixctl, can start one), and `dev restart
// ID`, which asks the felix dev that wrote the connection file to start a
// broker again.
type devCmd struct {
	Run     devRunCmd     `cmd:"" default:"withargs" help:"Run a local cluster in this directory until Ctrl-C: the control plane and three broker processes, as felix dev does (the default: felixctl dev)."`
	Restart devRestartCmd `cmd:"" help:"Restart a broker of the felix dev that wrote the connection file, after it died or was killed (or restart a running one)."`
}

type devRunCmd struct {
	servercmd.Dev `embed:""`
}

type devRestartCmd struct {
	BrokerID string `arg:"" name:"broker" help:"Broker id, e.g. broker-2."`
}

func (d *devRestartCmd) Run(a *app) error {
	t, err := a.flags.discoverBrokers(a)
	if err != nil {
		return err
	}
	if t.file == nil || t.file.Admin == "" {
		return fmt.Errorf("%s names no felix dev supervisor to ask (no \"admin\" address): `dev restart` restarts the brokers of a running `felix dev` (or `felixctl dev`), from the connection file it wrote; a broker you started yourself you start again yourself", t.source)
	}
	ctx, cancel := context.WithTimeout(a.ctx, a.flags.Timeout+30*time.Second) // the restart waits for the broker to be live
	defer cancel()
	u := "http://" + t.file.Admin + "/restart?broker=" + url.QueryEscape(d.BrokerID)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("felix dev's supervisor at %s (from %s) does not answer: is that felix dev still running? (%v)", t.file.Admin, t.source, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return usagef("%s", strings.TrimSpace(string(body)))
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("felix dev could not restart %s: %s", d.BrokerID, strings.TrimSpace(string(body)))
	}
	var b servercmd.DevBroker
	if err := json.Unmarshal(body, &b); err != nil {
		return fmt.Errorf("felix dev answered the restart of %s with %q: %w", d.BrokerID, body, err)
	}
	if a.flags.JSON {
		return printJSON(a.stdout, b)
	}
	how := "started again"
	if b.WasRunning {
		how = "stopped and started again"
	}
	fmt.Fprintf(a.stdout, "%s %s (pid %d): live at %s\n", b.ID, how, b.Pid, b.Addr)
	return nil
}
