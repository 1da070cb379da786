package soak

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// Result is what a soak found.
type Result struct {
	Options  Options
	Started  time.Time
	Outcomes []Outcome
	// Wall is the restores' wall time, from the first to the last.
	Wall          time.Duration
	Before, After Census
	// Moved are the counts that did not come back.
	Moved []Moved
	// Teardown is what tearing the stack down left (devstack.Leftovers).
	Teardown []string
}

// Failures are the restores that failed, deliberate kills aside.
func (r *Result) Failures() []Outcome {
	var out []Outcome
	for _, o := range r.Outcomes {
		if o.Err != nil {
			out = append(out, o)
		}
	}
	return out
}

// Err says what went wrong: failed restores, counts that moved, and what
// the teardown left; nil for a clean soak.
func (r *Result) Err() error {
	var errs []error
	for _, o := range r.Failures() {
		errs = append(errs, fmt.Errorf("restore %s failed: %w", o.Plan, o.Err))
	}
	for _, m := range r.Moved {
		errs = append(errs, fmt.Errorf("leak: %s", m))
	}
	for _, l := range r.Teardown {
		errs = append(errs, fmt.Errorf("teardown left %s", l))
	}
	return errors.Join(errs...)
}

// Markdown is the summary: the mix, the kills, the failures, the timings
// and every count before and after.
func (r *Result) Markdown() string {
	var b strings.Builder
	o := r.Options
	fmt.Fprintf(&b, "## Soak, %s\n\n", r.Started.UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "%d restores through containerd v2.4.2 + cocoon-snapshotter + the cocoon shim + QEMU, %d at a time (seed %d): %s.\n\n",
		len(r.Outcomes), o.Parallel, o.Seed, r.mix())
	ok, killed, failed := r.tally()
	fmt.Fprintf(&b, "| restores | completed and checked | killed on purpose | failed | wall | per restore p50 / p95 |\n|---|---|---|---|---|---|\n")
	p50, p95 := r.percentiles()
	fmt.Fprintf(&b, "| %d | %d | %d | %d | %s | %s / %s |\n\n", len(r.Outcomes), ok, killed, failed,
		r.Wall.Round(time.Second), p50.Round(10*time.Millisecond), p95.Round(10*time.Millisecond))
	b.WriteString(r.killTable())
	b.WriteString("\n| count | before | after |\n|---|---|---|\n")
	for _, c := range r.After {
		before, _ := r.Before.Get(c.Name)
		mark := ""
		if before.Value != c.Value {
			mark = " **moved**"
		}
		fmt.Fprintf(&b, "| %s | %d | %d%s |\n", c.Name, before.Value, c.Value, mark)
	}
	return b.String()
}

// mix describes the plans' modes, images and networks.
func (r *Result) mix() string {
	counts := map[string]int{}
	for _, o := range r.Outcomes {
		p := o.Plan
		counts["mode "+string(p.Mode)]++
		counts["image "+string(p.Image)]++
		counts["net "+string(p.Net)]++
		if p.Exec {
			counts["exec"]++
		}
		if p.Hostile != "" {
			counts["hostile "+string(p.Hostile)]++
		}
		if p.Pod {
			counts["pod"]++
		}
	}
	part := func(label string, keys ...string) string {
		var parts []string
		for _, k := range keys {
			if n := counts[k]; n > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", n, k[strings.IndexByte(k, ' ')+1:]))
			}
		}
		return label + " " + strings.Join(parts, ", ")
	}
	return strings.Join([]string{
		part("mode", "mode "+string(hypervisor.ModeCopy), "mode "+string(hypervisor.ModeMmap)),
		part("image", "image "+string(ImageChain), "image "+string(ImageOrdinary)) + " (busybox on the base snapshot)",
		part("network", "net "+string(NetHost), "net "+string(NetNew), "net "+string(NetPair)) +
			" (host: none; new: ctr's default, a namespace the shim makes; veth: a namespace the soak made with a veth to a peer namespace, which the guest pings)",
		fmt.Sprintf("%d with an exec", counts["exec"]),
		fmt.Sprintf("%d pods (a sandbox whose task restores the pod's VM with a pod base snapshot's disk slots, %d busybox containers joining it, one killed and a new one joining in its place, one running an exec)", counts["pod"], podMembers),
		part("hostile", hostileKeys()...) + " (fifo-bind, nfs, fifo-netns: refused at create, naming the input; links: a bind whose links point out of it, nothing outside reaches the guest; empty-dir: mounted and written)",
	}, "; ")
}

func hostileKeys() []string {
	keys := make([]string, len(hostileKinds))
	for i, h := range hostileKinds {
		keys[i] = "hostile " + string(h)
	}
	return keys
}

// tally counts restores that completed, that were killed and that failed.
func (r *Result) tally() (ok, killed, failed int) {
	for _, o := range r.Outcomes {
		switch {
		case o.Err != nil:
			failed++
		case o.Plan.Kill != nil:
			killed++
		default:
			ok++
		}
	}
	return ok, killed, failed
}

// killTable lists the deliberate kills by kind and point: planned, and how
// many hit their target.
func (r *Result) killTable() string {
	type cell struct{ planned, hit int }
	cells := map[KillKind]map[KillPoint]*cell{}
	for _, k := range killKinds {
		cells[k] = map[KillPoint]*cell{}
		for _, p := range killPoints {
			cells[k][p] = &cell{}
		}
	}
	for _, o := range r.Outcomes {
		if k := o.Plan.Kill; k != nil {
			c := cells[k.Kind][k.Point]
			c.planned++
			if o.Killed {
				c.hit++
			}
		}
	}
	var b strings.Builder
	b.WriteString("| kill (SIGKILL) | during create | after start | during exec |\n|---|---|---|---|\n")
	for _, k := range killKinds {
		fmt.Fprintf(&b, "| %s |", k)
		for _, p := range killPoints {
			c := cells[k][p]
			fmt.Fprintf(&b, " %d (%d hit) |", c.planned, c.hit)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func (r *Result) percentiles() (p50, p95 time.Duration) {
	var ds []time.Duration
	for _, o := range r.Outcomes {
		if o.Plan.Kill == nil && !o.Plan.Hostile.refused() && o.Err == nil {
			ds = append(ds, o.Took)
		}
	}
	if len(ds) == 0 {
		return 0, 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2], ds[min(len(ds)-1, len(ds)*95/100)]
}

// slowRestore is a restore's time worth a line of progress.
const slowRestore = 30 * time.Second

// progress prints a line every tenth of the restores, and every failure.
type progress struct {
	w                  io.Writer
	total, done, fails int
	start              time.Time
}

func newProgress(w io.Writer, total int) *progress {
	return &progress{w: w, total: total, start: time.Now()}
}

func (p *progress) add(o Outcome) {
	p.done++
	if o.Err != nil {
		p.fails++
	}
	if p.w == nil {
		return
	}
	switch {
	case o.Err != nil:
		fmt.Fprintf(p.w, "soak: restore %s failed: %v\n", o.Plan, o.Err)
	case o.Took > slowRestore:
		steps := make([]string, 0, len(o.Steps))
		for _, s := range o.Steps {
			steps = append(steps, fmt.Sprintf("%s %s", s.Name, s.Took.Round(10*time.Millisecond)))
		}
		fmt.Fprintf(p.w, "soak: restore %s took %s: %s (kill: %v)\n", o.Plan, o.Took.Round(time.Second), strings.Join(steps, ", "), o.KillErr)
	}
	if step := max(p.total/10, 1); p.done%step == 0 || p.done == p.total {
		fmt.Fprintf(p.w, "soak: %d/%d restores, %d failed, %s\n", p.done, p.total, p.fails, time.Since(p.start).Round(time.Second))
	}
}
