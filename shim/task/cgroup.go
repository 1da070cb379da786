package task

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// VMCgroup is the cgroup the hypervisor process runs in, at the OCI spec's
// cgroupsPath: Stats reports it, Update sets its limits. It is made before
// the restore, which charges the guest's memory to it and starts the
// hypervisor in it (hypervisor.Cgroup; charge.go).
type VMCgroup interface {
	hypervisor.Cgroup
	Add(pid int) error
	Stats() (any, error)
	Update(res *specs.LinuxResources) error
	Delete() error
	// Procs lists the processes in it.
	Procs() ([]int, error)
}

// NewCgroup creates the cgroup at path with res (a task's VM's: what
// vmResources made), or loads it. A process moved in leaves the memory
// already charged to it where it was: v2 never moves charges, and v1's
// memory.move_charge_at_immigrate is gone from Linux 6.x (EINVAL).
func NewCgroup(path string, res *specs.LinuxResources) (VMCgroup, error) {
	if strings.Contains(path, ":") {
		return nil, fmt.Errorf("cgroups path %q: systemd slice paths are not supported, want a cgroupfs path", path)
	}
	if cgroups.Mode() == cgroups.Unified {
		m, err := cgroup2.NewManager("/sys/fs/cgroup", path, cgroup2.ToResources(res))
		if err != nil {
			return nil, fmt.Errorf("create cgroup %s: %w", path, err)
		}
		return cgroupV2{m: m, dir: filepath.Join("/sys/fs/cgroup", path)}, nil
	}
	cg, err := cgroup1.New(cgroup1.StaticPath(path), res)
	if err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", path, err)
	}
	return cgroupV1{cg}, nil
}

type cgroupV1 struct{ cg cgroup1.Cgroup }

func (c cgroupV1) Add(pid int) error { return c.cg.AddProc(uint64(pid)) }
func (c cgroupV1) Stats() (any, error) {
	return c.cg.Stat(cgroup1.IgnoreNotExist)
}
func (c cgroupV1) Update(res *specs.LinuxResources) error { return c.cg.Update(res) }
func (c cgroupV1) Delete() error                          { return c.cg.Delete() }
func (c cgroupV1) Procs() ([]int, error) {
	ps, err := c.cg.Processes(cgroup1.Memory, false)
	pids := make([]int, len(ps))
	for i, p := range ps {
		pids[i] = p.Pid
	}
	return pids, err
}

type cgroupV2 struct {
	m   *cgroup2.Manager
	dir string
}

func (c cgroupV2) Add(pid int) error   { return c.m.AddProc(uint64(pid)) }
func (c cgroupV2) Stats() (any, error) { return c.m.Stat() }
func (c cgroupV2) Update(res *specs.LinuxResources) error {
	return c.m.Update(cgroup2.ToResources(res))
}
func (c cgroupV2) Delete() error { return c.m.Delete() }
func (c cgroupV2) Procs() ([]int, error) {
	ps, err := c.m.Procs(false)
	pids := make([]int, len(ps))
	for i, p := range ps {
		pids[i] = int(p)
	}
	return pids, err
}

// JoinOwnCgroups moves pid into this process's cgroups: a pooled VM
// claimed by a task whose spec names no cgroup leaves the pool's for the
// shim's, where a VM restored for such a task runs.
func JoinOwnCgroups(pid int) error {
	if cgroups.Mode() == cgroups.Unified {
		path, err := cgroup2.PidGroupPath(os.Getpid())
		if err != nil {
			return fmt.Errorf("find the shim's cgroup: %w", err)
		}
		own, err := cgroup2.Load(path)
		if err != nil {
			return fmt.Errorf("load the shim's cgroup %s: %w", path, err)
		}
		return own.AddProc(uint64(pid))
	}
	own, err := cgroup1.Load(cgroup1.PidPath(os.Getpid()))
	if err != nil {
		return fmt.Errorf("load the shim's cgroups: %w", err)
	}
	return own.AddProc(uint64(pid))
}
