package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
)

// resize resizes the pod in place (UpdatePodSandboxResources, which kubelet
// calls after it resized the pod's cgroup). Every handler takes it:
// containerd's podsandbox sandboxer has nothing to do; under the sandbox
// API the shim puts the pod's limits on its VM's cgroup (memory plus the
// hypervisor's headroom) and refuses a memory limit the guest's memory
// does not fit in, leaving the limits as they were.
func (w *podWorkload) resize(t *testing.T) {
	rt := criClient(t, w.n.stack.Address)
	resize := func(memory int64) error {
		_, err := rt.UpdatePodSandboxResources(context.Background(), &runtimeapi.UpdatePodSandboxResourcesRequest{
			PodSandboxId: w.p.id,
			Resources:    &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: memory, CpuPeriod: 100000, CpuQuota: 150000},
		})
		return err
	}
	const limit = 1 << 30
	if err := resize(limit); err != nil {
		t.Fatalf("resize of a %s pod: %v", w.handler, err)
	}
	if w.handler != sandboxAPIHandler {
		return
	}
	memory, cpu := cgroupOfPID(t, w.vm, "memory"), cgroupOfPID(t, w.vm, "cpu")
	want := strconv.Itoa(limit + int(config.Default().Shim.MemoryHeadroom))
	if got := cgroupFile(t, "memory", memory, "memory.limit_in_bytes"); got != want {
		t.Fatalf("the pod VM's memory limit is %s after the resize, want %s (the pod's plus the headroom)", got, want)
	}
	if got := cgroupFile(t, "cpu", cpu, "cpu.cfs_quota_us"); got != "150000" {
		t.Fatalf("the pod VM's CPU quota is %s after the resize, want 150000", got)
	}
	err := resize(64 << 20)
	if err == nil || !strings.Contains(err.Error(), "below the snapshot's guest memory") {
		t.Fatalf("resize of the pod to 64MiB: %v, want a refusal naming the guest's memory", err)
	}
	if got := cgroupFile(t, "memory", memory, "memory.limit_in_bytes"); got != want {
		t.Fatalf("a refused resize left the pod VM's memory limit at %s, want %s", got, want)
	}
}

// cgroupOfPID is the path of process pid's cgroup in controller's v1
// hierarchy.
func cgroupOfPID(t *testing.T, pid int, controller string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && strings.Contains(","+parts[1]+",", ","+controller+",") {
			return parts[2]
		}
	}
	t.Fatalf("process %d has no cgroup with the %s controller: %s", pid, controller, data)
	return ""
}
