package bench

import (
	"math"
	"slices"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/vm"
)

// The modes the comparisons name, as cells record them.
const (
	mmap     = string(hypervisor.ModeMmap)
	copyMode = string(hypervisor.ModeCopy)
)

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

// alternative puts cocoon beside runc and a cold boot at one N. cocoon is
// the shim path against runc (both through containerd), and the direct
// path against a cold boot (neither through containerd, both on the QEMU
// driver). A ratio is 0 when a cell it needs did not run.
type alternative struct {
	N            int     `json:"n"`
	MmapOverRunc float64 `json:"p50ShimMmapOverRunc"`
	CopyOverRunc float64 `json:"p50ShimCopyOverRunc"`
	ColdOverMmap float64 `json:"p50ColdOverDirectMmap"`
	ColdOverCopy float64 `json:"p50ColdOverDirectCopy"`
}

// variantRatio compares a variant of shim mmap (network, ordinary) with
// plain shim mmap at one N, and the phase the variant changes most.
type variantRatio struct {
	N           int     `json:"n"`
	BaseP50Ms   float64 `json:"baseP50Ms"`
	P50Ms       float64 `json:"p50Ms"`
	P50OverBase float64 `json:"p50OverBase"`
	// Phase's medians are nil in a cell that has no such phase.
	Phase          string   `json:"phase"`
	BasePhaseP50Ms *float64 `json:"basePhaseP50Ms,omitempty"`
	PhaseP50Ms     *float64 `json:"phaseP50Ms,omitempty"`
	BaseGuestP50Ms float64  `json:"baseGuestP50Ms"`
	GuestP50Ms     float64  `json:"guestP50Ms"`
}

// variantPhase is the report phase each variant adds to or changes: the
// tap's connection to the namespace's interface, and the staging of the
// base snapshot an ordinary image runs on.
var variantPhase = map[string]string{VariantNetwork: vm.PhaseNetwork, VariantOrdinary: vm.PhaseBase}

// cells finds cells by arm and N.
type cells []cellResult

func (cs cells) find(a armID, n int) *cellResult {
	i := slices.IndexFunc(cs, func(c cellResult) bool { return c.armID == a && c.N == n })
	if i < 0 {
		return nil
	}
	return &cs[i]
}

// ns lists the counts the cells ran at, in order.
func (cs cells) ns() []int {
	var ns []int
	for _, c := range cs {
		if !slices.Contains(ns, c.N) {
			ns = append(ns, c.N)
		}
	}
	return ns
}

// fillRatios compares the cells: mmap against copy per path and N, the
// shim against direct per mode and N, cocoon against runc and a cold boot
// per N, and each shim variant against plain shim mmap.
func (r *results) fillRatios() {
	cs := cells(r.Cells)
	for _, c := range cs {
		if c.Variant != "" {
			continue
		}
		if m := cs.find(armID{Path: c.Path, Mode: mmap}, c.N); c.Mode == copyMode && m != nil {
			r.ModeRatios = append(r.ModeRatios, modeRatio{Path: c.Path, N: c.N,
				CopyOverMmap: ratio(c.P50Ms, m.P50Ms), VMMCopyOverMap: ratio(c.VMMP50Ms, m.VMMP50Ms), PSSMmapOverCpy: ratio(m.PSSMiB, c.PSSMiB),
				HeldMmapOverCp: ratio(m.HeldMiB, c.HeldMiB), RAMMmapOverCpy: ratio(m.GuestMiB, c.GuestMiB)})
		}
		if d := cs.find(armID{Path: PathDirect, Mode: c.Mode}, c.N); c.Path == PathShim && d != nil {
			r.PathRatios = append(r.PathRatios, pathRatio{Mode: c.Mode, N: c.N, ShimOverDirect: ratio(c.P50Ms, d.P50Ms)})
		}
	}
	for _, n := range cs.ns() {
		if a, ok := cs.alternative(n); ok {
			r.Alternatives = append(r.Alternatives, a)
		}
		if v, ok := cs.variant(VariantNetwork, n); ok {
			r.Network = append(r.Network, v)
		}
		if v, ok := cs.variant(VariantOrdinary, n); ok {
			r.Ordinary = append(r.Ordinary, v)
		}
		if p, ok := cs.pooled(n); ok {
			r.Pooled = append(r.Pooled, p)
		}
	}
	r.Baselines = cs.baselines()
}

// alternative is the row for N if runc or a cold boot ran at N.
func (cs cells) alternative(n int) (alternative, bool) {
	runc, cold := cs.find(armID{Path: PathRunc}, n), cs.find(armID{Path: PathCold}, n)
	if runc == nil && cold == nil {
		return alternative{}, false
	}
	p50 := func(c *cellResult) float64 {
		if c == nil {
			return 0
		}
		return c.P50Ms
	}
	shim := func(mode string) float64 { return p50(cs.find(armID{Path: PathShim, Mode: mode}, n)) }
	direct := func(mode string) float64 { return p50(cs.find(armID{Path: PathDirect, Mode: mode}, n)) }
	return alternative{
		N:            n,
		MmapOverRunc: ratio(shim(mmap), p50(runc)), CopyOverRunc: ratio(shim(copyMode), p50(runc)),
		ColdOverMmap: ratio(p50(cold), direct(mmap)), ColdOverCopy: ratio(p50(cold), direct(copyMode)),
	}, true
}

// variant is the row of variant against plain shim mmap at N, if both ran.
func (cs cells) variant(variant string, n int) (variantRatio, bool) {
	base := cs.find(armID{Path: PathShim, Mode: mmap}, n)
	v := cs.find(armID{Path: PathShim, Mode: mmap, Variant: variant}, n)
	if base == nil || v == nil {
		return variantRatio{}, false
	}
	ph := variantPhase[variant]
	return variantRatio{
		N: n, BaseP50Ms: base.P50Ms, P50Ms: v.P50Ms, P50OverBase: ratio(v.P50Ms, base.P50Ms),
		Phase: ph, BasePhaseP50Ms: base.phase(ph), PhaseP50Ms: v.phase(ph),
		BaseGuestP50Ms: base.GuestP50Ms, GuestP50Ms: v.GuestP50Ms,
	}, true
}

// pooledRatio puts the bursts in pooled VMs beside runc's in the same
// rounds at one N, and beside plain shim mmap (0 where it did not run).
type pooledRatio struct {
	N                 int     `json:"n"`
	PooledOverRunc    float64 `json:"p50PooledOverRunc"`
	RefillingOverRunc float64 `json:"p50RightAfterOverRunc"`
	PooledOverShim    float64 `json:"p50PooledOverShimMmap"`
}

// pooled is the pooled set's row at N, if it ran.
func (cs cells) pooled(n int) (pooledRatio, bool) {
	p := cs.find(armID{Path: PathShim, Mode: mmap, Variant: VariantPooled}, n)
	runc := cs.find(armID{Path: PathRunc, Variant: VariantBesidePooled}, n)
	after := cs.find(armID{Path: PathShim, Mode: mmap, Variant: VariantRefilling}, n)
	if p == nil || runc == nil || after == nil {
		return pooledRatio{}, false
	}
	r := pooledRatio{N: n, PooledOverRunc: ratio(p.P50Ms, runc.P50Ms), RefillingOverRunc: ratio(after.P50Ms, runc.P50Ms)}
	if shim := cs.find(armID{Path: PathShim, Mode: mmap}, n); shim != nil {
		r.PooledOverShim = ratio(p.P50Ms, shim.P50Ms)
	}
	return r, true
}

// ratio is a ÷ b to two decimals, 0 when either is missing.
func ratio(a, b float64) float64 {
	if a == 0 || b == 0 {
		return 0
	}
	return math.Round(a/b*100) / 100
}
