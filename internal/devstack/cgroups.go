package devstack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// absentNamespaceCgroups lists the cgroup dirs of namespace ns, in every
// cgroup hierarchy, that do not exist yet. containerd's default spec puts
// a task's cgroup at /<namespace>/<id>; the shims remove the task's but
// leave the namespace's, which the stack removes on Close if it was not
// there before the stack started.
func absentNamespaceCgroups(ns string) []string {
	if ns == "" || ns == "." || ns == ".." || filepath.Base(ns) != ns {
		return nil
	}
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil
	}
	var dirs []string
	seen := map[string]bool{}
	for _, m := range mounts {
		dir := filepath.Join(m.Mountpoint, ns)
		if seen[dir] {
			continue
		}
		seen[dir] = true
		if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
			dirs = append(dirs, dir)
		}
	}
	return dirs
}

// removeEmptyCgroups removes those of dirs that are empty cgroups. A
// cgroup's rmdir fails while it holds a process or a child cgroup, so one
// another stack of the same namespace still uses stays.
func removeEmptyCgroups(dirs []string) error {
	var errs []error
	for _, dir := range dirs {
		err := unix.Rmdir(dir)
		if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.ENOTEMPTY) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}
