package critest

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// spec is a ginkgo spec report in a test's JSON report.
type spec struct{ containers, leaf, state, node string }

func reportJSON(t *testing.T, specs ...spec) []byte {
	t.Helper()
	var rs []map[string]any
	for _, s := range specs {
		node := s.node
		if node == "" {
			node = "It"
		}
		rs = append(rs, map[string]any{
			"ContainerHierarchyTexts": strings.Split(s.containers, "/"), "LeafNodeType": node,
			"LeafNodeText": s.leaf, "State": s.state, "Failure": map[string]any{"Message": "boom\nmore"},
		})
	}
	data, err := json.Marshal([]map[string]any{{"SuiteDescription": "CRI validation", "SpecReports": rs}})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func parse(t *testing.T, specs ...spec) *Report {
	t.Helper()
	r, err := ParseReport(reportJSON(t, specs...))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestParseReport(t *testing.T) {
	r := parse(t,
		spec{"[k8s.io] Container/runtime should support basic operations", "start [Conformance]", "passed", ""},
		spec{"[k8s.io] Security Context/NamespaceOption", "HostPID", "failed", ""},
		spec{"[k8s.io] Image", "pull", "timedout", ""},
		spec{"[k8s.io] Streaming", "attach", "skipped", ""},
		spec{"[k8s.io] Streaming", "later", "pending", ""},
		spec{"", "", "passed", "BeforeSuite"},
	)
	want := map[string]Outcome{
		"[k8s.io] Container runtime should support basic operations start [Conformance]": Pass,
		"[k8s.io] Security Context NamespaceOption HostPID":                              Fail,
		"[k8s.io] Image pull":       Fail,
		"[k8s.io] Streaming attach": Skip,
		"[k8s.io] Streaming later":  Skip,
	}
	if len(r.Specs) != len(want) {
		t.Fatalf("specs %v, want %v", r.Specs, want)
	}
	for name, o := range want {
		if r.Specs[name] != o {
			t.Errorf("%q: %q, want %q", name, r.Specs[name], o)
		}
	}
	if g := r.Groups["[k8s.io] Security Context NamespaceOption HostPID"]; g != "[k8s.io] Security Context" {
		t.Errorf("group %q, want the outermost container", g)
	}
	if m := r.Messages["[k8s.io] Image pull"]; m != "boom" {
		t.Errorf("message %q, want its first line", m)
	}
}

func TestParseReportRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"not json", []byte("<xml/>"), "parse ginkgo json report"},
		{"no specs", []byte(`[{"SuiteDescription":"x","SpecReports":[]}]`), "no specs"},
		{"odd state", reportJSON(t, spec{"a", "b", "weird", ""}), `spec state "weird"`},
		{"suite failed", reportJSON(t, spec{"", "", "failed", "BeforeSuite"}), "BeforeSuite failed: boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseReport(tc.data)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

func TestParseAllowed(t *testing.T) {
	a, err := ParseAllowed([]byte("# comment\n\n21 | [k8s.io] A b [Conformance] | one VM per container\n22 | x | y z\n~21 | racy | skips itself\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := a["[k8s.io] A b [Conformance]"]; got.Issue != 21 || got.Reason != "one VM per container" || got.Intermittent {
		t.Errorf("entry %+v, want issue 21 and its reason", got)
	}
	if got := a["racy"]; got.Issue != 21 || !got.Intermittent {
		t.Errorf("entry %+v, want issue 21, intermittent", got)
	}
	if a["x"].Issue != 22 || len(a) != 3 {
		t.Errorf("entries %v, want 3", a)
	}
	for _, tc := range []struct{ line, want string }{
		{"21 | spec", "2 fields"},
		{"21 | a | b | c", "4 fields"},
		{"x | spec | why", `issue "x"`},
		{"0 | spec | why", `issue "0"`},
		{"~ | spec | why", `issue "~"`},
		{"21 |  | why", "empty spec name"},
		{"21 | spec | why\n23 | spec | again", `line 2: spec "spec" listed twice`},
	} {
		if _, err := ParseAllowed([]byte(tc.line)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one saying %q", tc.line, err, tc.want)
		}
	}
}

func TestCompare(t *testing.T) {
	runc := &Report{Specs: map[string]Outcome{"a": Pass, "b": Pass, "c": Pass, "d": Fail, "e": Pass, "f": Pass, "g": Skip, "h": Pass, "i": Pass}}
	cocoon := &Report{Specs: map[string]Outcome{"a": Pass, "b": Fail, "c": Fail, "d": Fail, "e": Pass, "f": Skip, "g": Skip, "h": Pass, "i": Skip}}
	allowed := map[string]Allowance{
		"c": {Spec: "c", Issue: 21, Reason: "one VM per container"},
		"h": {Spec: "h", Issue: 21, Reason: "skips itself on a race", Intermittent: true},
		"i": {Spec: "i", Issue: 21, Reason: "skips itself on a race", Intermittent: true},
		"e": {Spec: "e", Issue: 22, Reason: "now passes"},
		"d": {Spec: "d", Issue: 23, Reason: "runc fails it too"},
		"z": {Spec: "z", Issue: 21, Reason: "misspelt"},
	}
	for _, tc := range []struct {
		scope Scope
		want  map[string]Verdict
	}{
		{Full, map[string]Verdict{"a": Same, "b": Shortfall, "c": Allowed, "d": Same, "e": Fixed, "f": Shortfall, "g": Same, "h": Same, "i": Allowed, "z": Unknown}},
		{Subset, map[string]Verdict{"a": Same, "b": Shortfall, "c": Allowed, "d": Same, "e": Fixed, "f": Shortfall, "g": Same, "h": Same, "i": Allowed}},
	} {
		cmp := Compare(runc, cocoon, allowed, tc.scope)
		got := map[string]Verdict{}
		for _, r := range cmp.Rows {
			got[r.Spec] = r.Verdict
		}
		if len(got) != len(tc.want) {
			t.Errorf("scope %d: rows %v, want %v", tc.scope, got, tc.want)
		}
		for name, v := range tc.want {
			if got[name] != v {
				t.Errorf("scope %d: %s: %q, want %q", tc.scope, name, got[name], v)
			}
		}
		err := cmp.Err()
		for _, name := range []string{"b (cocoon: fail", "f (cocoon: skip", "e: fixed"} {
			if err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("scope %d: error %v, want it to name %q", tc.scope, err, name)
			}
		}
	}
}

func TestCompareClean(t *testing.T) {
	runc := &Report{Specs: map[string]Outcome{"a": Pass, "b": Pass}}
	cocoon := &Report{Specs: map[string]Outcome{"a": Pass, "b": Fail}}
	cmp := Compare(runc, cocoon, map[string]Allowance{"b": {Spec: "b", Issue: 21, Reason: "r"}}, Full)
	if err := cmp.Err(); err != nil {
		t.Fatalf("every shortfall allowed: %v", err)
	}
}

func TestWriteMarkdown(t *testing.T) {
	runc := &Report{Specs: map[string]Outcome{"g1 a": Pass, "g1 b|c": Pass, "g2 d": Skip},
		Groups: map[string]string{"g1 a": "g1", "g1 b|c": "g1", "g2 d": "g2"}}
	cocoon := &Report{Specs: map[string]Outcome{"g1 a": Pass, "g1 b|c": Fail, "g2 d": Skip}, Groups: runc.Groups}
	cmp := Compare(runc, cocoon, map[string]Allowance{"g1 b|c": {Spec: "g1 b|c", Issue: 21, Reason: "one VM"}}, Full)
	var b bytes.Buffer
	if err := cmp.WriteMarkdown(&b, Run{Date: "2026-12-02"}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"runc     2 passed,   0 failed,   1 skipped",
		"cocoon   1 passed,   1 failed,   1 skipped",
		"| g1 | 2 | 2 | 1 | 1 #21 |",
		`| g1 b\|c | pass | fail | #21: one VM |`,
		"| g2 d | skip | skip |  |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, b.String())
		}
	}
}
