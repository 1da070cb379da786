package restore

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// PlanFor gathers the policy's inputs as the shim does — the driver's
// capabilities, this host's size — and decides the plan for restoring
// link (the top of staged, when a staged chain is given: the plan then
// says how its memory was staged) with d under cfg and the container's
// annotations. The shim and
// `cocoonctl explain` both plan through it, so what an operator is shown is
// what the runtime does.
func PlanFor(ctx context.Context, d hypervisor.Driver, cfg config.Restore, link *chain.Link, staged *chain.Staged, annotations map[string]string) (Plan, hypervisor.Capabilities, error) {
	caps, err := d.Capabilities(ctx)
	if err != nil {
		return Plan{}, caps, fmt.Errorf("%s capabilities: %w: %w", d.Name(), err, errdefs.ErrUnavailable)
	}
	plan, err := Decide(Inputs{
		Hypervisor:  d.Name(),
		Caps:        caps,
		Link:        link,
		Config:      cfg,
		Annotations: annotations,
		Staged:      staged,
		Host:        ThisHost(),
	})
	if err != nil {
		return Plan{}, caps, fmt.Errorf("restore plan: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return plan, caps, nil
}
