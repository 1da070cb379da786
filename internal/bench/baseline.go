package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/stackrun"
)

// VariantBaseline is the shim path of another build of cocoon
// (Options.Baseline): its shim, snapshotter and guest, its snapshot image
// baked by its own cocoonctl, through a containerd of its own. Its arms
// run right after this build's shim arms, so each comparison is made side
// by side.
const VariantBaseline = "baseline"

// baselineRatio compares the shim path of this build with the baseline's
// in one mode at one N.
type baselineRatio struct {
	N    int    `json:"n"`
	Mode string `json:"mode"`
	// Guest is the guest's side, agent + init + process started: the sum
	// of their medians.
	BaselineGuestP50Ms float64 `json:"baselineGuestP50Ms"`
	GuestP50Ms         float64 `json:"guestP50Ms"`
	GuestOverBaseline  float64 `json:"guestOverBaseline"`
	BaselineP50Ms      float64 `json:"baselineP50Ms"`
	P50Ms              float64 `json:"p50Ms"`
	P50OverBaseline    float64 `json:"p50OverBaseline"`
	// Outside is what no phase covers: starting the shim and the task
	// RPCs through containerd.
	BaselineOutsideP50Ms float64 `json:"baselineOutsideP50Ms"`
	OutsideP50Ms         float64 `json:"outsideP50Ms"`
}

// checkBaseline checks that dir holds a build: bin/ (make build) and
// build/guest (make guest).
func checkBaseline(dir string) error {
	for _, p := range []string{"bin/containerd-shim-cocoon-v2", "bin/cocoon-snapshotter", "bin/cocoonctl", "bin/containerd", "build/guest/initramfs.cpio.gz"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			return fmt.Errorf("baseline %s: %w (make build guest there)", dir, err)
		}
	}
	return nil
}

// openBaseline bakes (or finds cached) the baseline's snapshot image and
// starts its containerd.
func (set *armSet) openBaseline(ctx context.Context, out io.Writer, o Options, guestKiB int64) error {
	bin := filepath.Join(o.Baseline, "bin")
	img, err := stackrun.EnsureImage(ctx, out, stackrun.ImageSpec{
		Guest: filepath.Join(o.Baseline, "build", "guest"), Cache: o.Cache, Memory: o.Memory, BinDir: bin,
	})
	if err != nil {
		return fmt.Errorf("baseline snapshot image: %w", err)
	}
	if set.baseline, err = newShimStack(ctx, bin, img, guestKiB); err != nil {
		return fmt.Errorf("set up the baseline's containerd: %w", err)
	}
	return nil
}

// baselines compares every shim cell that has a baseline cell beside it.
func (cs cells) baselines() []baselineRatio {
	var out []baselineRatio
	for _, b := range cs {
		if b.Variant != VariantBaseline {
			continue
		}
		c := cs.find(armID{Path: PathShim, Mode: b.Mode}, b.N)
		if c == nil {
			continue
		}
		out = append(out, baselineRatio{
			N: b.N, Mode: b.Mode,
			BaselineGuestP50Ms: b.GuestP50Ms, GuestP50Ms: c.GuestP50Ms, GuestOverBaseline: ratio(c.GuestP50Ms, b.GuestP50Ms),
			BaselineP50Ms: b.P50Ms, P50Ms: c.P50Ms, P50OverBaseline: ratio(c.P50Ms, b.P50Ms),
			BaselineOutsideP50Ms: b.OutsideP50Ms, OutsideP50Ms: c.OutsideP50Ms,
		})
	}
	return out
}

func (r *results) baselineTable(b *strings.Builder) {
	if len(r.Baselines) == 0 {
		return
	}
	fmt.Fprintf(b, "\nAgainst the baseline (%s), run side by side: this build's shim path ÷ the baseline's. Guest is agent + init + process started (sum of medians); outside is what no phase covers.\n\n"+
		"| N | mode | guest p50 ms: baseline / this | guest ÷ | p50 ms: baseline / this | p50 ÷ | outside p50 ms: baseline / this |\n|---|---|---|---|---|---|---|\n",
		r.Baseline)
	for _, x := range r.Baselines {
		fmt.Fprintf(b, "| %d | %s | %.0f / %.0f | %s | %.0f / %.0f | %s | %.0f / %.0f |\n", x.N, x.Mode,
			x.BaselineGuestP50Ms, x.GuestP50Ms, times(x.GuestOverBaseline), x.BaselineP50Ms, x.P50Ms, times(x.P50OverBaseline),
			x.BaselineOutsideP50Ms, x.OutsideP50Ms)
	}
}
