package servercmd

import (
	"context"
	"log/slog"
	"net"
	"net/http"

	"github.com/felix-broker/felix/internal/telemetry"
)

// observability is what a server command runs beside its server: the
// telemetry providers and, if an address is given, the admin listener.
type observability struct {
	prov  *telemetry.Providers
	admin *telemetry.Admin // nil without --admin
}

// startObservability builds the providers and starts the admin listener
// on adminAddr ("" for none), with /debug/pprof/ if pprof is set. ready
// answers /readyz.
func startObservability(service, instance, adminAddr string, pprof bool, ready func() error, log *slog.Logger) (*observability, error) {
	return startObservabilityWith(service, instance, adminAddr, pprof, ready, nil, log)
}

// startObservabilityWith is startObservability with more routes on the
// admin listener (see telemetry.AdminConfig.Handlers).
func startObservabilityWith(service, instance, adminAddr string, pprof bool, ready func() error, handlers map[string]http.Handler, log *slog.Logger) (*observability, error) {
	prov, err := telemetry.New(context.Background(), telemetry.Options{Service: service, Instance: instance, Logger: log})
	if err != nil {
		return nil, err
	}
	o := &observability{prov: prov}
	if adminAddr == "" {
		return o, nil
	}
	o.admin, err = telemetry.StartAdmin(telemetry.AdminConfig{Addr: adminAddr, Metrics: prov.Handler(), Ready: ready, Pprof: pprof, Logger: log, Handlers: handlers})
	if err != nil {
		prov.Shutdown(context.Background())
		return nil, err
	}
	if pprof {
		log.Info("admin listener serving /metrics, /healthz, /readyz and /debug/pprof/", "addr", o.admin.Addr().String())
	} else {
		log.Info("admin listener serving /metrics, /healthz and /readyz", "addr", o.admin.Addr().String())
	}
	return o, nil
}

// adminAdvertise is the admin address to register, "" without one.
func (o *observability) adminAdvertise(host string) string {
	if o.admin == nil {
		return ""
	}
	return o.admin.Advertise(host)
}

func (o *observability) close() {
	if o.admin != nil {
		o.admin.Close()
	}
	o.prov.Shutdown(context.Background())
}

// hostOf returns the host part of addr, or "" if it has none.
func hostOf(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	return host
}
