package bench

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/HdrHistogram/hdrhistogram-go"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	_ "gonum.org/v1/plot/vg/vgimg" // png
	_ "gonum.org/v1/plot/vg/vgsvg" // svg
)

// PlotFormats are the file extensions --plot accepts.
var PlotFormats = []string{".svg", ".png"}

// writePlot draws the latency percentile curves of every scenario (merged
// over its trials), side by side with the floors' curves: on the left in
// microseconds, on the right as a ratio to the floor (fsync + RTT at the
// same percentile). The format follows path's extension.
func writePlot(path string, rep *Report) error {
	format := strings.TrimPrefix(strings.ToLower(filepath.Ext(path)), ".")
	abs := plot.New()
	abs.Title.Text = fmt.Sprintf("Latency by percentile, %d-byte records", rep.PayloadBytes)
	abs.Y.Label.Text = "latency (µs)"
	ratio := plot.New()
	ratio.Title.Text = "Latency / floor (fsync + QUIC RTT at the same percentile); colours as on the left"
	ratio.Y.Label.Text = "× floor"
	for _, p := range []*plot.Plot{abs, ratio} {
		p.X.Label.Text = "percentile"
		p.X.Tick.Marker = percentileTicks{}
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Add(plotter.NewGrid())
	}

	abs.Legend.Left, abs.Legend.Top = false, false // the curves rise to the right: bottom right is free
	ratio.Legend.Top = true
	fl := rep.Floors
	for i, res := range rep.Scenarios {
		if res.hist == nil || res.hist.TotalCount() == 0 {
			continue
		}
		style := draw.LineStyle{Color: plotutil.Color(i), Width: vg.Points(1.5), Dashes: plotutil.Dashes(i / 7)}
		line, err := plotter.NewLine(percentileCurve(res.hist, nil, nil))
		if err != nil {
			return fmt.Errorf("bench: plot %s: %w", res.Label(), err)
		}
		line.LineStyle = style
		abs.Add(line)
		abs.Legend.Add(res.Label(), line)
		if fl.fsyncHist != nil && fl.rttHist != nil && fl.fsyncHist.TotalCount() > 0 && fl.rttHist.TotalCount() > 0 {
			rl, err := plotter.NewLine(percentileCurve(res.hist, fl.fsyncHist, fl.rttHist))
			if err != nil {
				return fmt.Errorf("bench: plot %s: %w", res.Label(), err)
			}
			rl.LineStyle = style
			ratio.Add(rl) // one legend, on the left panel

		}
	}
	for i, f := range []struct {
		name string
		h    *hdrhistogram.Histogram
	}{{fsyncCurveName(fl), fl.fsyncHist}, {"floor: QUIC RTT (2 processes)", fl.rttHist}} {
		if f.h == nil || f.h.TotalCount() == 0 {
			continue
		}
		line, err := plotter.NewLine(percentileCurve(f.h, nil, nil))
		if err != nil {
			return fmt.Errorf("bench: plot %s: %w", f.name, err)
		}
		line.LineStyle = draw.LineStyle{Color: color.Gray{Y: uint8(40 + 70*i)}, Width: vg.Points(1.2), Dashes: []vg.Length{vg.Points(5 - 3*float64(i)), vg.Points(3)}}
		abs.Add(line)
		abs.Legend.Add(f.name, line)
	}
	one, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 1}, {X: maxNines(rep), Y: 1}})
	if err == nil {
		one.LineStyle = draw.LineStyle{Color: color.Black, Width: vg.Points(1), Dashes: []vg.Length{vg.Points(2), vg.Points(2)}}
		ratio.Add(one)
		ratio.Legend.Add("1 × floor", one)
	}

	const w, h = 16 * vg.Inch, 6 * vg.Inch
	canvas, err := draw.NewFormattedCanvas(w, h, format)
	if err != nil {
		return fmt.Errorf("bench: plot format %q of %s (want one of %v): %w", format, path, PlotFormats, err)
	}
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Millimeter * 8, PadTop: vg.Millimeter * 3,
		PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 3}
	plots := [][]*plot.Plot{{abs, ratio}}
	dc := draw.New(canvas)
	canvases := plot.Align(plots, tiles, dc)
	abs.Draw(canvases[0][0])
	ratio.Draw(canvases[0][1])

	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: plot: %w", err)
	}
	if _, err := canvas.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("bench: plot: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("bench: plot: write %s: %w", path, err)
	}
	return nil
}

// percentileCurve samples h at percentiles spaced evenly in "nines"
// (x = -log10(1 - p)), up to what h's count resolves. With fsync and rtt it
// returns h's latency over their sum at each percentile instead.
func percentileCurve(h, fsync, rtt *hdrhistogram.Histogram) plotter.XYs {
	top := math.Log10(float64(h.TotalCount()))
	var pts plotter.XYs
	for x := 0.0; ; x += 0.02 {
		x = min(x, top)
		q := 100 * (1 - math.Pow(10, -x))
		y := float64(max(h.ValueAtQuantile(q), 1))
		if fsync != nil {
			y /= float64(max(fsync.ValueAtQuantile(q)+rtt.ValueAtQuantile(q), 1))
		}
		pts = append(pts, plotter.XY{X: x, Y: y})
		if x >= top {
			return pts
		}
	}
}

// maxNines is the x extent of the widest curve.
func maxNines(rep *Report) float64 {
	top := 1.0
	for _, r := range rep.Scenarios {
		if r.hist != nil && r.hist.TotalCount() > 0 {
			top = max(top, math.Log10(float64(r.hist.TotalCount())))
		}
	}
	return top
}

// percentileTicks labels the x axis of a percentile curve in nines.
type percentileTicks struct{}

func (percentileTicks) Ticks(lo, hi float64) []plot.Tick {
	labels := []string{"0", "90", "99", "99.9", "99.99", "99.999", "99.9999"}
	var ticks []plot.Tick
	for i, l := range labels {
		if x := float64(i); x >= lo-1e-9 && x <= hi+1e-9 {
			ticks = append(ticks, plot.Tick{Value: x, Label: l})
		}
	}
	return ticks
}

// fsyncCurveName names the plot's fsync floor curve: the targets' floor.
func fsyncCurveName(fl Floors) string {
	if _, name := fl.targetFsync(); name == "fsync_prealloc" {
		return "floor: write+fdatasync over zeros"
	}
	return "floor: write+fdatasync"
}
