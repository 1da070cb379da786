package e2e

import (
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testimage"
)

// cpuQuota is what the update steps set (with cpuPeriod: half a CPU).
const (
	cpuQuota  = 50000
	cpuPeriod = 100000
)

// appArgs is the busybox container's command: print the image's random
// file, then wait.
var appArgs = []string{"sh", "-c", "cat " + testimage.RandomFile + "; echo ready; exec sleep 3600"}

// TestRuncPod runs the whole CRI lifecycle of a pod with the runc handler
// from the pause image the test built, with a busybox container: it proves
// the harness (containerd + CRI + CNI in the test's node namespace, crictl,
// the images) on a runtime that works.
func TestRuncPod(t *testing.T) {
	n := startNode(t, nodeOptions{sandboxSnapshotters: []string{devstack.Overlayfs}})
	var p *pod
	var ctr string
	steps(t, []step{
		{"runp", func(t *testing.T) { p = n.runPod(t, "runc-pod", devstack.RuncHandler, nil) }},
		{"create", func(t *testing.T) {
			ctr = n.crictl(t, "create", p.id, n.ctrConfig(t, "app", busyboxRef, appArgs, func(c *runtimeapi.ContainerConfig) {
				c.Linux.SecurityContext = &runtimeapi.LinuxContainerSecurityContext{RunAsUsername: testimage.User}
			}), p.config)
		}},
		{"start", func(t *testing.T) {
			n.crictl(t, "start", ctr)
			n.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_RUNNING)
		}},
		{"logs", func(t *testing.T) { n.waitLogs(t, ctr, images.busybox.RandomContent+"ready") }},
		{"exec -s", func(t *testing.T) {
			want := "uid=1000(app) gid=1000(app) groups=1000(app),1001(extra)"
			if out := n.crictl(t, "exec", "-s", ctr, "id"); out != want {
				t.Fatalf("id in the container = %q, want the image's user: %q", out, want)
			}
			n.checkAddress(t, ctr, p)
		}},
		{"exec -it", func(t *testing.T) { checkTTY(t, n, ctr) }},
		{"inspect", func(t *testing.T) {
			if st := n.inspect(t, ctr); st.Info.Pid <= 0 {
				t.Fatalf("crictl inspect: pid %d, want the container's process", st.Info.Pid)
			}
		}},
		{"node reaches the pod", func(t *testing.T) {
			if err := n.net.Ping(t.Context(), p.ip); err != nil {
				t.Fatal(err)
			}
		}},
		{"stats", func(t *testing.T) { n.checkStats(t, ctr) }},
		{"statsp", func(t *testing.T) { n.checkPodStats(t, p, ctr) }},
		{"update --cpu-quota", func(t *testing.T) { checkUpdate(t, n, ctr, n.inspect(t, ctr).Info.Pid) }},
		{"stop", func(t *testing.T) {
			n.crictl(t, "stop", ctr)
			n.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_EXITED)
		}},
		{"rm", func(t *testing.T) { n.crictl(t, "rm", ctr) }},
		{"stopp", func(t *testing.T) { n.crictl(t, "stopp", p.id) }},
		{"rmp", func(t *testing.T) {
			n.crictl(t, "rmp", p.id)
			n.waitIdle(t, "the removed runc pod")
		}},
	})
}

// step is one step of a pod's lifecycle: a subtest, so a failure names it.
type step struct {
	name string
	run  func(t *testing.T)
}

// steps runs each step as a subtest and stops at the first that fails.
func steps(t *testing.T, all []step) {
	t.Helper()
	for _, s := range all {
		if !t.Run(s.name, s.run) {
			t.Fatalf("step %q failed; later steps not run", s.name)
		}
	}
}

// checkTTY runs a shell on a terminal in container ctr: it must see a
// terminal on stdin and stdout, and its exit code must come back (crictl
// reports it and exits 1).
func checkTTY(t *testing.T, n *node, ctr string) {
	t.Helper()
	out, code := n.execTTY(t, ctr, "sh", "-c", "[ -t 0 ] && [ -t 1 ] && echo on-a-tty; exit 3")
	if code != 1 || !strings.Contains(out, "on-a-tty") || !strings.Contains(out, "exit code 3") {
		t.Fatalf("crictl exec -it: exit %d, terminal showed %q; want on-a-tty and exit code 3", code, out)
	}
}

// checkUpdate sets a CPU quota on container ctr through CRI and checks it
// reached the cgroup that process pid (the container's, or its VM) runs in.
func checkUpdate(t *testing.T, n *node, ctr string, pid int) {
	t.Helper()
	n.crictl(t, "update", "--cpu-quota", itoa(cpuQuota), "--cpu-period", itoa(cpuPeriod), ctr)
	cgroup := n.inspect(t, ctr).Info.RuntimeSpec.Linux.CgroupsPath
	if !strings.HasPrefix(cgroup, n.stack.CgroupParent+"/") {
		t.Fatalf("container cgroup %q, want one under the pod's cgroup parent %s", cgroup, n.stack.CgroupParent)
	}
	checkCPUQuota(t, cgroup, pid, cpuQuota)
}
