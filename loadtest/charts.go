package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/pglimit/cooldown/pglimit"
)

// writeCharts draws the PNGs for the scenarios that ran and returns their
// file names.
func writeCharts(dir string, rep *report) ([]string, error) {
	m := &rep.Meta
	var names []string
	for _, s := range rep.Scenarios {
		var err error
		switch s.Name {
		case scSeed:
			err = latencyTiles(filepath.Join(dir, "seed-latency.png"), s, m)
			names = append(names, "seed-latency.png")
		case scContention:
			err = byConcurrency(filepath.Join(dir, "contention-throughput.png"), s, m, "Decisions per second, one hot key",
				"decisions/s", func(r *result) float64 { return r.Rate })
			if err == nil {
				err = byConcurrency(filepath.Join(dir, "contention-p99.png"), s, m, "p99 latency, one hot key",
					"p99 (ms)", func(r *result) float64 { return r.Latency.P99 })
			}
			names = append(names, "contention-throughput.png", "contention-p99.png")
		case scNaive:
			err = admissionsOverTime(filepath.Join(dir, "range-naive-admissions.png"), s, rep.variants)
			names = append(names, "range-naive-admissions.png")
		case scTiers:
			err = byConcurrency(filepath.Join(dir, "tiers-throughput.png"), s, m, "Decisions per second, two limits per user (tiers)",
				"decisions/s", func(r *result) float64 { return r.Rate })
			names = append(names, "tiers-throughput.png")
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
	}
	return names, nil
}

// style draws a variant the same way in every chart, whichever variants
// ran: one colour per strategy (and one for the naive plain INSERT and
// one for the peer), one dash pattern per option, so that upsert-async is
// upsert's colour, dashed. The floors and the seed's upsert, a ceiling,
// are black or grey and thin, each with its own dashes; the peer, the limiter the strategies are measured
// against, a thick solid line.
func style(name string) draw.LineStyle {
	name = strings.TrimSuffix(name, "-"+setTiers) // drawn as the variant it enforces the tiers with
	ls := draw.LineStyle{Width: vg.Points(1.5), Color: color.Gray{Y: 90}}
	switch name {
	case floorName:
		ls.Color, ls.Width = color.Black, vg.Points(1.2)
		ls.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		return ls
	case writeFloorName:
		ls.Color, ls.Width = color.Black, vg.Points(1.2)
		ls.Dashes = []vg.Length{vg.Points(1), vg.Points(2)}
		return ls
	case pingFloorName:
		ls.Color, ls.Width = color.Gray{Y: 120}, vg.Points(1.2)
		ls.Dashes = []vg.Length{vg.Points(8), vg.Points(2), vg.Points(1), vg.Points(2)}
		return ls
	case peerName:
		ls.Color, ls.Width = peerColor, vg.Points(2.5)
		return ls
	case peerEverysec.Name:
		ls.Color, ls.Dashes = peerColor, []vg.Length{vg.Points(9), vg.Points(4)}
		return ls
	case peerAlways.Name:
		ls.Color, ls.Dashes = peerColor, []vg.Length{vg.Points(3), vg.Points(3)}
		return ls
	case naive.Name:
		ls.Color = naiveColor
		return ls
	case seedUpsert.Name: // a ceiling, not an option of the library: drawn as the floors are
		ls.Color, ls.Width = color.Black, vg.Points(1.2)
		ls.Dashes = []vg.Length{vg.Points(6), vg.Points(2), vg.Points(2), vg.Points(2)}
		return ls
	}
	i := slices.IndexFunc(allVariants(), func(v variant) bool { return v.Name == name })
	if i < 0 {
		return ls // not a variant of ours: grey
	}
	s := allVariants()[i].Strategy
	if c, ok := strategyColors[s]; ok {
		ls.Color = c
	}
	ls.Dashes = optionDashes[strings.TrimPrefix(name, string(s))]
	return ls
}

// Colours that stay apart for the colour-blind (Okabe and Ito's palette);
// red is the naive Range's failure mode's.
var (
	strategyColors = map[pglimit.Strategy]color.Color{
		pglimit.Upsert: color.RGBA{R: 0x00, G: 0x72, B: 0xb2, A: 0xff}, // blue
		pglimit.NoWait: color.RGBA{R: 0xe6, G: 0x9f, B: 0x00, A: 0xff}, // orange
		pglimit.Range:  color.RGBA{R: 0x00, G: 0x9e, B: 0x73, A: 0xff}, // green
	}
	naiveColor = color.RGBA{R: 0xd5, G: 0x5e, B: 0x00, A: 0xff} // vermilion
	peerColor  = color.RGBA{R: 0xcc, G: 0x79, B: 0xa7, A: 0xff} // purple
)

// optionDashes tells a strategy's variants apart, by the suffix of their
// names; the plain strategy is solid.
var optionDashes = map[string][]vg.Length{
	"":              nil,
	"-async":        {vg.Points(9), vg.Points(4)},
	"-preblock":     {vg.Points(1.5), vg.Points(2)},
	"-unlogged":     {vg.Points(16), vg.Points(4)},
	"-preblock-inv": {vg.Points(1.5), vg.Points(2), vg.Points(1.5), vg.Points(5)},
}

// legend names a variant in charts, floors with what they measure.
func legend(name string, m *meta) string {
	switch name {
	case floorName:
		return "floor (" + m.Floor + ")"
	case writeFloorName:
		return "write floor (UPDATE by key)"
	case pingFloorName:
		return "Redis floor (" + m.RedisFloor + ")"
	}
	return name
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Add(plotter.NewGrid())
	return p
}

// newLegend is a legend drawn beside a chart, never over its data.
func newLegend() *plot.Legend {
	l := plot.NewLegend()
	l.Top, l.Left = true, true
	l.ThumbnailWidth = vg.Points(28)
	return &l
}

// addLine draws xys on p and names it in leg, unless label is empty.
func addLine(p *plot.Plot, leg *plot.Legend, label string, xys plotter.XYs, ls draw.LineStyle) error {
	if len(xys) == 0 {
		return nil
	}
	l, err := plotter.NewLine(xys)
	if err != nil {
		return err
	}
	l.LineStyle = ls
	p.Add(l)
	if label != "" {
		leg.Add(label, l)
	}
	return nil
}

// legendWidth is the width of the strip right of a chart that holds leg:
// its longest entry and a margin on either side.
func legendWidth(leg *plot.Legend) vg.Length {
	r := leg.Rectangle(draw.Canvas{})
	return r.Max.X - r.Min.X + 2*legendMargin
}

const legendMargin = vg.Length(8) // points

// drawWithLegend draws the chart on the left of c and leg in the strip on
// the right, top-aligned with the plotting area.
func drawWithLegend(c draw.Canvas, draw1 func(draw.Canvas), leg *plot.Legend) {
	lw := legendWidth(leg)
	draw1(draw.Crop(c, 0, -lw, 0, 0))
	leg.YOffs = -vg.Points(24) // below the title's line
	leg.Draw(draw.Crop(c, c.Max.X-c.Min.X-lw+legendMargin, 0, 0, 0))
}

// saveWithLegend saves p, w by h, with leg beside it.
func saveWithLegend(p *plot.Plot, leg *plot.Legend, w, h vg.Length, path string) error {
	img := vgimg.New(w+legendWidth(leg), h)
	drawWithLegend(draw.New(img), p.Draw, leg)
	return savePNG(path, img)
}

// logY puts p's y axis on a log scale over [lo, hi].
func logY(p *plot.Plot, lo, hi float64) {
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = logTicks{}
	p.Y.Min, p.Y.Max = lo, hi
}

// logTicks labels 1, 2 and 5 of every decade, so that an axis spanning
// less than a decade still has labels (plot.LogTicks labels powers of ten
// only); over more than three decades, powers of ten only, or the labels
// run into each other.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	onlyPowers := math.Log10(hi/lo) > 3
	var ticks []plot.Tick
	for dec := math.Pow10(int(math.Floor(math.Log10(lo)))); dec <= hi; dec *= 10 {
		for m := 1; m < 10; m++ {
			v := float64(m) * dec
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || !onlyPowers && (m == 2 || m == 5) {
				t.Label = tickLabel(v)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// latencyTiles draws, per strategy, p50, p99 and max latency over time:
// the demo dashboard's panels, one tile per strategy on a shared scale.
func latencyTiles(path string, s *scenarioReport, m *meta) error {
	lo, hi := math.Inf(1), 0.0
	for _, r := range s.Results {
		for _, pt := range r.Timeline {
			if pt.Count > 0 {
				lo, hi = min(lo, pt.P50), max(hi, pt.Max)
			}
		}
	}
	if hi == 0 {
		return nil
	}
	lo = max(lo/2, 0.01)
	hi *= 2

	const cols = 3
	rows := (len(s.Results) + cols - 1) / cols
	plots := make([][]*plot.Plot, rows)
	for i := range plots {
		plots[i] = make([]*plot.Plot, cols)
	}
	leg := newLegend()
	for i, r := range s.Results {
		title := legend(r.Variant, m)
		if title != r.Variant {
			title += ", same arrivals"
		}
		p := newPlot(title, "time (s)", "latency (ms)")
		logY(p, lo, hi)
		series := []struct {
			name string
			f    func(point) float64
		}{
			// Max first, so that the others are drawn over it.
			{"max", func(pt point) float64 { return pt.Max }},
			{"p99", func(pt point) float64 { return pt.P99 }},
			{"p50", func(pt point) float64 { return pt.P50 }},
		}
		for j, sr := range series {
			var xys plotter.XYs
			for _, pt := range r.Timeline {
				if pt.Count > 0 {
					xys = append(xys, plotter.XY{X: pt.T, Y: max(sr.f(pt), lo)})
				}
			}
			ls := draw.LineStyle{Width: vg.Points(1.2), Color: plotutil.Color(j)}
			if sr.name == "max" {
				ls = draw.LineStyle{Width: vg.Points(0.8), Color: color.Gray{Y: 150},
					Dashes: []vg.Length{vg.Points(2), vg.Points(2)}}
			}
			label := ""
			if i == 0 { // one legend for every tile
				label = sr.name
			}
			if err := addLine(p, leg, label, xys, ls); err != nil {
				return err
			}
		}
		plots[i/cols][i%cols] = p
	}
	const w, tileH = 12 * vg.Inch, 2.6 * vg.Inch
	img := vgimg.New(w+legendWidth(leg), tileH*vg.Length(rows))
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	drawWithLegend(draw.New(img), func(c draw.Canvas) {
		canvases := plot.Align(plots, tiles, c)
		for i := range plots {
			for j, p := range plots[i] {
				if p != nil {
					p.Draw(canvases[i][j])
				}
			}
		}
	}, leg)
	return savePNG(path, img)
}

// tickLabel writes 0.05, 20, 5k, 1M rather than 5e+03.
func tickLabel(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case v >= 1e3:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	default:
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
}

func savePNG(path string, img *vgimg.Canvas) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// byConcurrency draws one line per variant (floors and peer included) of y
// against concurrency, both axes logarithmic.
func byConcurrency(path string, s *scenarioReport, m *meta, title, ylabel string, y func(*result) float64) error {
	p := newPlot(title, "concurrent workers", ylabel)
	leg := newLegend()
	order, byVariant := groupByVariant(s)
	lo, hi := math.Inf(1), 0.0
	var ticks plot.ConstantTicks
	seen := map[int]bool{}
	for _, r := range s.Results {
		if v := y(r); v > 0 {
			lo, hi = min(lo, v), max(hi, v)
		}
		if !seen[r.Concurrency] {
			seen[r.Concurrency] = true
			ticks = append(ticks, plot.Tick{Value: float64(r.Concurrency), Label: strconv.Itoa(r.Concurrency)})
		}
	}
	if hi == 0 {
		return nil
	}
	for _, name := range order {
		var xys plotter.XYs
		for _, r := range byVariant[name] {
			if v := y(r); v > 0 {
				xys = append(xys, plotter.XY{X: float64(r.Concurrency), Y: v})
			}
		}
		if err := addLine(p, leg, legend(name, m), xys, style(name)); err != nil {
			return err
		}
		pts, err := plotter.NewScatter(xys)
		if err != nil {
			return err
		}
		pts.GlyphStyle.Color = style(name).Color
		pts.GlyphStyle.Shape = draw.CircleGlyph{}
		p.Add(pts)
	}
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = ticks
	logY(p, lo/2, hi*2)
	return saveWithLegend(p, leg, 8*vg.Inch, 5*vg.Inch, path)
}

// admissionsOverTime draws each strategy's cumulative admissions on the hot
// key against the most the cooldown allows: a flat stretch is a lost
// admission.
func admissionsOverTime(path string, s *scenarioReport, variants map[string]variant) error {
	p := newPlot("Admissions on one hot key whose cooldown keeps expiring", "time (s)", "admissions so far")
	leg := newLegend()
	cooldown := s.CooldownMS / 1000
	var end float64
	for _, r := range s.Results {
		if variants[r.Variant].Floor {
			continue
		}
		var (
			xys plotter.XYs
			sum int64
		)
		for _, pt := range r.Timeline {
			sum += pt.Admitted
			xys = append(xys, plotter.XY{X: pt.T, Y: float64(sum)})
			end = max(end, pt.T)
		}
		if err := addLine(p, leg, r.Variant, xys, style(r.Variant)); err != nil {
			return err
		}
	}
	// A staircase: one more admission allowed every cooldown.
	var ideal plotter.XYs
	for k := 0.0; k*cooldown <= end; k++ {
		ideal = append(ideal, plotter.XY{X: k * cooldown, Y: k + 1}, plotter.XY{X: min((k+1)*cooldown, end), Y: k + 1})
	}
	// Thin and grey: a bound, not a measurement, and unlike the floors.
	// Admissions are timed by the client, which sees two admissions a
	// cooldown apart on the database clock a little closer now and then:
	// a line may cross it by one for a moment. The over-admission check
	// uses the database's clock.
	bound := draw.LineStyle{Width: vg.Points(0.8), Color: color.Gray{Y: 60}}
	if err := addLine(p, leg, "most the cooldown allows (client clock)", ideal, bound); err != nil {
		return err
	}
	return saveWithLegend(p, leg, 8*vg.Inch, 5*vg.Inch, path)
}

// groupByVariant returns the variants in first-seen order and their
// results.
func groupByVariant(s *scenarioReport) ([]string, map[string][]*result) {
	var order []string
	by := map[string][]*result{}
	for _, r := range s.Results {
		if _, ok := by[r.Variant]; !ok {
			order = append(order, r.Variant)
		}
		by[r.Variant] = append(by[r.Variant], r)
	}
	return order, by
}
