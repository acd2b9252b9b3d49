package wal

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/tidseg"
)

// benchDir returns an empty directory on a real disk: FELIX_BENCH_DIR if
// set, else the test temp dir unless it is on tmpfs (where fsync is free and
// the figures would mean nothing), else ./testdata-bench-tmp.
func benchDir(b *testing.B) string {
	b.Helper()
	parent := os.Getenv("FELIX_BENCH_DIR")
	if parent == "" {
		if fsType(os.TempDir()) != "tmpfs" {
			return b.TempDir()
		}
		parent = "testdata-bench-tmp"
		b.Cleanup(func() { os.RemoveAll(parent) })
	}
	if err := os.MkdirAll(parent, 0o750); err != nil {
		b.Fatal(err)
	}
	dir, err := os.MkdirTemp(parent, "walbench")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// rawSyncer writes 128 bytes and fdatasyncs, the floor an append is
// compared with.
type rawSyncer struct {
	f   *os.File
	buf []byte
}

func newRawSyncer(b *testing.B, dir string) *rawSyncer {
	f, err := os.OpenFile(filepath.Join(dir, "raw"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	return &rawSyncer{f: f, buf: make([]byte, 128)}
}

func (r *rawSyncer) once(b *testing.B) time.Duration {
	t0 := time.Now()
	if _, err := r.f.Write(r.buf); err != nil {
		b.Fatal(err)
	}
	if err := tidseg.Fdatasync(r.f); err != nil {
		b.Fatal(err)
	}
	return time.Since(t0)
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, int(float64(len(d))*p))]
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func BenchmarkRawFdatasync(b *testing.B) {
	dir := benchDir(b)
	b.Logf("filesystem %s (%s)", fsType(dir), dir)
	raw := newRawSyncer(b, dir)
	lat := make([]time.Duration, 0, b.N)
	for b.Loop() {
		lat = append(lat, raw.once(b))
	}
	b.ReportMetric(us(percentile(lat, 0.50)), "p50-us")
	b.ReportMetric(us(percentile(lat, 0.99)), "p99-us")
}

// BenchmarkAppend measures synchronous Append of 128-byte records by
// concurrent appenders. With one appender, every append is paired with a raw
// write+fdatasync on the same disk, so p50-ratio-vs-fdatasync compares the
// two from the same run.
func BenchmarkAppend(b *testing.B) {
	for _, appenders := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("appenders=%d", appenders), func(b *testing.B) {
			dir := benchDir(b)
			b.Logf("filesystem %s (%s)", fsType(dir), dir)
			var commitLat []time.Duration // written by the committer, read after Close
			l, err := Open(filepath.Join(dir, "log"), Options{
				Logger: slog.New(slog.DiscardHandler),
				OnCommit: func(c Commit) {
					if len(commitLat) < cap(commitLat) {
						commitLat = append(commitLat, c.Sync)
					}
				},
			})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			commitLat = make([]time.Duration, 0, b.N)
			value := make([]byte, 128)
			var raw *rawSyncer
			var rawLat []time.Duration
			if appenders == 1 {
				raw = newRawSyncer(b, dir)
				rawLat = make([]time.Duration, 0, b.N)
			}
			lat := make([][]time.Duration, appenders)
			var issued atomic.Int64
			var appendTime atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for g := range appenders {
				wg.Go(func() {
					r := &Record{Value: value}
					mine := make([]time.Duration, 0, b.N/appenders+1)
					var total time.Duration
					for issued.Add(1) <= int64(b.N) {
						if raw != nil {
							rawLat = append(rawLat, raw.once(b))
						}
						t0 := time.Now()
						if _, err := l.Append(context.Background(), r); err != nil {
							b.Error(err)
							return
						}
						d := time.Since(t0)
						total += d
						mine = append(mine, d)
					}
					lat[g] = mine
					appendTime.Add(int64(total))
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			if raw != nil {
				elapsed = time.Duration(appendTime.Load()) // exclude the interleaved raw syncs
			}
			st := l.Stats()
			if err := l.Close(); err != nil {
				b.Fatal(err)
			}
			all := slices.Concat(lat...)
			b.ReportMetric(float64(len(all))/elapsed.Seconds(), "records/s")
			p50 := percentile(all, 0.50)
			b.ReportMetric(us(p50), "p50-us")
			b.ReportMetric(us(percentile(all, 0.99)), "p99-us")
			b.ReportMetric(us(percentile(commitLat, 0.50)), "write+sync-p50-us")
			if st.Fsyncs > 0 {
				b.ReportMetric(float64(st.Records)/float64(st.Fsyncs), "records/fsync")
			}
			if raw != nil {
				rawP50 := percentile(rawLat, 0.50)
				b.ReportMetric(us(rawP50), "raw-p50-us")
				b.ReportMetric(us(percentile(rawLat, 0.99)), "raw-p99-us")
				b.ReportMetric(float64(p50)/float64(rawP50), "p50-ratio-vs-fdatasync")
			}
		})
	}
}

// BenchmarkAppendAsync measures pipelined appends (how a broker forwards a
// publisher's stream): up to 4096 records in flight, 128-byte values. This is
// the write path's capacity when fsync latency is not multiplied by a closed
// loop of waiting appenders.
func BenchmarkAppendAsync(b *testing.B) {
	dir := benchDir(b)
	l, err := Open(filepath.Join(dir, "log"), Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	r := &Record{Value: make([]byte, 128)}
	window := make(chan struct{}, 4096)
	var failed atomic.Bool
	done := func(_ uint64, _ int64, err error) {
		if err != nil {
			failed.Store(true)
		}
		<-window
	}
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		window <- struct{}{}
		l.AppendAsync(r, done)
	}
	if err := l.Close(); err != nil { // waits for every callback
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	if failed.Load() {
		b.Fatal("an append failed")
	}
	st := l.Stats()
	b.ReportMetric(float64(st.Records)/elapsed.Seconds(), "records/s")
	b.ReportMetric(float64(st.Records)/float64(st.Fsyncs), "records/fsync")
}
