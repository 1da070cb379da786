package bench

import (
	"fmt"
	"math"
	"strings"
)

// Chart geometry, in SVG user units.
const (
	chartW, chartH         = 900, 400
	plotL, plotR           = 70, 200
	plotT, plotB           = 40, 50
	barGap, groupGap       = 2, 24
	chartFont              = `font-family="sans-serif" font-size="12"`
	chartTitle             = "create to running, p50 per clone (ms, log scale)"
	legendSwatch, legendDY = 12, 18
)

// seriesColors by arm: copy warm, mmap cool, the shim darker; runc green,
// a cold boot grey, the shim variants purple.
var seriesColors = map[string]string{
	"direct copy": "#f4a261", "shim copy": "#c2571a",
	"direct mmap": "#76b7e5", "shim mmap": "#1f5f99",
	"runc": "#2a9d8f", "cold": "#555555",
	"shim mmap network": "#8e6bbf", "shim mmap ordinary": "#c05fa0",
}

// seriesColor is the series' color; grey for an arm without one.
func seriesColor(series string) string {
	if c, ok := seriesColors[series]; ok {
		return c
	}
	return "#999"
}

// logAxis maps milliseconds onto the plot's height on a log scale whose
// ends are the powers of ten around the values.
type logAxis struct{ lo, hi, height float64 }

func newLogAxis(cs []cellResult, height float64) logAxis {
	lo, hi := math.Inf(1), 0.0
	for _, c := range cs {
		if c.P50Ms > 0 {
			lo, hi = math.Min(lo, c.P50Ms), math.Max(hi, c.P50Ms)
		}
	}
	if hi == 0 {
		lo, hi = 1, 10
	}
	lo = math.Pow(10, math.Floor(math.Log10(lo)))
	hi = math.Pow(10, math.Max(math.Ceil(math.Log10(hi)), math.Log10(lo)+1))
	return logAxis{lo: lo, hi: hi, height: height}
}

// at is how far above the axis's bottom v is drawn.
func (a logAxis) at(v float64) float64 {
	if v <= a.lo {
		return 0
	}
	return a.height * math.Log10(v/a.lo) / math.Log10(a.hi/a.lo)
}

// svg is a grouped bar chart: one group per N, one bar per arm.
func (r *results) svg() string {
	ns, series := r.chartAxes()
	plotW, plotH := float64(chartW-plotL-plotR), float64(chartH-plotT-plotB)
	axis := newLogAxis(r.Cells, plotH)
	bottom := float64(plotT) + plotH
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" %s>`+"\n", chartW, chartH, chartW, chartH, chartFont)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="14">%s</text>`+"\n", plotL, chartTitle)
	for v := axis.lo; v <= axis.hi*1.001; v *= 10 {
		y := bottom - axis.at(v)
		fmt.Fprintf(&b, `<line x1="%d" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", plotL, float64(plotL)+plotW, y, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n", plotL-6, y+4, v)
	}
	groupW := plotW / float64(max(len(ns), 1))
	barW := (groupW - groupGap) / float64(max(len(series), 1))
	for gi, n := range ns {
		x0 := float64(plotL) + float64(gi)*groupW + groupGap/2
		for si, s := range series {
			c := r.cell(s, n)
			if c == nil {
				continue
			}
			h := axis.at(c.P50Ms)
			x, y := x0+float64(si)*barW, bottom-h
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s N=%d: %.0f ms</title></rect>`+"\n",
				x, y, barW-barGap, h, seriesColor(s), s, n, c.P50Ms)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="9">%.0f</text>`+"\n", x+(barW-barGap)/2, y-3, c.P50Ms)
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">N = %d</text>`+"\n", x0+(groupW-groupGap)/2, chartH-plotB+20, n)
	}
	for si, s := range series {
		y := plotT + si*legendDY
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="%s"/>`+"\n", chartW-plotR+20, y, legendSwatch, legendSwatch, seriesColor(s))
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", chartW-plotR+38, y+10, s)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// chartAxes lists the Ns and the arms present, in cell order.
func (r *results) chartAxes() (ns []int, series []string) {
	seenS := map[string]bool{}
	for _, c := range r.Cells {
		if s := c.armID.String(); !seenS[s] {
			seenS[s] = true
			series = append(series, s)
		}
	}
	return cells(r.Cells).ns(), series
}

func (r *results) cell(series string, n int) *cellResult {
	for i := range r.Cells {
		if c := &r.Cells[i]; c.armID.String() == series && c.N == n {
			return c
		}
	}
	return nil
}
