package bench

import (
	"math"
	"slices"
	"strings"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/restore"
)

// results is what one run measured; it is written as
// bench/results/<date>.json.
type results struct {
	Date         time.Time      `json:"date"`
	Machine      machineInfo    `json:"machine"`
	Snapshot     snapshotInfo   `json:"snapshot"`
	Rounds       int            `json:"rounds"`
	Load         loadInfo       `json:"load"`
	FirstRestore []firstRestore `json:"firstRestore"`
	Conversions  []Conversion   `json:"conversions,omitempty"`
	Cells        []cellResult   `json:"cells"`
	ModeRatios   []modeRatio    `json:"modeRatios"`
	PathRatios   []pathRatio    `json:"pathRatios"`
	Alternatives []alternative  `json:"alternatives,omitempty"`
	Network      []variantRatio `json:"network,omitempty"`
	Ordinary     []variantRatio `json:"ordinary,omitempty"`
	Pooled       []pooledRatio  `json:"pooled,omitempty"`
	PooledSpares int            `json:"pooledSpares,omitempty"` // shim.spares of the pooled set
	PoolCosts    []poolCost     `json:"poolCosts,omitempty"`
	Whole        []WholeRow     `json:"whole,omitempty"`
	Pull         *PullResult    `json:"pull,omitempty"`
	// Baseline names the build the baseline arms ran (Options.Baseline);
	// Baselines compare this build with it.
	Baseline  string          `json:"baseline,omitempty"`
	Baselines []baselineRatio `json:"baselines,omitempty"`
}

// loadInfo is the machine's 1-minute load average when the run began and
// when it ended.
type loadInfo struct {
	Start float64 `json:"start"`
	End   float64 `json:"end"`
}

type snapshotInfo struct {
	Ref         string `json:"ref"`
	MemoryBytes int64  `json:"memoryBytes"`
	DataBytes   int64  `json:"dataBytes"` // non-zero guest memory in the link
}

// firstRestore is the cost of staging a chain the node has never
// flattened (first) against staging it again from the flat cache (warm).
type firstRestore struct {
	Path    string  `json:"path"`
	FirstMs float64 `json:"firstPrepareMs"`
	WarmMs  float64 `json:"warmPrepareMs"`
}

// cellResult is one (arm, N) cell over every round.
type cellResult struct {
	armID
	N       int `json:"n"`
	Samples int `json:"samples"`
	// Failed counts the clones that did not start (not in the samples);
	// Errors are their distinct errors, the first few.
	Failed   int      `json:"failed"`
	Errors   []string `json:"errors,omitempty"`
	P50Ms    float64  `json:"p50Ms"` // create to process running, per clone
	P95Ms    float64  `json:"p95Ms"`
	WallMs   float64  `json:"wallMs"` // all N running; median over rounds
	PSSMiB   float64  `json:"pssMiBPerClone"`
	HeldMiB  float64  `json:"heldMiBPerClone"`     // PSS with a copy's whole memfd instead of its touched share
	GuestMiB float64  `json:"guestRamMiBPerClone"` // the guest RAM alone (see cloneMemory)
	// VMMP50Ms is the hypervisor's share (fill, spawn, load, resume, or a
	// cold boot's start): what the restore mode changes, without the
	// guest's own work after resume.
	VMMP50Ms float64 `json:"vmmP50Ms"`
	// GuestP50Ms is the guest's side: agent + init + process started, the
	// sum of their medians.
	GuestP50Ms float64 `json:"guestP50Ms"`
	// OutsideP50Ms is create-to-running minus every reported phase: on the
	// shim path starting the shim and the task RPCs through containerd.
	OutsideP50Ms float64     `json:"outsideP50Ms"`
	Phases       []phaseStat `json:"phases"` // median per clone
	// Claimed counts the clones whose create claimed a pooled VM.
	Claimed int `json:"claimed,omitempty"`
}

type phaseStat struct {
	Name  string  `json:"name"`
	P50Ms float64 `json:"p50Ms"`
}

// phase returns the median of phase name, nil if the cell has none.
func (c *cellResult) phase(name string) *float64 {
	for _, p := range c.Phases {
		if p.Name == name {
			return &p.P50Ms
		}
	}
	return nil
}

type cellKey struct {
	arm armID
	n   int
}

// summarize folds the runs of one cell into its result.
func summarize(k cellKey, runs []cellRun) cellResult {
	var ready, walls, vmm, outside []time.Duration
	var pss, held, guest []float64
	phases := map[string][]time.Duration{}
	var order []string
	var failed []error
	claims := 0
	for _, r := range runs {
		claims += claimed(r)
		failed = append(failed, r.failed...)
		ready = append(ready, r.ready...)
		walls = append(walls, r.wall)
		m := meanMemory(r.mem)
		pss, held, guest = append(pss, m.pss), append(held, m.held), append(guest, m.guest)
		for i, ps := range r.phases {
			v, o := splitClone(r.ready[i], ps)
			vmm, outside = append(vmm, v), append(outside, o)
			for _, p := range ps {
				if _, ok := phases[p.Name]; !ok {
					order = append(order, p.Name)
				}
				phases[p.Name] = append(phases[p.Name], p.Duration)
			}
		}
	}
	c := cellResult{
		armID: k.arm, N: k.n, Samples: len(ready),
		P50Ms: ms(percentile(ready, 0.5)), P95Ms: ms(percentile(ready, 0.95)),
		WallMs: ms(percentile(walls, 0.5)), VMMP50Ms: ms(percentile(vmm, 0.5)), OutsideP50Ms: ms(percentile(outside, 0.5)),
		PSSMiB: round1(medianFloat(pss)), HeldMiB: round1(medianFloat(held)), GuestMiB: round1(medianFloat(guest)),
		Failed: len(failed), Errors: distinctErrors(failed), Claimed: claims,
	}
	for _, name := range order {
		p := phaseStat{Name: name, P50Ms: ms(percentile(phases[name], 0.5))}
		c.Phases = append(c.Phases, p)
		if guestWork(name) {
			c.GuestP50Ms = round1(c.GuestP50Ms + p.P50Ms)
		}
	}
	return c
}

// maxErrors bounds the errors a cell keeps.
const maxErrors = 3

func distinctErrors(errs []error) []string {
	var msgs []string
	for _, err := range errs {
		if m := err.Error(); len(msgs) < maxErrors && !slices.Contains(msgs, m) {
			msgs = append(msgs, m)
		}
	}
	return msgs
}

// vmmPhases are the phases the hypervisor spends before the guest runs
// (again).
var vmmPhases = map[string]bool{"fill": true, "spawn": true, "load": true, restore.PhaseResume: true, phaseBoot: true}

// guestPhases are the guest's work once it runs: its agent answering (for
// a cold boot, the whole kernel boot too), the identity call and the
// process start.
var guestPhases = map[string]bool{restore.PhaseAgent: true, restore.PhaseInit: true, phaseStarted: true}

// guestWork says whether phase name is the guest's work: one of
// guestPhases, or a step the guest timed itself.
func guestWork(name string) bool {
	return guestPhases[name] || strings.HasPrefix(name, restore.GuestPhasePrefix)
}

// splitClone splits one clone's create-to-running time: the hypervisor's
// phases, and what no phase covers.
func splitClone(ready time.Duration, phases []phase) (vmm, outside time.Duration) {
	outside = ready
	for _, p := range phases {
		if vmmPhases[p.Name] {
			vmm += p.Duration
		}
		outside -= p.Duration
	}
	return vmm, max(outside, 0)
}

// percentile is the nearest-rank percentile p of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(i, 0)]
}

func medianFloat(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// memoryMiB is the mean memory of a cell run's clones, in MiB.
type memoryMiB struct{ pss, held, guest float64 }

func meanMemory(ms []cloneMemory) memoryMiB {
	if len(ms) == 0 {
		return memoryMiB{}
	}
	var sum cloneMemory
	for _, m := range ms {
		sum.pss += m.pss
		sum.held += m.held
		sum.guest += m.guest
	}
	n := float64(len(ms)) * 1024
	return memoryMiB{float64(sum.pss) / n, float64(sum.held) / n, float64(sum.guest) / n}
}

func ms(d time.Duration) float64 { return round1(float64(d) / float64(time.Millisecond)) }

func round1(x float64) float64 { return math.Round(x*10) / 10 }
