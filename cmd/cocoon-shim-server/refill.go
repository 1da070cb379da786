package main

import (
	"context"
	"sync"

	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/launch"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/vm"
)

// refilling tops up the spares for the next tasks once a task is
// launched: then, not at the server's start, the spares' own start-up is
// off this task's path. A VM this server restored ahead as a spare is for
// its first launch only: whatever that launch was, it is closed if left.
type refilling struct {
	pod task.PodLauncher
	vm  *vm.Launcher
	// refill starts the spares (launch.RefillSpare); refills counts those
	// under way, which the server's shutdown waits for (Settle): a task
	// that ends at once (`echo hi`) would otherwise have the server exit
	// while its refill still starts the spares (under SCHED_IDLE, slow on
	// a busy machine), and the next tasks find fewer than shim.spares.
	refill  func(containerd string, count int, env ...string) error
	refills *sync.WaitGroup
}

var (
	_ task.Warmer  = refilling{}
	_ task.Settler = refilling{}
)

func newRefilling(pod task.PodLauncher, l *vm.Launcher) refilling {
	return refilling{pod: pod, vm: l, refill: launch.RefillSpare, refills: &sync.WaitGroup{}}
}

func (l refilling) Launch(ctx context.Context, r task.LaunchRequest) (*task.Sandbox, error) {
	sb, err := l.pod.Launch(ctx, r)
	l.vm.ClosePool()
	if err != nil {
		return nil, err
	}
	l.refills.Go(func() {
		env := []string{vm.PoolEnv + "="}
		if sb.SpareEnv != nil {
			env = sb.SpareEnv(context.WithoutCancel(ctx))
		}
		if err := l.refill(r.Containerd, max(sb.Spares, 1), env...); err != nil {
			log.G(ctx).WithError(err).Warn("start a spare shim server")
		}
	})
	return sb, nil
}

// Warm has the hypervisor probed ahead of the first launch.
func (l refilling) Warm(ctx context.Context) { l.pod.Warm(ctx) }

// Settle waits for the refills under way, until ctx ends.
func (l refilling) Settle(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		l.refills.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		log.G(ctx).Warn("the server exits with its spares' refill still under way")
	}
}
