package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// execTTY runs `crictl exec -it id args...` on a pseudo-terminal, as a
// user at a terminal would, and returns what the terminal showed and
// crictl's exit code.
func (n *node) execTTY(t *testing.T, id string, args ...string) (string, int) {
	t.Helper()
	argv := append(n.stack.CrictlArgs(), append([]string{"exec", "-it", id}, args...)...)
	return testenv.RunOnPty(t, exec.Command(argv[0], argv[1:]...))
}

// cgroupFile reads file of cgroup path in controller's v1 hierarchy.
func cgroupFile(t *testing.T, controller, path, file string) string {
	t.Helper()
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		for _, opt := range strings.Split(m.VFSOptions, ",") {
			if opt == controller {
				data, err := os.ReadFile(filepath.Join(m.Mountpoint, path, file))
				if err != nil {
					t.Fatal(err)
				}
				return strings.TrimSpace(string(data))
			}
		}
	}
	t.Fatalf("no cgroup v1 hierarchy has the %s controller", controller)
	return ""
}

// checkCPUQuota checks that the CFS quota of cgroup path is quota and that
// pid runs in that cgroup.
func checkCPUQuota(t *testing.T, path string, pid, quota int) {
	t.Helper()
	if got := cgroupFile(t, "cpu", path, "cpu.cfs_quota_us"); got != strconv.Itoa(quota) {
		t.Fatalf("cgroup %s cpu.cfs_quota_us = %s, want %d", path, got, quota)
	}
	procs := strings.Fields(cgroupFile(t, "cpu", path, "cgroup.procs"))
	for _, p := range procs {
		if p == strconv.Itoa(pid) {
			return
		}
	}
	t.Fatalf("process %d is not in cgroup %s (it holds %v)", pid, path, procs)
}

func itoa(i int) string { return strconv.Itoa(i) }
