package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/stackrun"
)

// armSet is every arm a run measures and what they share.
type armSet struct {
	arms     []armAt
	stagers  []stager
	direct   *directPath
	shim     *shimStack // nil unless an arm runs through containerd
	baseline *shimStack // the baseline build's, nil without one
	// pooled is the pooled set's containerd, of its own: every spare in
	// it is of the pooled config, none left by another arm's tasks.
	pooled *shimStack
	cold   *coldArm
}

// stager stages the snapshot chain for one clone and removes it again.
type stager struct {
	name  string
	stage func(ctx context.Context) (time.Duration, error)
}

// openArms sets up the arms o asks for, in the order they take turns: per
// mode direct then shim, then runc, the cold boot, and the shim variants;
// then the pooled set, which takes turns on its own.
// On error the set holds what was set up, for close.
func openArms(ctx context.Context, out io.Writer, o Options, img stackrun.SnapshotImage, tmp string, guestKiB int64) (*armSet, error) {
	set := &armSet{}
	has := func(p string) bool { return slices.Contains(o.Paths, p) }
	var err error
	if has(PathDirect) {
		if set.direct, err = newDirectPath(ctx, img, filepath.Join(tmp, "d")); err != nil {
			return set, fmt.Errorf("set up the direct path: %w", err)
		}
		set.stagers = append(set.stagers, stager{name: PathDirect, stage: set.direct.stage})
	}
	if has(PathShim) || has(PathRunc) || len(o.NetworkNs)+len(o.OrdinaryNs)+len(o.ConvertPads)+o.WholeRounds > 0 {
		if err := set.openShim(ctx, o, img, guestKiB); err != nil {
			return set, err
		}
	}
	if o.Baseline != "" {
		if err := set.openBaseline(ctx, out, o, guestKiB); err != nil {
			return set, err
		}
	}
	for _, mode := range o.Modes {
		if set.direct != nil {
			set.add(armID{Path: PathDirect, Mode: string(mode)}, directArm{p: set.direct, mode: mode}, nil)
		}
		if has(PathShim) {
			set.add(armID{Path: PathShim, Mode: string(mode)}, shimArm{s: set.shim, mode: mode}, nil)
		}
		if set.baseline != nil {
			set.add(armID{Path: PathShim, Mode: string(mode), Variant: VariantBaseline}, shimArm{s: set.baseline, mode: mode}, o.BaselineNs)
		}
	}
	if has(PathRunc) {
		set.add(armID{Path: PathRunc}, runcArm{s: set.shim}, nil)
	}
	if has(PathCold) {
		if set.cold, err = newColdArm(img, o.Guest, filepath.Join(tmp, "cold")); err != nil {
			return set, err
		}
		set.add(armID{Path: PathCold}, set.cold, nil)
	}
	if len(o.NetworkNs) > 0 {
		set.add(armID{Path: PathShim, Mode: mmap, Variant: VariantNetwork}, newNetworkArm(shimArm{s: set.shim, mode: hypervisor.ModeMmap}), o.NetworkNs)
	}
	if len(o.OrdinaryNs) > 0 {
		set.add(armID{Path: PathShim, Mode: mmap, Variant: VariantOrdinary}, shimArm{s: set.shim, mode: hypervisor.ModeMmap, image: set.shim.busybox}, o.OrdinaryNs)
	}
	if len(o.PooledNs) > 0 {
		if err := set.addPooledArms(ctx, o, img, guestKiB, tmp); err != nil {
			return set, err
		}
	}
	fmt.Fprintf(out, "%d arms: %v\n", len(set.arms), set.labels())
	return set, nil
}

// openShim starts the private containerd, with the busybox image if the
// runc or ordinary arms run it.
func (set *armSet) openShim(ctx context.Context, o Options, img stackrun.SnapshotImage, guestKiB int64) error {
	var snapshotters []string
	if slices.Contains(o.Paths, PathRunc) || o.WholeRounds > 0 {
		snapshotters = append(snapshotters, runcSnapshotter)
	}
	if len(o.OrdinaryNs) > 0 || o.WholeRounds > 0 {
		snapshotters = append(snapshotters, devstack.Snapshotter)
	}
	s, err := openStack(ctx, o, img, guestKiB, snapshotters)
	if err != nil {
		return err
	}
	set.shim = s
	if slices.Contains(o.Paths, PathShim) {
		set.stagers = append(set.stagers, stager{name: PathShim, stage: s.stage})
	}
	return nil
}

// openStack starts a private containerd with the snapshot image, and the
// busybox image in snapshotters (runc's needs runc).
func openStack(ctx context.Context, o Options, img stackrun.SnapshotImage, guestKiB int64, snapshotters []string) (*shimStack, error) {
	if slices.Contains(snapshotters, runcSnapshotter) {
		if err := checkRunc(o.BinDir); err != nil {
			return nil, err
		}
	}
	s, err := newShimStack(ctx, o.BinDir, img, guestKiB)
	if err != nil {
		return nil, fmt.Errorf("set up containerd: %w", err)
	}
	if len(snapshotters) > 0 {
		if err := s.addBusybox(ctx, snapshotters); err != nil {
			return nil, errors.Join(err, s.close())
		}
	}
	return s, nil
}

func (set *armSet) add(id armID, a arm, ns []int) {
	set.arms = append(set.arms, armAt{id: id, arm: a, ns: ns})
}

func (set *armSet) labels() []string {
	var ls []string
	for _, a := range set.arms {
		ls = append(ls, a.id.String())
	}
	return ls
}

func (set *armSet) close() error {
	var errs []error
	if set.shim != nil {
		errs = append(errs, set.shim.close())
	}
	if set.baseline != nil {
		errs = append(errs, set.baseline.close())
	}
	if set.pooled != nil {
		errs = append(errs, set.pooled.close())
	}
	if set.direct != nil {
		errs = append(errs, set.direct.close())
	}
	if set.cold != nil {
		errs = append(errs, set.cold.close())
	}
	return errors.Join(errs...)
}

// measureFirst stages the chain twice: the first flattens it.
func measureFirst(ctx context.Context, s stager) (firstRestore, error) {
	first, err := s.stage(ctx)
	if err != nil {
		return firstRestore{}, fmt.Errorf("%s: %w", s.name, err)
	}
	warm, err := s.stage(ctx)
	if err != nil {
		return firstRestore{}, fmt.Errorf("%s: %w", s.name, err)
	}
	return firstRestore{Path: s.name, FirstMs: ms(first), WarmMs: ms(warm)}, nil
}
