// Package telemetry sets up observability for the felix processes (broker
// and control plane): OpenTelemetry tracer and meter providers built from
// the standard OTEL_* environment, a Prometheus exporter behind /metrics,
// and the small HTTP admin listener that serves /metrics, /healthz and
// /readyz off the QUIC port.
//
// Only binaries use it. Libraries (broker, client) take providers in their
// config and never reach for globals; this package sets none either, but
// for the OpenTelemetry API's error handler and internal logger, which
// have no other seam: [New] points them at the process's slog logger
// ([Options.Logger]), so a failed OTLP export is a log line in the
// process's format (--log-format json), repeated at most once a minute,
// not a line from the standard library's log package.
//
// # Export
//
// Metrics are always collected for /metrics. Traces, and metrics in
// addition, are exported over OTLP/HTTP only when OTEL_EXPORTER_OTLP_ENDPOINT
// (or the signal-specific OTEL_EXPORTER_OTLP_TRACES_ENDPOINT /
// OTEL_EXPORTER_OTLP_METRICS_ENDPOINT) is set; the exporters read the rest of
// the standard variables (headers, timeout, protocol details) themselves.
// With no endpoint there is no tracer provider at all, so the publish path
// makes no tracing calls. OTEL_SDK_DISABLED=true turns off OTLP export;
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES set the resource, and
// OTEL_TRACES_SAMPLER picks the sampler. OTEL_TRACES_EXPORTER=none turns
// tracing off; OTEL_TRACES_EXPORTER=discard (Felix's own value) records
// every span and drops it, and OTEL_METRICS_EXPORTER=none records no
// metrics: `felixctl bench --telemetry` uses both to measure what
// telemetry costs.
package telemetry
