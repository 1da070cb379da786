package task

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/hooks"
)

// ociHooks runs a task's OCI hooks at the points runc runs them, with the
// hypervisor's pid as the container's: nerdctl's CNI setup, for one, is a
// createRuntime hook that configures /proc/<pid>/ns/net.
type ociHooks struct {
	id, bundle  string
	hooks       *specs.Hooks
	annotations map[string]string
}

func newOCIHooks(id, bundle string, spec *specs.Spec) (*ociHooks, error) {
	h := &ociHooks{id: id, bundle: bundle, hooks: spec.Hooks, annotations: spec.Annotations}
	if h.hooks != nil && len(h.hooks.StartContainer) > 0 {
		return nil, fmt.Errorf("spec has %d startContainer hook(s) (first %s): they run inside the container's namespaces, here a VM's, where cocoon cannot run a host program; remove them: %w",
			len(h.hooks.StartContainer), h.hooks.StartContainer[0].Path, errdefs.ErrInvalidArgument)
	}
	return h, nil
}

// hasCreateHooks says whether created has anything to run.
func (h *ociHooks) hasCreateHooks() bool {
	//lint:ignore SA1019 prestart is deprecated, but runc still runs it
	return h.hooks != nil && len(h.hooks.Prestart)+len(h.hooks.CreateRuntime)+len(h.hooks.CreateContainer) > 0
}

// created runs the create-time hooks (prestart, createRuntime,
// createContainer, in runc's order) once the VM's process exists.
func (h *ociHooks) created(ctx context.Context, pid int) error {
	if h.hooks == nil {
		return nil
	}
	st := hooks.State(h.id, h.bundle, specs.StateCreating, pid, h.annotations)
	for _, k := range []struct {
		kind  string
		hooks []specs.Hook
	}{
		//lint:ignore SA1019 prestart is deprecated, but runc still runs it
		{hooks.Prestart, h.hooks.Prestart},
		{hooks.CreateRuntime, h.hooks.CreateRuntime},
		{hooks.CreateContainer, h.hooks.CreateContainer},
	} {
		if err := hooks.Run(ctx, k.kind, k.hooks, st); err != nil {
			return err
		}
	}
	return nil
}

// started runs the poststart hooks once the init process runs.
func (h *ociHooks) started(ctx context.Context, pid int) error {
	if h.hooks == nil {
		return nil
	}
	return hooks.Run(ctx, hooks.Poststart, h.hooks.Poststart, hooks.State(h.id, h.bundle, specs.StateRunning, pid, h.annotations))
}

// stopped runs the poststop hooks once the VM is gone. Their failure is
// logged, as the OCI spec asks: the container is deleted either way.
func (h *ociHooks) stopped(ctx context.Context, pid int) {
	if h.hooks == nil {
		return
	}
	err := hooks.Run(ctx, hooks.Poststop, h.hooks.Poststop, hooks.State(h.id, h.bundle, specs.StateStopped, pid, h.annotations))
	if err != nil {
		log.G(ctx).WithError(err).WithField("id", h.id).Warn("poststop hook")
	}
}
