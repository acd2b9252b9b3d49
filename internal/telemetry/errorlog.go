package telemetry

import (
	"log/slog"
	"maps"
	"regexp"
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
// whose collector is down fails on every export, and the span buffer
// reports the spans it dropped meanwhile, counts that change each time:
// each kind of error (its message with every number in it as one mark)
// is logged once per quiet period, with how many times it was repeated
// since.
type errorLog struct {
	log   *slog.Logger
	quiet time.Duration

	// mu guards the kinds of error logged, for the repeat suppression;
	// Handle is called from the exporters' goroutines.
	mu struct {
		sync.Mutex
		seen map[string]*logged // by kind; at most maxKinds
	}
}

// logged is when a kind of error was last logged, and how many times it
// came since.
type logged struct {
	at       time.Time
	repeated int
}

// maxKinds bounds the kinds of error an errorLog remembers.
const maxKinds = 64

// numbers finds the numbers in an error message, which differ between
// errors of one kind (counts, ports, durations).
var numbers = regexp.MustCompile(`[0-9]+`)

func newErrorLog(log *slog.Logger, quiet time.Duration) *errorLog {
	h := &errorLog{log: log, quiet: quiet}
	h.mu.seen = map[string]*logged{}
	return h
}

// Handle implements otel.ErrorHandler.
func (h *errorLog) Handle(err error) {
	if err == nil {
		return
	}
	msg, now := err.Error(), time.Now()
	kind := numbers.ReplaceAllLiteralString(msg, "#")
	h.mu.Lock()
	l := h.mu.seen[kind]
	if l != nil && now.Sub(l.at) < h.quiet {
		l.repeated++
		h.mu.Unlock()
		return
	}
	if l == nil {
		if len(h.mu.seen) >= maxKinds {
			maps.DeleteFunc(h.mu.seen, func(_ string, l *logged) bool { return now.Sub(l.at) >= h.quiet })
		}
		if len(h.mu.seen) >= maxKinds {
			clear(h.mu.seen)
		}
		l = &logged{}
		h.mu.seen[kind] = l
	}
	repeated := l.repeated
	l.at, l.repeated = now, 0
	h.mu.Unlock()
	if repeated > 0 {
		h.log.Warn("telemetry: OpenTelemetry error (export or SDK)", "err", msg, "repeated", repeated)
		return
	}
	h.log.Warn("telemetry: OpenTelemetry error (export or SDK)", "err", msg)
}
