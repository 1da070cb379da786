package manager

import (
	"errors"
	"fmt"
	"os"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
)

// deleteCgroup removes the (now empty) cgroup the hypervisor ran in.
func deleteCgroup(path string) error {
	var err error
	if cgroups.Mode() == cgroups.Unified {
		var m *cgroup2.Manager
		if m, err = cgroup2.Load(path); err == nil {
			err = m.Delete()
		}
	} else {
		var cg cgroup1.Cgroup
		if cg, err = cgroup1.Load(cgroup1.StaticPath(path)); err == nil {
			err = cg.Delete()
		}
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, cgroup1.ErrCgroupDeleted) {
		return fmt.Errorf("delete cgroup %s: %w", path, err)
	}
	return nil
}
