package task

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// vmCgroup is the cgroup the hypervisor process runs in, at the OCI spec's
// cgroupsPath: Stats reports it, Update sets its limits. It is made before
// the restore, which charges the guest's memory to it and starts the
// hypervisor in it (hypervisor.Cgroup; charge.go).
type vmCgroup interface {
	hypervisor.Cgroup
	Add(pid int) error
	Stats() (any, error)
	Update(res *specs.LinuxResources) error
	Delete() error
}

// newCgroup creates the cgroup at path with res, which vmResources made.
func newCgroup(path string, res *specs.LinuxResources) (vmCgroup, error) {
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
