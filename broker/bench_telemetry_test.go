package broker

import (
	"context"
	felixtel "github.com/felix-broker/felix/internal/telemetry"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/shardmap"
)

// BenchmarkTelemetryOverhead measures publish latency (SDK publish to ack,
// one record at a time) of a direct and a forwarded publish on two
// in-process clusters, one with no telemetry and one with tracing (every
// span sampled, batched to a drop exporter, IDs from TraceIDGenerator
// unless FELIX_BENCH_SDK_IDS is set) and metrics (an SDK meter provider)
// on brokers and client. Each iteration publishes one record on each of
// the four paths, alternating which cluster goes first, so both see the
// same machine noise. It reports the p50s and the on/off ratios:
//
//	go test -run '^$' -bench TelemetryOverhead -benchtime 3000x ./broker/
//
// Here the client and all four brokers share this process's CPUs and its
// scheduler, so the batches of span work compete with the publish path
// more than across processes; the figure users see is that of `felixctl
// bench --local --telemetry`, with real broker processes.
func BenchmarkTelemetryOverhead(b *testing.B) {
	stream := shardmap.StreamConfig{Name: "orders", Shards: 1}
	type mode struct {
		name        string
		ip          *inproc
		direct, fwd *client.Client
		hist        [2]*hdrhistogram.Histogram // direct, forwarded
	}
	ctx := context.Background()
	off := &mode{name: "off", ip: startInprocWith(b, nil, 2, stream)}

	// FELIX_BENCH_TELEMETRY picks what "on" means: full (the default:
	// every span sampled, plus metrics), traces, metrics, sampled10
	// (parent-based 10% trace sampling, plus metrics), unsampled (every
	// trace propagated, none recorded, plus metrics) or none (an A/A run
	// that shows the noise floor). To see where the cost is: client (only
	// the SDK traces), broker (only the brokers trace) or headers (no
	// telemetry; each publish carries a traceparent header).
	variant := os.Getenv("FELIX_BENCH_TELEMETRY")
	if variant == "" {
		variant = "full"
	}
	sampler := sdktrace.ParentBased(sdktrace.AlwaysSample())
	switch variant {
	case "sampled10":
		sampler = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.1))
	case "unsampled": // context propagated, nothing recorded
		sampler = sdktrace.NeverSample()
	}
	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithSampler(sampler),
		sdktrace.WithSpanProcessor(felixtel.NewSpanBuffer(felixtel.Discard{}, felixtel.SpanBufferOptions{}))}
	if os.Getenv("FELIX_BENCH_SDK_IDS") == "" { // as felix broker builds its provider
		tpOpts = append(tpOpts, sdktrace.WithIDGenerator(TraceIDGenerator()))
	}
	tp := sdktrace.NewTracerProvider(tpOpts...)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() {
		tp.Shutdown(ctx)
		mp.Shutdown(ctx)
	})
	on := &mode{name: "on", ip: startInprocWith(b, func(c *Config) {
		c.TracerProvider, c.MeterProvider = tp, mp
		switch variant {
		case "none":
			c.TracerProvider, c.MeterProvider = nil, nil
		case "metrics":
			c.TracerProvider = nil
		case "traces", "broker":
			c.MeterProvider = nil
		case "client", "headers":
			c.TracerProvider, c.MeterProvider = nil, nil
		}
	}, 2, stream)}

	for _, m := range []*mode{off, on} {
		var opts []client.Opt
		if m == on {
			switch variant {
			case "none", "broker", "headers":
			case "metrics":
				opts = append(opts, client.WithMeterProvider(mp))
			case "traces", "client":
				opts = append(opts, client.WithTracerProvider(tp))
			default:
				opts = append(opts, client.WithTracerProvider(tp), client.WithMeterProvider(mp))
			}
		}
		connect := func(br *Broker) *client.Client {
			opts := append([]client.Opt{client.WithCAFile(filepath.Join(m.ip.dir, "certs", "ca.crt")), adminCert(filepath.Join(m.ip.dir, "certs", "ca.crt")), client.WithLogger(quiet())}, opts...)
			c, err := client.Connect(ctx, br.Addr().String(), opts...)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close() })
			return c
		}
		m.direct = connect(m.ip.owner("orders", 0))
		m.fwd = connect(m.ip.nonOwner("orders", 0))
		m.hist = [2]*hdrhistogram.Histogram{hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3),
			hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)}
	}
	value := make([]byte, 100)
	var onOpts []client.PublishOpt
	if variant == "headers" {
		onOpts = append(onOpts, client.WithHeaders(map[string]string{
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}))
	}
	publish := func(m *mode, path int) {
		c := m.direct
		if path == 1 {
			c = m.fwd
		}
		var opts []client.PublishOpt
		if m == on {
			opts = onOpts
		}
		start := time.Now()
		ack, err := c.Publish(ctx, "orders", nil, value, opts...)
		took := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if ack.Forwarded != (path == 1) {
			b.Fatalf("%s path %d: ack %+v", m.name, path, ack)
		}
		m.hist[path].RecordValue(took.Microseconds())
	}
	// Warm up connections, lanes and logs.
	for range 50 {
		for path := range 2 {
			publish(off, path)
			publish(on, path)
		}
	}
	off.hist[0].Reset()
	off.hist[1].Reset()
	on.hist[0].Reset()
	on.hist[1].Reset()

	b.ResetTimer()
	for i := range b.N {
		for path := range 2 {
			if i%2 == 0 {
				publish(off, path)
				publish(on, path)
			} else {
				publish(on, path)
				publish(off, path)
			}
		}
	}
	b.StopTimer()
	for path, name := range []string{"direct", "forwarded"} {
		p50off := float64(off.hist[path].ValueAtQuantile(50))
		p50on := float64(on.hist[path].ValueAtQuantile(50))
		b.ReportMetric(p50off, name+"-p50-off-µs")
		b.ReportMetric(p50on, name+"-p50-on-µs")
		b.ReportMetric(p50on/p50off, name+"-p50-ratio")
		b.Logf("telemetry %s, %s: p50 off %.0fµs on %.0fµs ratio %.3f; p99 off %dµs on %dµs (n=%d)", variant, name, p50off, p50on, p50on/p50off,
			off.hist[path].ValueAtQuantile(99), on.hist[path].ValueAtQuantile(99), off.hist[path].TotalCount())
	}
}
