package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// AdminConfig configures the admin listener.
type AdminConfig struct {
	// Addr is the TCP address to listen on, e.g. "127.0.0.1:0"; required.
	Addr string
	// Metrics serves /metrics; nil serves 404.
	Metrics http.Handler
	// Ready answers /readyz: nil means ready (200), an error is the reason
	// for 503. nil Ready means always ready.
	Ready func() error
	// Pprof serves the runtime profiles under /debug/pprof/; default off.
	// Profiles show a process's code paths, stacks and timing to whoever
	// can reach the listener, so turn them on only where that is an
	// operator.
	Pprof bool
	// Logger gets serve errors; default slog.Default().
	Logger *slog.Logger
	// Handlers are more routes, by http.ServeMux pattern ("POST /restart"):
	// what the process serves beside metrics and health (felix dev's
	// supervisor).
	Handlers map[string]http.Handler
}

// Admin is a running admin listener: /metrics, /healthz (the process is
// alive and serving HTTP), /readyz (the process is ready for traffic) and,
// if configured, /debug/pprof/. It has no authentication, and what the
// metrics name (a broker's: its streams and peers) anyone who reaches it
// reads: bind it to loopback or an operator network.
type Admin struct {
	ln   net.Listener
	srv  *http.Server
	done chan struct{} // closed when the serving goroutine has returned
}

// StartAdmin listens on cfg.Addr and serves until Close.
func StartAdmin(cfg AdminConfig) (*Admin, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("telemetry: admin listener on %s: %w", cfg.Addr, err)
	}
	mux := http.NewServeMux()
	if cfg.Metrics != nil {
		mux.Handle("GET /metrics", cfg.Metrics)
	}
	if cfg.Pprof {
		// Profiles, for finding where a broker's time goes under load.
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	}
	for pattern, h := range cfg.Handlers {
		mux.Handle(pattern, h)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if cfg.Ready != nil {
			if err := cfg.Ready(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintln(w, err)
				return
			}
		}
		fmt.Fprintln(w, "ready")
	})
	a := &Admin{
		ln:   ln,
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second},
		done: make(chan struct{}),
	}
	go func() {
		defer close(a.done)
		if err := a.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			cfg.Logger.Error("admin listener stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	return a, nil
}

// Addr returns the address the admin listener is bound to.
func (a *Admin) Addr() net.Addr { return a.ln.Addr() }

// Advertise returns the address to publish for the admin listener: the
// bound address, with an unspecified host (0.0.0.0, ::) replaced by host
// when host is not empty.
func (a *Admin) Advertise(host string) string {
	addr := a.ln.Addr().(*net.TCPAddr)
	if addr.IP.IsUnspecified() && host != "" {
		return net.JoinHostPort(host, fmt.Sprint(addr.Port))
	}
	return addr.String()
}

// Close stops the listener, letting requests in progress finish for up to
// a second, and waits for the serving goroutine.
func (a *Admin) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := a.srv.Shutdown(ctx)
	if err != nil {
		err = a.srv.Close()
	}
	<-a.done
	return err
}
