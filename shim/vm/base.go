package vm

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/docker/go-units"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// sandboxMemoryAnnotation is the pod's memory limit, which containerd's
// CRI puts on the pod's sandbox spec (its sandbox sizing annotations).
const sandboxMemoryAnnotation = "io.kubernetes.cri.sandbox-memory"

// baseFit is what a VM's guest memory must suit: a pod's VM holds the
// pod's memory, so its guest has at least it; a container's own VM is
// charged to the container's limit, which its guest memory may not pass.
type baseFit struct {
	pod   bool
	limit int64 // the pod's memory or the container's limit; 0 for none
}

// fitOf is the fit r's VM needs.
func fitOf(r task.LaunchRequest) baseFit {
	f := baseFit{pod: r.Bare || task.IsPodSandbox(r.Spec)}
	if res := resourcesOf(r.Spec); res != nil && res.Memory != nil && res.Memory.Limit != nil && *res.Memory.Limit > 0 {
		f.limit = *res.Memory.Limit
	}
	if f.pod && r.Spec != nil {
		if n, err := strconv.ParseInt(r.Spec.Annotations[sandboxMemoryAnnotation], 10, 64); err == nil && n > 0 {
			f.limit = n
		}
	}
	return f
}

func (f baseFit) fits(memory int64) bool {
	switch {
	case f.limit == 0:
		return true
	case f.pod:
		return memory >= f.limit
	default:
		return memory <= f.limit
	}
}

// order is the order to try bases in, given smallest first: a pod, or a
// VM with no limit, wants the smallest that fits, a container with a
// limit the largest.
func (f baseFit) order(bases []string) []string {
	if f.pod || f.limit == 0 {
		return bases
	}
	out := slices.Clone(bases)
	slices.Reverse(out)
	return out
}

func (f baseFit) String() string {
	size := units.BytesSize(float64(f.limit))
	switch {
	case f.limit == 0 && f.pod:
		return "the pod names no memory: the smallest"
	case f.limit == 0:
		return "the container has no memory limit: the smallest"
	case f.pod:
		return "the smallest that holds the pod's " + size
	default:
		return "the largest whose guest memory the container's limit " + size + " holds"
	}
}

// releaser is a staged base: baseimage.Snapshot in the shim.
type releaser interface{ Release() error }

// pickBase stages the base of bases (smallest first) that fits f,
// trying them in f's order and letting go of those that do not fit (stage
// says a staged base's guest memory). With one base there is nothing to
// choose: it is staged, and the memory budget judges it. The reason
// names the base and why it was picked.
func pickBase[S releaser](ctx context.Context, bases []string, f baseFit, stage func(context.Context, string) (S, int64, error)) (S, string, error) {
	var zero S
	if len(bases) == 1 {
		b, _, err := stage(ctx, bases[0])
		return b, "", err
	}
	var tried []string
	for _, img := range f.order(bases) {
		b, memory, err := stage(ctx, img)
		if err != nil {
			return zero, "", err
		}
		if f.fits(memory) {
			why := fmt.Sprintf("base snapshot %s (%s of guest memory): %s of restore.base_images", img, units.BytesSize(float64(memory)), f)
			return b, why, nil
		}
		tried = append(tried, fmt.Sprintf("%s (%s)", img, units.BytesSize(float64(memory))))
		if err := b.Release(); err != nil {
			return zero, "", fmt.Errorf("let go of base snapshot %s: %w", img, err)
		}
	}
	want := "at least the pod's"
	if !f.pod {
		want = "at most the container's memory limit"
	}
	return zero, "", fmt.Errorf("none of restore.base_images has %s %s of guest memory: %s: %w",
		want, units.BytesSize(float64(f.limit)), strings.Join(tried, ", "), errdefs.ErrInvalidArgument)
}
