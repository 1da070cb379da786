package critest

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
)

// Run says how the runs were made, for the written result.
type Run struct {
	Date                 string
	Scope                Scope
	RuncWall, CocoonWall time.Duration
}

// Summary is the counts per handler on two lines, and the shortfalls.
func (c *Comparison) Summary(run Run) string {
	var b strings.Builder
	for _, h := range []struct {
		name string
		r    *Report
		wall time.Duration
	}{{"runc", c.Runc, run.RuncWall}, {"cocoon", c.Cocoon, run.CocoonWall}} {
		n := h.r.Count()
		fmt.Fprintf(&b, "%-6s %3d passed, %3d failed, %3d skipped in %s\n", h.name, n[Pass], n[Fail], n[Skip], h.wall.Round(time.Second))
	}
	v := c.verdicts()
	fmt.Fprintf(&b, "runc passes, cocoon does not: %d allowed, %d not on the list; %d listed fixed, %d listed unknown\n",
		v[Allowed], v[Shortfall], v[Fixed], v[Unknown])
	return b.String()
}

func (c *Comparison) verdicts() map[Verdict]int {
	n := map[Verdict]int{}
	for _, r := range c.Rows {
		n[r.Verdict]++
	}
	return n
}

// WriteMarkdown writes the result: counts and wall time per handler,
// what cocoon lacks by group and issue, then every spec side by side.
func (c *Comparison) WriteMarkdown(w io.Writer, run Run) error {
	scope := "the whole suite"
	if run.Scope == Subset {
		scope = "a subset of the suite"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# critest v1.37.0: runc and cocoon side by side (%s)\n\n", run.Date)
	fmt.Fprintf(&b, "containerd 2.4.2's CRI, %s per handler; `make critest` writes this file.\n\n```\n%s```\n\n", scope, c.Summary(run))
	c.writeGroups(&b)
	b.WriteString("\n## Every spec\n\n| spec | runc | cocoon | note |\n|---|---|---|---|\n")
	for _, r := range c.Rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", cell(r.Spec), show(r.Runc), show(r.Cocoon), cell(note(r)))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeGroups tables, per group, each handler's passes and the specs
// runc passes that cocoon does not, by the issue listed for them.
func (c *Comparison) writeGroups(b *strings.Builder) {
	type counts struct {
		runc, cocoon, total int
		lacking             map[string]int
	}
	groups := map[string]*counts{}
	for _, r := range c.Rows {
		g := groups[r.Group]
		if g == nil {
			g = &counts{lacking: map[string]int{}}
			groups[r.Group] = g
		}
		g.total++
		if r.Runc == Pass {
			g.runc++
		}
		if r.Cocoon == Pass {
			g.cocoon++
		}
		switch r.Verdict {
		case Allowed:
			g.lacking[fmt.Sprintf("#%d", r.Allowance.Issue)]++
		case Shortfall:
			g.lacking["not listed"]++
		}
	}
	b.WriteString("| group | specs | runc passes | cocoon passes | runc passes, cocoon not (by issue) |\n|---|---|---|---|---|\n")
	for _, name := range slices.Sorted(maps.Keys(groups)) {
		g := groups[name]
		var lacking []string
		for _, k := range slices.Sorted(maps.Keys(g.lacking)) {
			lacking = append(lacking, fmt.Sprintf("%d %s", g.lacking[k], k))
		}
		fmt.Fprintf(b, "| %s | %d | %d | %d | %s |\n", cell(name), g.total, g.runc, g.cocoon, strings.Join(lacking, ", "))
	}
}

func note(r Row) string {
	switch r.Verdict {
	case Allowed:
		return fmt.Sprintf("#%d: %s", r.Allowance.Issue, r.Allowance.Reason)
	case Same:
		return ""
	}
	return string(r.Verdict)
}

func show(o Outcome) string {
	if o == Absent {
		return "-"
	}
	return string(o)
}

// cell keeps a table cell on one line and its pipes literal.
func cell(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "\n", " "), "|", `\|`)
}
