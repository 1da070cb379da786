package manager

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	"golang.org/x/sys/unix"
)

// emptyPoll is how often deleteCgroup looks again at a cgroup whose
// processes it killed.
const emptyPoll = 20 * time.Millisecond

// deleteCgroup removes the cgroup the hypervisor ran in. It is the task's
// alone: a process still in it (a hypervisor whose record was cut short by
// a crash, one exiting as the shim died with it) is killed, and the delete
// tried again until killTimeout, as runc's delete kills what is left in a
// container's cgroup.
func deleteCgroup(path string) error {
	cg, err := loadCgroup(path)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, cgroup1.ErrCgroupDeleted) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete cgroup %s: %w", path, err)
	}
	deadline := time.Now().Add(killTimeout)
	for {
		err := cg.Delete()
		if err == nil || errors.Is(err, os.ErrNotExist) || errors.Is(err, cgroup1.ErrCgroupDeleted) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("delete cgroup %s: %w", path, err)
		}
		cg.kill()
		time.Sleep(emptyPoll)
	}
}

// taskCgroup is a task's cgroup as deleteCgroup handles it.
type taskCgroup interface {
	Delete() error
	// kill sends SIGKILL to every process in the cgroup.
	kill()
}

func loadCgroup(path string) (taskCgroup, error) {
	if cgroups.Mode() == cgroups.Unified {
		m, err := cgroup2.Load(path)
		return v2Cgroup{m}, err
	}
	cg, err := cgroup1.Load(cgroup1.StaticPath(path))
	return v1Cgroup{cg}, err
}

type v1Cgroup struct{ cgroup1.Cgroup }

// kill kills the processes in the cgroup, in any of its hierarchies
// (v1 has no cgroup.kill).
func (c v1Cgroup) kill() {
	killed := map[int]bool{}
	for _, s := range c.Subsystems() {
		ps, _ := c.Processes(s.Name(), true)
		for _, p := range ps {
			if !killed[p.Pid] {
				killed[p.Pid] = true
				_ = unix.Kill(p.Pid, unix.SIGKILL)
			}
		}
	}
}

type v2Cgroup struct{ *cgroup2.Manager }

// kill writes cgroup.kill (the library falls back to signalling each
// process on kernels before 5.14).
func (c v2Cgroup) kill() { _ = c.Kill() }
