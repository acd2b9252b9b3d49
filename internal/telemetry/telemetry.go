package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	promexporter "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/felix-broker/felix/internal/msgtrace"
)

// Options says which process the providers are for.
type Options struct {
	// Service is the default service.name ("felix-broker", "felix-ctl");
	// OTEL_SERVICE_NAME overrides it.
	Service string
	// Instance is service.instance.id, the node id.
	Instance string
	// Getenv reads the environment; default os.Getenv (a test seam).
	Getenv func(string) string
	// Logger receives what the OpenTelemetry SDK reports about itself
	// (failed exports, warnings), in the process's log format; default
	// slog.Default(). New installs it as the OpenTelemetry error handler
	// and logger, which are process globals.
	Logger *slog.Logger
}

// Providers are a process's telemetry: a meter provider whose metrics are
// served by Handler (and pushed over OTLP if configured), and a tracer
// provider when traces are exported.
type Providers struct {
	// Meter records metrics; never nil.
	Meter metric.MeterProvider
	// Metrics is false when OTEL_METRICS_EXPORTER=none: Meter is then a
	// no-op and /metrics has only the Go runtime's and the process's.
	Metrics bool
	// Tracer is nil unless an OTLP trace endpoint is configured: pass it
	// as is to broker.Config.TracerProvider (nil means no tracing).
	Tracer trace.TracerProvider

	registry *prometheus.Registry
	shutdown []func(context.Context) error
	reg      metric.Registration
}

// New builds the providers from opts and the OTEL_* environment.
func New(ctx context.Context, opts Options) (*Providers, error) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	logOTelTo(logger)
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(opts.Service), semconv.ServiceInstanceID(opts.Instance),
			semconv.ServiceVersion(Version())),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
		resource.WithTelemetrySDK(),
	)
	if err != nil && res == nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}

	p := &Providers{registry: prometheus.NewRegistry()}
	p.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	prom, err := promexporter.New(promexporter.WithRegisterer(p.registry), promexporter.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	mopts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(prom)}

	disabled := strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true")
	endpoint := getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	if strings.EqualFold(getenv("OTEL_METRICS_EXPORTER"), "none") {
		p.Meter = noop.NewMeterProvider()
		if err := p.tracing(ctx, res, getenv, disabled, endpoint); err != nil {
			return nil, err
		}
		return p, nil
	}
	p.Metrics = true
	if !disabled && (endpoint != "" || getenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") != "") {
		exp, err := otlpmetrichttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("telemetry: OTLP metric exporter: %w", err)
		}
		mopts = append(mopts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)))
	}
	mp := sdkmetric.NewMeterProvider(mopts...)
	p.Meter = mp
	p.shutdown = append(p.shutdown, mp.Shutdown)

	if err := p.tracing(ctx, res, getenv, disabled, endpoint); err != nil {
		return nil, err
	}
	if err := p.registerBuildInfo(opts.Service); err != nil {
		p.Shutdown(ctx)
		return nil, err
	}
	return p, nil
}

// tracing sets up the tracer provider: OTLP when an endpoint is
// configured, or, with OTEL_TRACES_EXPORTER=discard, every span recorded
// and thrown away (to measure what tracing costs).
func (p *Providers) tracing(ctx context.Context, res *resource.Resource, getenv func(string) string, disabled bool, endpoint string) error {
	var exp sdktrace.SpanExporter
	switch {
	case disabled || strings.EqualFold(getenv("OTEL_TRACES_EXPORTER"), "none"):
		return nil
	case strings.EqualFold(getenv("OTEL_TRACES_EXPORTER"), "discard"):
		exp = Discard{}
	case endpoint != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "":
		var err error
		if exp, err = otlptracehttp.New(ctx); err != nil {
			p.Shutdown(ctx)
			return fmt.Errorf("telemetry: OTLP trace exporter: %w", err)
		}
	default:
		return nil
	}
	// The SDK reads OTEL_TRACES_SAMPLER itself; spans are batched by a
	// SpanBuffer, which costs the publish path no wake-up per span;
	// msgtrace.IDs lets a forwarding broker start its spans after the
	// forward instead of before.
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithIDGenerator(msgtrace.IDs{}),
		sdktrace.WithSpanProcessor(NewSpanBuffer(exp, SpanBufferOptions{})))
	p.Tracer = tp
	p.shutdown = append([]func(context.Context) error{tp.Shutdown}, p.shutdown...)
	return nil
}

// Discard is a span exporter that drops what it is given: spans are made,
// ended and batched as with a real exporter, then thrown away. It is for
// measuring what tracing costs.
type Discard struct{}

func (Discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (Discard) Shutdown(context.Context) error                             { return nil }

// registerBuildInfo exposes felix_build_info{version,goversion,service} 1.
func (p *Providers) registerBuildInfo(service string) error {
	m := p.Meter.Meter(msgtrace.ScopeName)
	g, err := m.Int64ObservableGauge("felix.build.info",
		metric.WithDescription("Always 1; the labels say which build of felix this process runs."))
	if err != nil {
		return fmt.Errorf("telemetry: build info: %w", err)
	}
	set := metric.WithAttributeSet(attribute.NewSet(
		attribute.String("version", Version()),
		attribute.String("goversion", runtime.Version()),
		attribute.String("service", service),
	))
	p.reg, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(g, 1, set)
		return nil
	}, g)
	return err
}

// Handler serves the metrics in the Prometheus text format.
func (p *Providers) Handler() http.Handler {
	return promhttp.HandlerFor(p.registry, promhttp.HandlerOpts{})
}

// Shutdown flushes and stops the exporters.
func (p *Providers) Shutdown(ctx context.Context) error {
	if p.reg != nil {
		p.reg.Unregister()
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var errs []error
	for _, f := range p.shutdown {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}

// version is set for release builds with
//
//	go build -ldflags "-X github.com/felix-broker/felix/internal/telemetry.version=v1.2.3" ./cmd/...
//
// and then beats what the build recorded.
var version string

// Version returns the version of felix this binary was built from, the one
// felix_build_info{version}, `felix --version` and `felixctl version`
// report: the -ldflags -X override (release builds) if set; else the main
// module's version as the go command stamped it (`go install
// module@v1.2.3`, or, since Go 1.24, a pseudo-version with the commit and
// "+dirty" for `go build` in a git checkout); else "devel+COMMIT" (with
// "-dirty" for uncommitted changes) from the VCS settings; else "devel".
func Version() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	return versionOf(bi)
}

// versionOf is Version's reading of build info.
func versionOf(bi *debug.BuildInfo) string {
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev string
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" {
		return "devel"
	}
	v := "devel+" + rev[:min(len(rev), 12)]
	if modified {
		v += "-dirty"
	}
	return v
}

// VersionLine is the version and how the binary was built, as
// `--version` prints it: "v0.0.0-…-0123456789ab+dirty (commit
// 0123456789ab, modified; go1.26.0 linux/amd64)".
func VersionLine() string {
	build := runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
	if rev, mod := Revision(); rev != "" {
		c := "commit " + rev[:min(len(rev), 12)]
		if mod {
			c += ", modified"
		}
		build = c + "; " + build
	}
	return Version() + " (" + build + ")"
}

// Revision returns the VCS commit this binary was built from and whether
// the tree had uncommitted changes, or "" when the build recorded none.
func Revision() (rev string, modified bool) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "", false
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	return rev, modified
}
