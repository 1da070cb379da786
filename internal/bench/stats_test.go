package bench

import (
	"encoding/xml"
	"strings"
	"testing"
	"time"
)

func d(msec int) time.Duration { return time.Duration(msec) * time.Millisecond }

func TestSummarize(t *testing.T) {
	copyRun := cellRun{ready: []time.Duration{d(400), d(100), d(300), d(200)}, wall: d(450),
		mem: []cloneMemory{{pss: 2048, held: 4096, guest: 3072}, {pss: 2048, held: 4096, guest: 1024}}}
	mmapRun := cellRun{ready: []time.Duration{d(100), d(100)}, wall: d(120),
		mem: []cloneMemory{{pss: 512, held: 512, guest: 512}, {pss: 512, held: 512, guest: 512}},
		phases: [][]phase{
			{{"spawn", d(10)}, {"agent", d(50)}, {"process started", d(20)}},
			{{"spawn", d(30)}, {"agent", d(40)}, {"process started", d(10)}},
		}}
	c := summarize(cellKey{armID{Path: PathDirect, Mode: "copy"}, 4}, []cellRun{copyRun})
	if c.P50Ms != 200 || c.P95Ms != 400 || c.WallMs != 450 || c.PSSMiB != 2 || c.HeldMiB != 4 || c.GuestMiB != 2 || c.Samples != 4 {
		t.Errorf("copy cell = %+v, want p50 200 p95 400 wall 450 pss 2 held 4 guest 2 samples 4", c)
	}
	m := summarize(cellKey{armID{Path: PathDirect, Mode: "mmap"}, 4}, []cellRun{mmapRun})
	if m.VMMP50Ms != 10 || m.OutsideP50Ms != 20 || m.GuestP50Ms != 50 {
		t.Errorf("mmap cell vmm %v ms, outside %v ms, guest %v ms: want 10, 100-80 and 40+10 (sum of medians)", m.VMMP50Ms, m.OutsideP50Ms, m.GuestP50Ms)
	}
	if ps := m.Phases; len(ps) != 3 || ps[0].Name != "spawn" || ps[0].P50Ms != 10 || ps[1].P50Ms != 40 {
		t.Errorf("mmap phases = %+v, want spawn 10, agent 40 (nearest-rank p50), process started", ps)
	}
	if p := m.phase("agent"); p == nil || *p != 40 {
		t.Errorf("phase(agent) = %v, want 40", p)
	}
	if p := m.phase("network"); p != nil {
		t.Errorf("phase(network) = %v, want none", *p)
	}
}

// cell is a summarized cell of n clones of arm, all ready after p50 ms,
// with phases (ms each).
func cell(a armID, n, p50 int, phases ...phase) cellResult {
	run := cellRun{wall: d(p50), mem: []cloneMemory{{pss: 1024, held: 1024, guest: 1024}}}
	for range n {
		run.ready = append(run.ready, d(p50))
		run.phases = append(run.phases, phases)
	}
	return summarize(cellKey{a, n}, []cellRun{run})
}

func TestFillRatios(t *testing.T) {
	r := &results{Cells: []cellResult{
		cell(armID{Path: PathDirect, Mode: "copy"}, 1, 400),
		cell(armID{Path: PathDirect, Mode: "mmap"}, 1, 200),
		cell(armID{Path: PathShim, Mode: "mmap"}, 1, 300, phase{"network", d(2)}),
		cell(armID{Path: PathRunc}, 1, 100),
		cell(armID{Path: PathCold}, 1, 3000),
		cell(armID{Path: PathShim, Mode: "mmap", Variant: VariantNetwork}, 1, 330, phase{"network", d(5)}),
		cell(armID{Path: PathShim, Mode: "mmap", Variant: VariantOrdinary}, 1, 450),
	}}
	r.fillRatios()
	if len(r.ModeRatios) != 1 || r.ModeRatios[0].CopyOverMmap != 2 {
		t.Errorf("mode ratios = %+v, want direct copy ÷ mmap 2", r.ModeRatios)
	}
	if len(r.PathRatios) != 1 || r.PathRatios[0].ShimOverDirect != 1.5 {
		t.Errorf("path ratios = %+v, want shim ÷ direct mmap 1.5", r.PathRatios)
	}
	want := alternative{N: 1, MmapOverRunc: 3, ColdOverMmap: 15, ColdOverCopy: 7.5}
	if len(r.Alternatives) != 1 || r.Alternatives[0] != want {
		t.Errorf("alternatives = %+v, want %+v (no shim copy cell: no copy ÷ runc)", r.Alternatives, want)
	}
	if len(r.Network) != 1 || r.Network[0].P50OverBase != 1.1 || *r.Network[0].BasePhaseP50Ms != 2 || *r.Network[0].PhaseP50Ms != 5 {
		t.Errorf("network = %+v, want 1.1× with network phases 2 and 5", r.Network)
	}
	if len(r.Ordinary) != 1 || r.Ordinary[0].P50OverBase != 1.5 || r.Ordinary[0].PhaseP50Ms != nil {
		t.Errorf("ordinary = %+v, want 1.5× and no plan phase", r.Ordinary)
	}
	md := r.markdown("chart.svg")
	for _, s := range []string{"| 1 | runc |", "| 1 | 100 / 100 | 300 / 300 | – | 3000 / 3000 | 3.00× | – | 15.00× | 7.50× |", "| 1 | 300 | 330 | 1.10× | 2.0 / 5.0 |", "![create-to-running p50 per clone](chart.svg)"} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q:\n%s", s, md)
		}
	}
	if err := xml.Unmarshal([]byte(r.svg()), new(struct{})); err != nil {
		t.Errorf("chart is not well-formed XML: %v", err)
	}
}

func TestLogAxis(t *testing.T) {
	a := newLogAxis([]cellResult{{P50Ms: 120}, {P50Ms: 3500}}, 300)
	if a.lo != 100 || a.hi != 10000 {
		t.Fatalf("axis %v..%v, want 100..10000", a.lo, a.hi)
	}
	for _, tt := range []struct{ v, want float64 }{{100, 0}, {50, 0}, {1000, 150}, {10000, 300}} {
		if got := a.at(tt.v); got != tt.want {
			t.Errorf("at(%v) = %v, want %v", tt.v, got, tt.want)
		}
	}
}

// TestBaselineRatios: a baseline cell is compared with the shim cell of
// its mode and N, guest phases and outside time included.
func TestBaselineRatios(t *testing.T) {
	guest := func(agent, init, started int) []phase {
		return []phase{{"spawn", d(20)}, {"agent", d(agent)}, {"init", d(init)}, {"process started", d(started)}}
	}
	r := &results{Baseline: "1d6573d", Cells: []cellResult{
		cell(armID{Path: PathShim, Mode: "mmap"}, 1, 200, guest(20, 40, 40)...),
		cell(armID{Path: PathShim, Mode: "mmap", Variant: VariantBaseline}, 1, 320, guest(50, 60, 90)...),
		cell(armID{Path: PathShim, Mode: "copy", Variant: VariantBaseline}, 1, 400, guest(50, 60, 90)...),
	}}
	r.fillRatios()
	want := baselineRatio{N: 1, Mode: "mmap", BaselineGuestP50Ms: 200, GuestP50Ms: 100, GuestOverBaseline: 0.5,
		BaselineP50Ms: 320, P50Ms: 200, P50OverBaseline: 0.63, BaselineOutsideP50Ms: 100, OutsideP50Ms: 80}
	if len(r.Baselines) != 1 || r.Baselines[0] != want {
		t.Errorf("baselines = %+v, want only %+v (no shim copy cell to compare with)", r.Baselines, want)
	}
	md := r.markdown("")
	for _, s := range []string{"Against the baseline (1d6573d)", "| 1 | mmap | 200 / 100 | 0.50× | 320 / 200 | 0.63× | 100 / 80 |", "| 1 | shim mmap baseline |"} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q:\n%s", s, md)
		}
	}
}

// TestTeardownTable: the whole start's end is split for the arms whose
// runs had the task's exit and delete, and only for them.
func TestTeardownTable(t *testing.T) {
	r := &results{Whole: []WholeRow{
		{Arm: WholeSnapshot, Runs: 5, TotalMs: 500, PhaseMs: []float64{50, 250, 60, 120, 20}, TeardownRuns: 5, TeardownMs: []float64{80, 20, 20}},
		{Arm: WholeRunc, Runs: 5, TotalMs: 280, PhaseMs: []float64{50, 110, 20, 80, 20}},
	}}
	var b strings.Builder
	r.wholeTable(&b)
	got := b.String()
	if !strings.Contains(got, "| arm | runs | process | task delete | container delete |") || !strings.Contains(got, "| "+WholeSnapshot+" | 5 of 5 | 80 | 20 | 20 |") {
		t.Errorf("no teardown split for %s in:\n%s", WholeSnapshot, got)
	}
	if strings.Contains(got, "| "+WholeRunc+" | 0 of") {
		t.Errorf("a teardown split for %s, whose runs had no exit and delete:\n%s", WholeRunc, got)
	}
}
