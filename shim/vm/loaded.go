package vm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// Phases of a launch between the VM's load and its resume.
const (
	PhaseHooks   = "hooks"
	PhaseNetwork = "network"
)

// loadedDriver does the task's part of a restore once the VM is loaded and
// still paused, before restore.Run resumes it: report the spawn (the
// service records the VM and moves it into its cgroup meanwhile), run the
// createRuntime hooks with the VM's pid, then connect the NIC to the
// interface those hooks may have made.
type loadedDriver struct {
	hypervisor.Driver
	req   task.LaunchRequest
	spawn task.Spawn // all but the pid
	net   *vmNetwork
}

func (d loadedDriver) Restore(ctx context.Context, req hypervisor.RestoreRequest) (hypervisor.VM, error) {
	req.Cgroup = d.req.Cgroup
	vm, err := d.Driver.Restore(ctx, req)
	if err != nil {
		return nil, err
	}
	d.net.closeTap() // the hypervisor holds its own queue of the tap now
	if err := d.loaded(ctx, vm.PID(), req.Phase); err != nil {
		return nil, errors.Join(err, vm.Close())
	}
	return vm, nil
}

func (d loadedDriver) loaded(ctx context.Context, pid int, phase func(string, time.Duration)) error {
	if d.req.Spawned != nil {
		sp := d.spawn
		sp.PID = pid
		d.req.Spawned(sp)
	}
	if d.req.Created != nil {
		t := time.Now()
		if err := d.req.Created(ctx, pid); err != nil {
			return fmt.Errorf("createRuntime hooks: %w", err)
		}
		phase(PhaseHooks, time.Since(t))
	}
	if d.net == nil {
		return nil
	}
	t := time.Now()
	if _, err := d.net.connect(ctx); err != nil {
		return fmt.Errorf("connect the VM's network: %w", err)
	}
	phase(PhaseNetwork, time.Since(t))
	return nil
}
