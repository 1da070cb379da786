package critest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Scope says how much of the suite the runs covered.
type Scope int

const (
	// Full: the whole suite ran, so an allowed entry naming no spec of
	// either report is a stale or misspelt entry.
	Full Scope = iota
	// Subset: a focused part ran; entries for specs outside it are not
	// judged.
	Subset
)

// Verdict is what the comparison says of one spec.
type Verdict string

const (
	// Same: cocoon did as well as runc, or runc did not pass either.
	Same Verdict = ""
	// Allowed: runc passed, cocoon did not, and the list has it.
	Allowed Verdict = "allowed"
	// Shortfall: runc passed, cocoon did not, and the list lacks it.
	Shortfall Verdict = "shortfall: runc passes, cocoon does not, and the allowed list lacks it"
	// Fixed: the list has it but cocoon passes.
	Fixed Verdict = "fixed: cocoon passes, remove it from the allowed list"
	// Unknown: the list has it but no report names it.
	Unknown Verdict = "unknown: no spec of this name ran, fix or remove the entry"
)

// Row is one spec side by side.
type Row struct {
	Spec, Group   string
	Runc, Cocoon  Outcome
	CocoonMessage string
	Allowance     *Allowance
	Verdict       Verdict
}

// Comparison is every spec of both runs and every allowed entry, by name.
type Comparison struct {
	Rows         []Row
	Runc, Cocoon *Report
}

// Compare puts runc's and cocoon's reports side by side and judges each
// spec against the allowed list.
func Compare(runc, cocoon *Report, allowed map[string]Allowance, scope Scope) *Comparison {
	names := map[string]bool{}
	for _, r := range []*Report{runc, cocoon} {
		for name := range r.Specs {
			names[name] = true
		}
	}
	for name := range allowed {
		if scope == Full {
			names[name] = true
		}
	}
	c := &Comparison{Runc: runc, Cocoon: cocoon}
	for name := range names {
		row := Row{Spec: name, Group: group(name, runc, cocoon), Runc: runc.Specs[name], Cocoon: cocoon.Specs[name],
			CocoonMessage: cocoon.Messages[name]}
		if a, ok := allowed[name]; ok {
			row.Allowance = &a
		}
		row.Verdict = judge(row)
		c.Rows = append(c.Rows, row)
	}
	slices.SortFunc(c.Rows, func(a, b Row) int { return strings.Compare(a.Spec, b.Spec) })
	return c
}

func judge(r Row) Verdict {
	listed := r.Allowance != nil
	switch {
	case listed && r.Runc == Absent && r.Cocoon == Absent:
		return Unknown
	case listed && r.Cocoon == Pass && !r.Allowance.Intermittent:
		return Fixed
	case r.Runc != Pass || r.Cocoon == Pass:
		return Same
	case listed:
		return Allowed
	}
	return Shortfall
}

func group(name string, reports ...*Report) string {
	for _, r := range reports {
		if g, ok := r.Groups[name]; ok {
			return g
		}
	}
	return ""
}

// Err is nil when every shortfall is allowed and every entry is still
// needed; otherwise it names each spec that is not.
func (c *Comparison) Err() error {
	var errs []error
	for _, r := range c.Rows {
		switch r.Verdict {
		case Shortfall:
			errs = append(errs, fmt.Errorf("%s (cocoon: %s %s): %s", r.Spec, r.Cocoon, r.CocoonMessage, r.Verdict))
		case Fixed, Unknown:
			errs = append(errs, fmt.Errorf("%s: %s", r.Spec, r.Verdict))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("critest: cocoon against runc: %d to act on:\n%w", len(errs), errors.Join(errs...))
	}
	return nil
}
