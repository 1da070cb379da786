package task

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/hooks"
)

// ociHooks runs a task's OCI hooks at the points runc runs them, with the
// hypervisor's pid as the container's: nerdctl's CNI setup, for one, is a
// createRuntime hook that configures /proc/<pid>/ns/net.
type ociHooks struct {
	id, bundle  string
	hooks       *specs.Hooks
	annotations map[string]string
	// deadline bounds a hook that sets no timeout (shim.hook_timeout).
	deadline time.Duration
}

// newOCIHooks takes the hooks of r's spec; the task's config, for their
// deadline, is read only when there are hooks.
func newOCIHooks(r LaunchRequest) (*ociHooks, error) {
	h := &ociHooks{id: r.ID, bundle: r.Bundle, hooks: r.Spec.Hooks, annotations: r.Spec.Annotations}
	if h.hooks == nil {
		return h, nil
	}
	if len(h.hooks.StartContainer) > 0 {
		return nil, fmt.Errorf("spec has %d startContainer hook(s) (first %s): they run inside the container's namespaces, here a VM's, where cocoon cannot run a host program; remove them: %w",
			len(h.hooks.StartContainer), h.hooks.StartContainer[0].Path, errdefs.ErrInvalidArgument)
	}
	cfg, err := config.LoadTask(r.ConfigPath, r.ConfigBody)
	if err != nil {
		return nil, fmt.Errorf("read the deadline of OCI hooks: %w", err)
	}
	h.deadline = cfg.Shim.HookTimeout.D()
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
		if err := hooks.Run(ctx, k.kind, k.hooks, st, h.deadline); err != nil {
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
	return hooks.Run(ctx, hooks.Poststart, h.hooks.Poststart, hooks.State(h.id, h.bundle, specs.StateRunning, pid, h.annotations), h.deadline)
}

// stopped runs the poststop hooks once the VM is gone. Their failure is
// logged, as the OCI spec asks: the container is deleted either way.
func (h *ociHooks) stopped(ctx context.Context, pid int) {
	if h.hooks == nil {
		return
	}
	err := hooks.Run(ctx, hooks.Poststop, h.hooks.Poststop, hooks.State(h.id, h.bundle, specs.StateStopped, pid, h.annotations), h.deadline)
	if err != nil {
		log.G(ctx).WithError(err).WithField("id", h.id).Warn("poststop hook")
	}
}
