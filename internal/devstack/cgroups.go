package devstack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// absentCgroups lists the top-level cgroup dirs called name, in every
// cgroup hierarchy, that do not exist yet. containerd's default spec puts
// a task's cgroup at /<namespace>/<id>, a CRI stack's pods use
// CgroupParent; the shims and runc remove the tasks' cgroups but leave
// these parents, which the stack removes on Close if they were not there
// before it started.
func absentCgroups(name string) []string {
	var dirs []string
	for _, dir := range hierarchyDirs(name) {
		if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
			dirs = append(dirs, dir)
		}
	}
	return dirs
}

// hierarchyDirs is the top-level cgroup dir name in every cgroup hierarchy;
// nil unless name is one path element.
func hierarchyDirs(name string) []string {
	if name == "" || name == "." || name == ".." || filepath.Base(name) != name {
		return nil
	}
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil
	}
	var dirs []string
	for _, m := range mounts {
		if dir := filepath.Join(m.Mountpoint, name); !slices.Contains(dirs, dir) {
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
