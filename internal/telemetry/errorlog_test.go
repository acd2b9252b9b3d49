package telemetry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/felix-broker/felix/internal/syncbuf"
)

// TestNewRoutesOTelErrorsToSlog: what the OpenTelemetry SDK reports goes
// to the process's logger, in its format (JSON here), not to the standard
// library's log package.
func TestNewRoutesOTelErrorsToSlog(t *testing.T) {
	prev := otel.GetErrorHandler()
	t.Cleanup(func() { otel.SetErrorHandler(prev) })
	var buf syncbuf.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	p, err := New(context.Background(), Options{Service: "felix-test", Instance: "n1", Logger: log,
		Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())

	otel.Handle(errors.New("traces export: connection refused"))
	var line struct {
		Level, Msg, Err string
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(buf.String())), &line); err != nil {
		t.Fatalf("log output %q is not one JSON line: %v", buf.String(), err)
	}
	if line.Level != "WARN" || line.Err != "traces export: connection refused" || !strings.Contains(line.Msg, "OpenTelemetry") {
		t.Errorf("logged %+v", line)
	}
}

func TestErrorLogSuppressesRepeats(t *testing.T) {
	var buf syncbuf.Buffer
	h := newErrorLog(slog.New(slog.NewTextHandler(&buf, nil)), 50*time.Millisecond)
	for range 3 {
		h.Handle(errors.New("collector down"))
	}
	h.Handle(errors.New("another"))
	time.Sleep(60 * time.Millisecond)
	h.Handle(errors.New("another"))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "collector down") || !strings.Contains(lines[1], "another") ||
		strings.Contains(lines[1], "repeated") || !strings.Contains(lines[2], "another") {
		t.Errorf("logged:\n%s", buf.String())
	}
	buf = syncbuf.Buffer{}
	h = newErrorLog(slog.New(slog.NewTextHandler(&buf, nil)), 50*time.Millisecond)
	for range 3 {
		h.Handle(errors.New("collector down"))
	}
	time.Sleep(60 * time.Millisecond)
	h.Handle(errors.New("collector down"))
	if got := buf.String(); strings.Count(got, "collector down") != 2 || !strings.Contains(got, "repeated=2") {
		t.Errorf("logged:\n%s", got)
	}
}

// TestErrorLogSuppressesInterleavedKinds: with the collector down, the
// export error and the dropped-span count (a new number each time) come
// by turns; each kind is still logged once per quiet period (both were
// logged every time: two lines a second for as long as the collector was
// down).
func TestErrorLogSuppressesInterleavedKinds(t *testing.T) {
	var buf syncbuf.Buffer
	h := newErrorLog(slog.New(slog.NewTextHandler(&buf, nil)), time.Minute)
	for i := range 100 {
		h.Handle(errors.New(`telemetry: exporting spans: Post "http://127.0.0.1:4318/v1/traces": connection refused`))
		h.Handle(fmt.Errorf("telemetry: span queue full (the exporter is slow or down): %d spans dropped (%d in all)", 10+i, 100*i))
	}
	if got := buf.String(); strings.Count(got, "\n") != 2 || !strings.Contains(got, "exporting spans") || !strings.Contains(got, "10 spans dropped (0 in all)") {
		t.Errorf("logged:\n%s", got)
	}
	for i := range 2 * maxKinds { // kinds without end stay bounded
		h.Handle(fmt.Errorf("kind %c%c", 'a'+i%26, 'a'+i/26))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := len(h.mu.seen); n > maxKinds {
		t.Errorf("%d kinds remembered, more than %d", n, maxKinds)
	}
}

type failingExporter struct{}

func (failingExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error {
	return errors.New("connection refused")
}
func (failingExporter) Shutdown(context.Context) error { return nil }

// TestSpanBufferReportsExportErrors: a failed periodic export is reported,
// not dropped in silence.
func TestSpanBufferReportsExportErrors(t *testing.T) {
	errs := make(chan error, 16)
	b := NewSpanBuffer(failingExporter{}, SpanBufferOptions{Interval: 5 * time.Millisecond, OnError: func(err error) {
		select {
		case errs <- err:
		default:
		}
	}})
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b))
	defer tp.Shutdown(context.Background())
	_, sp := tp.Tracer("t").Start(context.Background(), "s")
	sp.End()
	select {
	case err := <-errs:
		if !strings.Contains(err.Error(), "exporting spans: connection refused") {
			t.Errorf("reported %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no export error reported")
	}
}
