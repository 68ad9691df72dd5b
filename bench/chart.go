package bench

import (
	"fmt"
	"image/color"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// line is one run's (or one worker's) units accepted per 200 ms.
type line struct {
	name     string
	per200ms []int64
	capacity float64 // units/s, drawn as the per-200 ms limit when > 0
}

// addLine keeps a run's series for chart file (scenario ID + suffix);
// leading empty buckets (joining the group, taking leases) are trimmed to
// one, so runs line up at their first acceptance.
func (r *runner) addLine(chart, name string, per200ms []int64, capacity float64) {
	first := slices.IndexFunc(per200ms, func(u int64) bool { return u > 0 })
	if first > 0 {
		per200ms = per200ms[first-1:]
	}
	r.charts[chart] = append(r.charts[chart], line{name: name, per200ms: per200ms, capacity: capacity})
}

// addLines keeps lines that share one time axis (the workers of one run);
// the leading buckets empty in all of them are trimmed to one.
func (r *runner) addLines(chart string, capacity float64, lines []line) {
	first := -1
	for _, l := range lines {
		if i := slices.IndexFunc(l.per200ms, func(u int64) bool { return u > 0 }); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	for _, l := range lines {
		if first > 0 && first <= len(l.per200ms) {
			l.per200ms = l.per200ms[first-1:]
		}
		l.capacity = capacity
		r.charts[chart] = append(r.charts[chart], l)
	}
}

// drawCharts draws the charts of scenario id (files named "s<id>*.png")
// and returns their paths.
func (r *runner) drawCharts(id string) []string {
	var out []string
	var names []string
	for name := range r.charts {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if !matchesScenario(name, id) {
			continue
		}
		path := filepath.Join(r.cfg.Out, name+".png")
		if err := drawChart(path, name, r.charts[name]); err != nil {
			r.log.Warn("chart not drawn", "chart", path, "err", err)
			continue
		}
		out = append(out, path)
	}
	return out
}

// matchesScenario reports whether chart belongs to scenario id: "s3b" and
// "s3b-share" belong to "3b".
func matchesScenario(chart, id string) bool {
	p := "s" + id
	return chart == p || (len(chart) > len(p) && chart[:len(p)] == p && chart[len(p)] == '-')
}

// drawChart plots units per 200 ms over time, one line per run, and the
// capacity's per-200 ms share as a dashed line.
func drawChart(path, title string, lines []line) error {
	p := plot.New()
	p.Title.Text = title + ": units accepted per 200 ms"
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = "units / 200 ms"
	p.Legend.Top = true
	var capacity float64
	maxT := 0.0
	for i, l := range lines {
		pts := make(plotter.XYs, len(l.per200ms))
		for j, u := range l.per200ms {
			pts[j].X, pts[j].Y = float64(j)*0.2, float64(u)
		}
		maxT = max(maxT, float64(len(l.per200ms))*0.2)
		lp, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		lp.Color = plotutil.Color(i)
		lp.Width = vg.Points(1.2)
		p.Add(lp)
		p.Legend.Add(l.name, lp)
		capacity = max(capacity, l.capacity)
	}
	if capacity > 0 {
		limit, err := plotter.NewLine(plotter.XYs{{X: 0, Y: capacity / 5}, {X: maxT, Y: capacity / 5}})
		if err != nil {
			return err
		}
		limit.Color = color.Gray{Y: 100}
		limit.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(limit)
		p.Legend.Add(fmt.Sprintf("capacity ÷ 5 (%.0f)", capacity/5), limit)
	}
	p.Legend.Left = false
	p.Legend.YPosition = draw.PosTop
	p.Y.Min = 0
	return p.Save(9*vg.Inch, 4*vg.Inch, path)
}
