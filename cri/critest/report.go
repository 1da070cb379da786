// Package critest compares two runs of critest (sigs.k8s.io/cri-tools'
// CRI validation suite) against one containerd, one per runtime handler:
// runc, the baseline, and cocoon. A spec runc passes that cocoon does not
// is a shortfall; each must be on the allowed list (the issue that will
// fix it and why), and a listed spec cocoon now passes must leave the
// list, so the list is the honest to-do list it claims to be.
//
//	runc, err := critest.ReadReport("runc.json")
//	cocoon, err := critest.ReadReport("cocoon.json")
//	allowed, err := critest.ReadAllowed("cri/critest/allowed.txt")
//	cmp := critest.Compare(runc, cocoon, allowed, critest.Full)
//	if err := cmp.Err(); err != nil { ... }
package critest

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// Outcome is what became of one spec in one run.
type Outcome string

const (
	Pass Outcome = "pass"
	Fail Outcome = "fail"
	Skip Outcome = "skip"
	// Absent: the spec is not in the run's report.
	Absent Outcome = ""
)

// Report is one critest run: each spec's outcome by its full name, its
// group (its outermost container, e.g. "[k8s.io] Security Context") and
// the failure message of each spec that failed.
type Report struct {
	Specs    map[string]Outcome
	Groups   map[string]string
	Messages map[string]string
}

// specReport is the part of ginkgo's JSON report (types.SpecReport) read.
type specReport struct {
	ContainerHierarchyTexts []string
	LeafNodeType            string
	LeafNodeText            string
	State                   string
	Failure                 struct{ Message string }
}

// ReadReport reads a ginkgo JSON report (critest --ginkgo.json-report).
func ReadReport(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read critest report: %w", err)
	}
	r, err := ParseReport(data)
	if err != nil {
		return nil, fmt.Errorf("critest report %s: %w", path, err)
	}
	return r, nil
}

// ParseReport parses a ginkgo JSON report: a list of suite reports, each
// with its spec reports. Only It nodes are specs; a suite-level node that
// failed (BeforeSuite, ...) is an error, as every spec then did not run.
func ParseReport(data []byte) (*Report, error) {
	var suites []struct {
		SuiteDescription string
		SpecReports      []specReport
	}
	if err := json.Unmarshal(data, &suites); err != nil {
		return nil, fmt.Errorf("parse ginkgo json report: %w", err)
	}
	r := &Report{Specs: map[string]Outcome{}, Groups: map[string]string{}, Messages: map[string]string{}}
	for _, suite := range suites {
		for _, s := range suite.SpecReports {
			out, err := outcome(s.State)
			if err != nil {
				return nil, err
			}
			if s.LeafNodeType != "It" {
				if out == Fail {
					return nil, fmt.Errorf("suite %q: %s %s: %s", suite.SuiteDescription, s.LeafNodeType, s.State, firstLine(s.Failure.Message))
				}
				continue
			}
			name := fullText(s)
			r.Specs[name] = out
			if len(s.ContainerHierarchyTexts) > 0 {
				r.Groups[name] = s.ContainerHierarchyTexts[0]
			}
			if out == Fail {
				r.Messages[name] = firstLine(s.Failure.Message)
			}
		}
	}
	if len(r.Specs) == 0 {
		return nil, fmt.Errorf("no specs in the report: want ginkgo's json report of a critest run")
	}
	return r, nil
}

// outcome maps ginkgo's spec states onto pass, fail and skip.
func outcome(state string) (Outcome, error) {
	switch state {
	case "passed":
		return Pass, nil
	case "skipped", "pending":
		return Skip, nil
	case "failed", "aborted", "panicked", "interrupted", "timedout":
		return Fail, nil
	}
	return Absent, fmt.Errorf("spec state %q: want one of ginkgo's (passed, skipped, failed, ...)", state)
}

// fullText is the spec's name as ginkgo prints it (types.SpecReport.FullText).
func fullText(s specReport) string {
	var texts []string
	for _, t := range append(s.ContainerHierarchyTexts, s.LeafNodeText) {
		if t != "" {
			texts = append(texts, t)
		}
	}
	return strings.Join(texts, " ")
}

// Count is how many specs of r ended in each outcome.
func (r *Report) Count() map[Outcome]int {
	n := map[Outcome]int{}
	for _, o := range r.Specs {
		n[o]++
	}
	return n
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	line, _, _ := strings.Cut(s, "\n")
	return line
}
