package main

import (
	"math"
	"slices"
	"time"
)

// benchResults is what one `cocoonctl bench` run measured; it is written
// as bench/results/<date>.json.
type benchResults struct {
	Date         time.Time      `json:"date"`
	Machine      machineInfo    `json:"machine"`
	Snapshot     snapshotInfo   `json:"snapshot"`
	Rounds       int            `json:"rounds"`
	FirstRestore []firstRestore `json:"firstRestore"`
	Cells        []cellResult   `json:"cells"`
	ModeRatios   []modeRatio    `json:"modeRatios"`
	PathRatios   []pathRatio    `json:"pathRatios"`
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

// cellResult is one (path, mode, N) cell over every round.
type cellResult struct {
	Path     string  `json:"path"`
	Mode     string  `json:"mode"`
	N        int     `json:"n"`
	Samples  int     `json:"samples"`
	P50Ms    float64 `json:"p50Ms"` // create to process running, per clone
	P95Ms    float64 `json:"p95Ms"`
	WallMs   float64 `json:"wallMs"` // all N running; median over rounds
	PSSMiB   float64 `json:"pssMiBPerClone"`
	HeldMiB  float64 `json:"heldMiBPerClone"`     // PSS with a copy's whole memfd instead of its touched share
	GuestMiB float64 `json:"guestRamMiBPerClone"` // the guest RAM alone (see cloneMemory)
	// VMMP50Ms is the hypervisor's share of a restore (fill, spawn, load,
	// resume): what the restore mode changes, without the guest's own
	// work after resume.
	VMMP50Ms float64 `json:"vmmP50Ms"`
	// OutsideP50Ms is create-to-running minus every reported phase: on the
	// shim path starting the shim and the task RPCs through containerd.
	OutsideP50Ms float64     `json:"outsideP50Ms"`
	Phases       []phaseStat `json:"phases"` // restore report phases, median per clone
}

type phaseStat struct {
	Name  string  `json:"name"`
	P50Ms float64 `json:"p50Ms"`
}

// modeRatio compares copy with mmap on one path at one N.
type modeRatio struct {
	Path           string  `json:"path"`
	N              int     `json:"n"`
	CopyOverMmap   float64 `json:"p50CopyOverMmap"` // speed-up of mmap
	VMMCopyOverMap float64 `json:"vmmP50CopyOverMmap"`
	PSSMmapOverCpy float64 `json:"pssMmapOverCopy"`
	HeldMmapOverCp float64 `json:"heldMmapOverCopy"`
	RAMMmapOverCpy float64 `json:"guestRamMmapOverCopy"`
}

// pathRatio is the cost of going through containerd and the shim.
type pathRatio struct {
	Mode           string  `json:"mode"`
	N              int     `json:"n"`
	ShimOverDirect float64 `json:"p50ShimOverDirect"`
}

type cellKey struct {
	path, mode string
	n          int
}

// summarize folds the runs of one cell into its result.
func summarize(k cellKey, runs []cellRun) cellResult {
	var ready, walls, vmm, outside []time.Duration
	var pss, held, guest []float64
	phases := map[string][]time.Duration{}
	var order []string
	for _, r := range runs {
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
		Path: k.path, Mode: k.mode, N: k.n, Samples: len(ready),
		P50Ms: ms(percentile(ready, 0.5)), P95Ms: ms(percentile(ready, 0.95)),
		WallMs: ms(percentile(walls, 0.5)), VMMP50Ms: ms(percentile(vmm, 0.5)), OutsideP50Ms: ms(percentile(outside, 0.5)),
		PSSMiB: round1(medianFloat(pss)), HeldMiB: round1(medianFloat(held)), GuestMiB: round1(medianFloat(guest)),
	}
	for _, name := range order {
		c.Phases = append(c.Phases, phaseStat{Name: name, P50Ms: ms(percentile(phases[name], 0.5))})
	}
	return c
}

// vmmPhases are the restore phases the hypervisor spends before the guest
// runs again.
var vmmPhases = map[string]bool{"fill": true, "spawn": true, "load": true, "resume": true}

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

// ratios compares the cells: mmap against copy per path and N, and the
// shim against direct per mode and N.
func ratios(cells []cellResult) ([]modeRatio, []pathRatio) {
	find := func(path, mode string, n int) *cellResult {
		for i := range cells {
			if c := &cells[i]; c.Path == path && c.Mode == mode && c.N == n {
				return c
			}
		}
		return nil
	}
	var mr []modeRatio
	var pr []pathRatio
	for _, c := range cells {
		if m := find(c.Path, "mmap", c.N); c.Mode == "copy" && m != nil {
			mr = append(mr, modeRatio{Path: c.Path, N: c.N,
				CopyOverMmap: ratio(c.P50Ms, m.P50Ms), VMMCopyOverMap: ratio(c.VMMP50Ms, m.VMMP50Ms), PSSMmapOverCpy: ratio(m.PSSMiB, c.PSSMiB), HeldMmapOverCp: ratio(m.HeldMiB, c.HeldMiB),
				RAMMmapOverCpy: ratio(m.GuestMiB, c.GuestMiB)})
		}
		if d := find("direct", c.Mode, c.N); c.Path == "shim" && d != nil {
			pr = append(pr, pathRatio{Mode: c.Mode, N: c.N, ShimOverDirect: ratio(c.P50Ms, d.P50Ms)})
		}
	}
	return mr, pr
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

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return math.Round(a/b*100) / 100
}

func ms(d time.Duration) float64 { return round1(float64(d) / float64(time.Millisecond)) }

func round1(x float64) float64 { return math.Round(x*10) / 10 }
