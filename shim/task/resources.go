package task

import (
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/docker/go-units"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// MemoryBudget is what a VM's cgroup memory limit is made of. The
// container's memory limit is the guest's: it must hold the snapshot's
// guest RAM, and the hypervisor's own memory (device emulation, under TCG
// its translated code) comes on top as headroom, so the VMM is not
// OOM-killed by a limit the guest fits in.
type MemoryBudget struct {
	// Guest is the snapshot's guest RAM in bytes; 0 when no guest runs.
	Guest int64
	// Headroom is added to the container's limit for the hypervisor.
	Headroom int64
}

// Check fails when res limits memory below the guest's RAM.
func (b MemoryBudget) Check(res *specs.LinuxResources) error {
	_, err := b.limit(res)
	return err
}

// limit is the cgroup memory limit for res: the container's limit plus the
// headroom, or 0 when res sets none.
func (b MemoryBudget) limit(res *specs.LinuxResources) (int64, error) {
	if res == nil || res.Memory == nil || res.Memory.Limit == nil || *res.Memory.Limit <= 0 {
		return 0, nil
	}
	l := *res.Memory.Limit
	if l < b.Guest {
		return 0, fmt.Errorf("memory limit %s is below the snapshot's guest memory %s: raise the limit to at least %d bytes or use a smaller snapshot: %w",
			units.BytesSize(float64(l)), units.BytesSize(float64(b.Guest)), b.Guest, errdefs.ErrInvalidArgument)
	}
	return l + b.Headroom, nil
}

// vmResources is the part of res the hypervisor's cgroup gets: the CPU
// limits as given, and memory as the budget's limit. Swap and reservation
// describe a process's memory, not a VM's fixed RAM, and are not applied.
func (b MemoryBudget) vmResources(res *specs.LinuxResources) (*specs.LinuxResources, error) {
	out := &specs.LinuxResources{}
	if res == nil {
		return out, nil
	}
	if res.CPU != nil {
		cpu := *res.CPU
		out.CPU = &cpu
	}
	limit, err := b.limit(res)
	if err != nil {
		return nil, err
	}
	if limit > 0 {
		out.Memory = &specs.LinuxMemory{Limit: &limit}
	}
	return out, nil
}
