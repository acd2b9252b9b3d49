package bench

import (
	"math"
	"slices"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Histograms hold microseconds from 1 µs to 10 minutes at three
// significant digits: 0.1% resolution, enough to tell an fsync from a
// round trip and a round trip from a goroutine hand-off.
const (
	histMinUS   = 1
	histMaxUS   = int64(10 * time.Minute / time.Microsecond)
	histSigFigs = 3
)

func newHist() *hdrhistogram.Histogram {
	return hdrhistogram.New(histMinUS, histMaxUS, histSigFigs)
}

// record adds d to h, clamped to the histogram's range (a latency below
// 1 µs counts as 1 µs; one beyond 10 minutes as 10 minutes).
func record(h *hdrhistogram.Histogram, d time.Duration) {
	us := int64(d / time.Microsecond)
	us = min(max(us, histMinUS), histMaxUS)
	h.RecordValue(us) // in range by construction: never fails
}

// merged returns one histogram holding every value of hs.
func merged(hs ...*hdrhistogram.Histogram) *hdrhistogram.Histogram {
	out := newHist()
	for _, h := range hs {
		if h != nil {
			out.Merge(h)
		}
	}
	return out
}

// Percentiles are one trial's (or the median over trials') latency
// summary, in microseconds.
type Percentiles struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50_us"`
	P90   float64 `json:"p90_us"`
	P99   float64 `json:"p99_us"`
	P999  float64 `json:"p999_us"`
	Max   float64 `json:"max_us"`
}

func percentilesOf(h *hdrhistogram.Histogram) Percentiles {
	if h.TotalCount() == 0 {
		return Percentiles{}
	}
	return Percentiles{
		Count: h.TotalCount(),
		P50:   float64(h.ValueAtQuantile(50)),
		P90:   float64(h.ValueAtQuantile(90)),
		P99:   float64(h.ValueAtQuantile(99)),
		P999:  float64(h.ValueAtQuantile(99.9)),
		Max:   float64(h.Max()),
	}
}

// medianPercentiles summarizes trials: each percentile is the median of
// the trials' values, Max the largest of all and Count the sum.
func medianPercentiles(trials []Percentiles) Percentiles {
	var out Percentiles
	pick := func(f func(Percentiles) float64) float64 {
		vs := make([]float64, len(trials))
		for i, t := range trials {
			vs[i] = f(t)
		}
		return median(vs)
	}
	out.P50 = pick(func(p Percentiles) float64 { return p.P50 })
	out.P90 = pick(func(p Percentiles) float64 { return p.P90 })
	out.P99 = pick(func(p Percentiles) float64 { return p.P99 })
	out.P999 = pick(func(p Percentiles) float64 { return p.P999 })
	for _, t := range trials {
		out.Count += t.Count
		out.Max = max(out.Max, t.Max)
	}
	return out
}

// median returns the median of vs (the mean of the middle two for an even
// count), 0 for none. vs is not modified.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// spreadPct is the range of vs as a percentage of their median: how much
// the trials disagree.
func spreadPct(vs []float64) float64 {
	m := median(vs)
	if m == 0 {
		return 0
	}
	return round1((slices.Max(vs) - slices.Min(vs)) / m * 100)
}

func usOf(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func round1(f float64) float64 {
	return math.Round(f*10) / 10 // half away from zero, negative figures too
}

// round2 rounds f to two decimals, as round1 to one.
func round2(f float64) float64 { return math.Round(f*100) / 100 }
