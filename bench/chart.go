package bench

import (
	"fmt"
	"image/color"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// ChartMetric is what a chart's bars show.
type ChartMetric string

// Chart metrics.
const (
	// ChartOpsPerSec is Result.OpsPerSec.
	ChartOpsPerSec ChartMetric = "ops/s"
	// ChartP99 is the 99th percentile of Result.Latency, in milliseconds.
	ChartP99 ChartMetric = "p99 ms"
)

func (m ChartMetric) of(r *Result) float64 {
	if m == ChartP99 {
		return float64(r.Latency.Quantile(0.99)) / float64(time.Millisecond)
	}
	return r.OpsPerSec()
}

// chartPalette colours the bar series (one per workload × pipeline).
var chartPalette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	color.RGBA{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff},
	color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
}

// WriteChart draws results as a grouped bar chart: one group per mode
// (Result.Label, in order of first appearance), one bar per workload ×
// pipeline within it, the bar's height the metric. The format follows
// the file's extension: .svg, .png (also .pdf, .eps, .jpg, .tif).
// Results that failed (Result.Err) are drawn as 0.
func WriteChart(path string, results []*Result, metric ChartMetric) error {
	if len(results) == 0 {
		return fmt.Errorf("bench: chart: no results")
	}
	var modes []string
	type series struct {
		workload Workload
		pipeline int
	}
	var ss []series
	for _, r := range results {
		if !slices.Contains(modes, r.Label) {
			modes = append(modes, r.Label)
		}
		s := series{r.Workload, r.Pipeline}
		if !slices.Contains(ss, s) {
			ss = append(ss, s)
		}
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("diskque-bench: %s by mode (%s)", metric, chartSubtitle(results))
	p.Y.Label.Text = string(metric)
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true

	const groupWidth = 0.8 // fraction of a category slot the group fills
	slot := vg.Length(110) // points per mode
	barW := slot * groupWidth / vg.Length(len(ss))
	for i, s := range ss {
		vals := make(plotter.Values, len(modes))
		for _, r := range results {
			if r.Workload == s.workload && r.Pipeline == s.pipeline && r.Err == "" {
				vals[slices.Index(modes, r.Label)] = metric.of(r)
			}
		}
		bars, err := plotter.NewBarChart(vals, barW)
		if err != nil {
			return fmt.Errorf("bench: chart: %w", err)
		}
		bars.LineStyle.Width = 0
		bars.Color = chartPalette[i%len(chartPalette)]
		bars.Offset = barW * (vg.Length(i) - vg.Length(len(ss)-1)/2)
		p.Add(bars)
		p.Legend.Add(fmt.Sprintf("%s p%d", s.workload, s.pipeline), bars)
	}
	p.Add(plotter.NewGrid())
	p.NominalX(modes...)
	// Headroom above the tallest bar for the legend.
	top := 0.0
	for _, r := range results {
		if r.Err == "" {
			top = max(top, metric.of(r))
		}
	}
	if top > 0 {
		p.Y.Max = top * (1.15 + 0.07*float64(len(ss)))
	}

	w := slot*vg.Length(len(modes)) + 1*vg.Inch
	if w < 6*vg.Inch {
		w = 6 * vg.Inch
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".svg", ".png", ".pdf", ".eps", ".jpg", ".jpeg", ".tif", ".tiff":
	default:
		return fmt.Errorf("bench: chart: %s: want a .svg or .png file", path)
	}
	if err := p.Save(w, 4*vg.Inch, path); err != nil {
		return fmt.Errorf("bench: chart: %w", err)
	}
	return nil
}

// chartSubtitle summarizes the runs' shared parameters.
func chartSubtitle(results []*Result) string {
	r := results[0]
	return fmt.Sprintf("%d clients, %d-byte bodies, %s", r.Clients, r.Body, r.Start.UTC().Format("2006-01-02"))
}
