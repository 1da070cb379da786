package main

import (
	"fmt"
	"math"
	"strings"
)

// Chart geometry, in SVG user units.
const (
	chartW, chartH         = 760, 380
	plotL, plotR           = 70, 180
	plotT, plotB           = 40, 50
	barGap, groupGap       = 2, 24
	chartFont              = `font-family="sans-serif" font-size="12"`
	chartTitle             = "create to running, p50 per clone (ms)"
	gridLines              = 5
	legendSwatch, legendDY = 12, 18
)

// seriesColors by path and mode: copy warm, mmap cool; the shim darker.
var seriesColors = map[string]string{
	"direct copy": "#f4a261", "shim copy": "#c2571a",
	"direct mmap": "#76b7e5", "shim mmap": "#1f5f99",
}

// seriesColor is the series' color; grey for a mode without one.
func seriesColor(series string) string {
	if c, ok := seriesColors[series]; ok {
		return c
	}
	return "#999"
}

// svg is a grouped bar chart: one group per N, one bar per path and mode.
func (r *benchResults) svg() string {
	ns, series := r.chartAxes()
	maxMs := 0.0
	for _, c := range r.Cells {
		maxMs = math.Max(maxMs, c.P50Ms)
	}
	top := niceCeil(maxMs)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" %s>`+"\n", chartW, chartH, chartW, chartH, chartFont)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="14">%s</text>`+"\n", plotL, chartTitle)
	plotW, plotH := float64(chartW-plotL-plotR), float64(chartH-plotT-plotB)
	for i := 0; i <= gridLines; i++ {
		v := top * float64(i) / gridLines
		y := float64(plotT) + plotH - plotH*float64(i)/gridLines
		fmt.Fprintf(&b, `<line x1="%d" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", plotL, float64(plotL)+plotW, y, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%.0f</text>`+"\n", plotL-6, y+4, v)
	}
	groupW := plotW / float64(len(ns))
	barW := (groupW - groupGap) / float64(max(len(series), 1))
	for gi, n := range ns {
		x0 := float64(plotL) + float64(gi)*groupW + groupGap/2
		for si, s := range series {
			c := r.cell(s, n)
			if c == nil {
				continue
			}
			h := plotH * c.P50Ms / top
			x, y := x0+float64(si)*barW, float64(plotT)+plotH-h
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s N=%d: %.0f ms</title></rect>`+"\n",
				x, y, barW-barGap, h, seriesColor(s), s, n, c.P50Ms)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10">%.0f</text>`+"\n", x+(barW-barGap)/2, y-3, c.P50Ms)
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

// chartAxes lists the Ns and the "path mode" series present, in cell order.
func (r *benchResults) chartAxes() (ns []int, series []string) {
	seenN, seenS := map[int]bool{}, map[string]bool{}
	for _, c := range r.Cells {
		if !seenN[c.N] {
			seenN[c.N] = true
			ns = append(ns, c.N)
		}
		if s := c.Path + " " + c.Mode; !seenS[s] {
			seenS[s] = true
			series = append(series, s)
		}
	}
	return ns, series
}

func (r *benchResults) cell(series string, n int) *cellResult {
	for i := range r.Cells {
		if c := &r.Cells[i]; c.Path+" "+c.Mode == series && c.N == n {
			return c
		}
	}
	return nil
}

// niceCeil rounds x up to 1, 2 or 5 times a power of ten.
func niceCeil(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}
