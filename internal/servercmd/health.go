package servercmd

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// Health checks an admin endpoint and exits 0 if it answers 2xx: a health
// check for images with nothing but the felix binary (docker's
// HEALTHCHECK, compose's healthcheck).
type Health struct {
	URL     string        `help:"URL to GET, e.g. the admin listener's /readyz or /healthz." default:"http://127.0.0.1:9100/readyz" env:"FELIX_HEALTH_URL"`
	Timeout time.Duration `help:"Bound on the request." default:"2s"`
}

func (c *Health) Run(log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s: %s", c.URL, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}
