package vm

import (
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/network"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/baseimage"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// starting tells the task, before the launch creates anything, every name
// it may create: the VM's run dir, its tap in a namespace that outlives
// the VM, and an ordinary image's base snapshot. Each is a function of
// the config and the request, so a shim killed at any point of the launch
// leaves `shim delete` a record that covers what exists.
func starting(cfg config.Config, d hypervisor.Driver, r task.LaunchRequest) error {
	if r.Starting == nil {
		return nil
	}
	runDir, err := runDirOf(cfg, r)
	if err != nil {
		return err
	}
	sp := task.Spawn{Hypervisor: d.Name(), RunDir: runDir, Network: plannedNetwork(r.Spec, r.ID)}
	if (r.Rootfs != nil || r.Bare) && len(cfg.Restore.Bases()) > 0 {
		sp.Base = &state.Base{Namespace: r.Namespace, Snapshotter: cfg.Restore.BaseSnapshotter, Key: baseimage.Key(r.ID)}
	}
	if err := r.Starting(sp); err != nil {
		return fmt.Errorf("record task %s before its VM: %w", r.ID, err)
	}
	return nil
}

// plannedNetwork names the tap openNetwork makes in a namespace the spec
// names; nil for none or for a new namespace, which dies with the VM.
func plannedNetwork(spec *specs.Spec, id string) *state.Network {
	entry, ok := networkEntry(spec)
	if !ok || entry.Path == "" {
		return nil
	}
	return &state.Network{NetNS: entry.Path, Tap: network.TapName(id)}
}
