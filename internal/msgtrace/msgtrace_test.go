package msgtrace

import (
	"testing"

	"go.opentelemetry.io/otel/trace"
)

// TestRecordContextReplacesTracestate: a record context set over headers
// that already carry one (an application's traceparent and tracestate,
// client.WithHeaders) replaces both: a tracestate belongs to its
// traceparent's trace.
func TestRecordContextReplacesTracestate(t *testing.T) {
	h := map[string]string{
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"tracestate":  "vendor=of-another-trace",
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: NewTraceID(), SpanID: NewSpanID(), TraceFlags: trace.FlagsSampled})
	out := WithRecordContext(sc, h)
	got := RecordContext(out)
	if got.TraceID() != sc.TraceID() || got.TraceState().Len() != 0 {
		t.Errorf("record context in trace %s with tracestate %q, want trace %s with none", got.TraceID(), got.TraceState(), sc.TraceID())
	}
}
