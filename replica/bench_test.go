package replica

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/felix-broker/felix/wal"
)

// appender is what both logs offer a publisher.
type appender interface {
	AppendAsync(r *wal.Record, done func(offset uint64, ts int64, err error))
}

// BenchmarkAppend measures append → acknowledgement latency and throughput
// of a three-replica group (real fsync, the three directories on the same
// disk, in-memory transport) next to a single wal.Log on the same disk, in
// the same run. inflight is the number of publishers, each waiting for its
// ack before its next append.
func BenchmarkAppend(b *testing.B) {
	for _, inflight := range []int{1, 64} {
		b.Run(fmt.Sprintf("replica3/inflight=%d", inflight), func(b *testing.B) {
			c := newCluster(b, 3, 1, nil)
			g := c.waitLeader()
			runAppends(b, g, inflight)
			g.offs.mu.RLock()
			b.ReportMetric(float64(g.offs.next)/float64(len(g.offs.bases)), "records/entry")
			g.offs.mu.RUnlock()
		})
		b.Run(fmt.Sprintf("wal/inflight=%d", inflight), func(b *testing.B) {
			l, err := wal.Open(b.TempDir(), wal.Options{Name: "bench/0"})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			runAppends(b, l, inflight)
		})
		// The disk's share of the cost: every record written to three
		// wal.Logs on the same disk, acknowledged when all three have
		// fsynced it (three fsync streams, no consensus, no messages).
		b.Run(fmt.Sprintf("wal-x3/inflight=%d", inflight), func(b *testing.B) {
			var ls copies
			for i := range 3 {
				l, err := wal.Open(b.TempDir(), wal.Options{Name: fmt.Sprint("bench/", i)})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				ls = append(ls, l)
			}
			runAppends(b, ls, inflight)
		})
	}
}

func runAppends(b *testing.B, a appender, inflight int) {
	value := make([]byte, 100)
	var next atomic.Int64
	lat := make([]time.Duration, b.N)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range inflight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan error, 1)
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				t0 := time.Now()
				a.AppendAsync(&wal.Record{Value: value}, func(_ uint64, _ int64, err error) { done <- err })
				if err := <-done; err != nil {
					b.Error(err)
					return
				}
				lat[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "records/s")
}

// copies appends every record to each of its logs and reports when all
// have it.
type copies []*wal.Log

func (c copies) AppendAsync(r *wal.Record, done func(offset uint64, ts int64, err error)) {
	var left atomic.Int32
	left.Store(int32(len(c)))
	var first atomic.Pointer[error]
	for _, l := range c {
		l.AppendAsync(r, func(off uint64, ts int64, err error) {
			if err != nil {
				first.CompareAndSwap(nil, &err)
			}
			if left.Add(-1) == 0 {
				if e := first.Load(); e != nil {
					done(0, 0, *e)
					return
				}
				done(off, ts, nil)
			}
		})
	}
}
