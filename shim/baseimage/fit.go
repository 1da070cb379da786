package baseimage

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/docker/go-units"
)

// Fit is what a VM's guest memory must suit: a pod's VM holds the
// pod's memory, so its guest has at least it; a container's own VM is
// charged to the container's limit, which its guest memory may not pass.
type Fit struct {
	Pod   bool
	Limit int64 // the pod's memory or the container's limit; 0 for none
}

func (f Fit) fits(memory int64) bool {
	switch {
	case f.Limit == 0:
		return true
	case f.Pod:
		return memory >= f.Limit
	default:
		return memory <= f.Limit
	}
}

// order is the order to try bases in, given smallest first: a pod, or a
// VM with no limit, wants the smallest that fits, a container with a
// limit the largest.
func (f Fit) order(bases []string) []string {
	if f.Pod || f.Limit == 0 {
		return bases
	}
	out := slices.Clone(bases)
	slices.Reverse(out)
	return out
}

func (f Fit) String() string {
	size := units.BytesSize(float64(f.Limit))
	switch {
	case f.Limit == 0 && f.Pod:
		return "the pod names no memory: the smallest"
	case f.Limit == 0:
		return "the container has no memory limit: the smallest"
	case f.Pod:
		return "the smallest that holds the pod's " + size
	default:
		return "the largest whose guest memory the container's limit " + size + " holds"
	}
}

// releaser is a staged base: a Snapshot in the shim.
type releaser interface{ Release() error }

// Pick stages the base of bases (smallest first) that fits f,
// trying them in f's order and letting go of those that do not fit (stage
// says a staged base's guest memory). With one base there is nothing to
// choose: it is staged, and the memory budget judges it. The reason
// names the base and why it was picked.
func Pick[S releaser](ctx context.Context, bases []string, f Fit, stage func(context.Context, string) (S, int64, error)) (S, string, error) {
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
	if !f.Pod {
		want = "at most the container's memory limit"
	}
	return zero, "", fmt.Errorf("none of restore.base_images has %s %s of guest memory: %s: %w",
		want, units.BytesSize(float64(f.Limit)), strings.Join(tried, ", "), errdefs.ErrInvalidArgument)
}
