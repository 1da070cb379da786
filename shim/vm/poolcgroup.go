package vm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// poolCgroup is the cgroup the pooled VMs wait in (shim.pool_cgroup), all
// of them, apart from containerd's and the tasks'. Under shim.pool_memory
// it fails once those waiting use that much (resident memory): the bound
// is the fills', not the kernel's, since a claimed VM's memory stays
// charged to the pool's cgroup (no kernel moves it), which a kernel limit
// would count against the VMs still waiting.
func poolCgroup(cfg config.Config) (hypervisor.Cgroup, error) {
	cg, err := task.NewCgroup(cfg.Shim.PoolCgroup, &specs.LinuxResources{})
	if err != nil || cfg.Shim.PoolMemory == 0 {
		return cg, err
	}
	pids, err := cg.Procs()
	if err != nil {
		return nil, fmt.Errorf("list the pooled VMs in cgroup %s: %w", cfg.Shim.PoolCgroup, err)
	}
	if used := residentBytes(pids); used >= int64(cfg.Shim.PoolMemory) {
		return nil, fmt.Errorf("the waiting pooled VMs use %d MiB, shim.pool_memory is %d MiB: no more restored", used>>20, cfg.Shim.PoolMemory>>20)
	}
	return cg, nil
}

// residentBytes adds up the resident memory of pids (the gone count 0).
func residentBytes(pids []int) int64 {
	var sum int64
	for _, pid := range pids {
		data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "statm"))
		if f := strings.Fields(string(data)); err == nil && len(f) > 1 {
			pages, _ := strconv.ParseInt(f[1], 10, 64)
			sum += pages * int64(os.Getpagesize())
		}
	}
	return sum
}

// inCgroup restores a VM with its memory charged to, and its hypervisor
// started in, cg.
type inCgroup struct {
	hypervisor.Driver
	cg hypervisor.Cgroup
}

func (d inCgroup) Restore(ctx context.Context, req hypervisor.RestoreRequest) (hypervisor.VM, error) {
	req.Cgroup = d.cg
	return d.Driver.Restore(ctx, req)
}
