package devstack

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare"
)

// InUse describes what the stack's tasks still hold while the stack runs:
// processes other than its daemons (and a waiting spare shim server) that
// refer to Dir or sit in
// CgroupParent (shims, VMs, pod processes), mounts under Dir, and cgroups
// below CgroupParent. Once every pod, container and task is gone it is
// empty; a shim may take a moment to exit after its last task.
func (s *Stack) InUse() []string {
	daemons := make([]int, 0, len(s.procs))
	for _, p := range s.procs {
		daemons = append(daemons, p.cmd.Process.Pid)
	}
	var out []string
	for _, pid := range processesUsing(s.Dir) {
		cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		cwd, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "cwd"))
		// A waiting spare shim server is containerd's, for its next task.
		if !slices.Contains(daemons, pid) && !spare.IsWaiting(args, cwd) {
			out = append(out, fmt.Sprintf("process %d: %s", pid, strings.Join(args, " ")))
		}
	}
	for _, mp := range mountsUnder(s.Dir) {
		out = append(out, "mount "+mp)
	}
	for _, parent := range hierarchyDirs(filepath.Base(s.Dir)) {
		des, _ := os.ReadDir(parent)
		for _, de := range des {
			if de.IsDir() {
				out = append(out, "cgroup "+filepath.Join(parent, de.Name()))
			}
		}
	}
	return out
}
