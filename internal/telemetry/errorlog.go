package telemetry

import (
	"log/slog"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
)

// logOTelTo routes what the OpenTelemetry SDK reports about itself to
// log: the errors it hands to otel.Handle (a failed OTLP export, a
// collector that does not answer) and its internal logr logger (warnings,
// and debug output at slog's debug level). Without this the SDK prints
// them with the standard library's log package, ignoring the process's
// --log-format. Both are process globals of the OpenTelemetry API, the
// only globals this package sets; the last call wins.
func logOTelTo(log *slog.Logger) {
	otel.SetErrorHandler(newErrorLog(log, time.Minute))
	otel.SetLogger(logr.FromSlogHandler(log.Handler()))
}

// errorLog is an otel.ErrorHandler writing to a slog.Logger. An exporter
// whose collector is down fails on every export: the same error is logged
// once per quiet period, with how many times it was repeated since.
type errorLog struct {
	log   *slog.Logger
	quiet time.Duration

	// mu guards the last error logged, for the repeat suppression;
	// Handle is called from the exporters' goroutines.
	mu struct {
		sync.Mutex
		last     string
		at       time.Time
		repeated int
	}
}

func newErrorLog(log *slog.Logger, quiet time.Duration) *errorLog {
	return &errorLog{log: log, quiet: quiet}
}

// Handle implements otel.ErrorHandler.
func (h *errorLog) Handle(err error) {
	if err == nil {
		return
	}
	msg, now := err.Error(), time.Now()
	h.mu.Lock()
	if msg == h.mu.last && now.Sub(h.mu.at) < h.quiet {
		h.mu.repeated++
		h.mu.Unlock()
		return
	}
	repeated := 0
	if msg == h.mu.last {
		repeated = h.mu.repeated
	}
	h.mu.last, h.mu.at, h.mu.repeated = msg, now, 0
	h.mu.Unlock()
	if repeated > 0 {
		h.log.Warn("telemetry: OpenTelemetry error (export or SDK)", "err", msg, "repeated", repeated)
		return
	}
	h.log.Warn("telemetry: OpenTelemetry error (export or SDK)", "err", msg)
}
