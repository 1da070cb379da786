package main

import (
	"context"
	"sync"

	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/launch"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/pause"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/vm"
)

// refilling tops up the spares for the next tasks once a task is
// launched: then, not at the server's start, the spares' own start-up is
// off this task's path. A VM this server restored ahead as a spare is for
// its first launch of a VM only: whatever that launch was, it is closed if
// left. A pod sandbox's host process (shim.pod_vm = "container") is no
// such launch: the VM waits for the pod's first container, whose launch,
// in this server, refills the spares with its order (a refill now would
// start them with none, and that one would not top them up).
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
	if err == nil && sb.Hypervisor == pause.Hypervisor {
		return sb, nil
	}
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

// Settle waits for the refills under way, until ctx ends, and closes a
// pooled VM no launch took.
func (l refilling) Settle(ctx context.Context) {
	defer l.vm.ClosePool()
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
