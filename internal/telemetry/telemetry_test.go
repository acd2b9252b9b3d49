package telemetry

import (
	"context"
	"testing"
)

// TestNewFromEnv checks which providers the OTEL_* environment gives.
func TestNewFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name           string
		env            map[string]string
		traced, metric bool
	}{
		{"default", nil, false, true},
		{"discard traces", map[string]string{"OTEL_TRACES_EXPORTER": "discard"}, true, true},
		{"no metrics", map[string]string{"OTEL_METRICS_EXPORTER": "none"}, false, false},
		{"discard traces, no metrics", map[string]string{"OTEL_TRACES_EXPORTER": "discard", "OTEL_METRICS_EXPORTER": "none"}, true, false},
		{"traces off despite endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, false, true},
		{"sdk disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "discard"}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(context.Background(), Options{Service: "felix-test", Instance: "n1",
				Getenv: func(k string) string { return tc.env[k] }})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Shutdown(context.Background())
			if (p.Tracer != nil) != tc.traced {
				t.Errorf("tracer provider %v, want traced=%v", p.Tracer, tc.traced)
			}
			if p.Metrics != tc.metric || p.Meter == nil {
				t.Errorf("Metrics %v (meter %v), want %v and a meter", p.Metrics, p.Meter, tc.metric)
			}
			if p.Tracer != nil {
				_, sp := p.Tracer.Tracer("t").Start(context.Background(), "s")
				if !sp.IsRecording() {
					t.Error("discard: span not recorded")
				}
				sp.End()
			}
		})
	}
}
