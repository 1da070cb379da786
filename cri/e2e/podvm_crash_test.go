package e2e

import (
	"context"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
)

// podCrash is what befalls a running pod VM of TestCocoonPodVMCrash.
type podCrash struct {
	name  string
	crash func(t *testing.T, n *node, p *pod, ctrs []string, vm int)
}

// TestCocoonPodVMCrash: a pod whose VM runs three containers leaves
// nothing behind once removed, after its shim was killed or containerd
// restarted under it (issue 21): no VM, shim, mount, cgroup or snapshot.
func TestCocoonPodVMCrash(t *testing.T) {
	n := startChainNode(t, nodeOptions{cocoonConfig: podVMConfig})
	if err := n.stack.Import(context.Background(), images.busyboxTar, devstack.Snapshotter); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []podCrash{
		{"shim-killed", killPodShim},
		{"containerd-restarted", restartUnderPod},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := n.runPod(t, tc.name, devstack.CocoonHandler, nil)
			var ctrs []string
			for _, name := range []string{"one", "two", "three"} {
				ctrs = append(ctrs, n.startBusybox(t, p, name, []string{"sleep", "3600"}, nil))
			}
			for _, ctr := range ctrs {
				n.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_RUNNING)
			}
			vm := n.podVM(t, p, ctrs...)
			tc.crash(t, n, p, ctrs, vm)
			n.crictl(t, "rmp", "-f", p.id)
			n.waitIdle(t, "the removed pod")
			ids := append([]string{p.id}, ctrs...)
			if pids := append(vms(ids...), shimsOf(ids...)...); len(pids) > 0 || processRuns(vm) {
				t.Fatalf("VM %d or shims/VMs %v survived the pod's removal", vm, pids)
			}
			if active := n.activeSnapshots(t); len(active) > 0 {
				t.Fatalf("cocoon snapshotter still has active snapshots %v", active)
			}
		})
	}
}

// killPodShim kills the shim serving the pod (the one process serving all
// of its tasks) and waits until containerd sees its containers exit.
func killPodShim(t *testing.T, n *node, p *pod, ctrs []string, _ int) {
	shims := shimsOf(append([]string{p.id}, ctrs...)...)
	if len(shims) != 1 {
		t.Fatalf("pod %s is served by shims %v, want exactly one", p.name, shims)
	}
	if err := syscall.Kill(shims[0], syscall.SIGKILL); err != nil {
		t.Fatalf("kill the pod's shim %d: %v", shims[0], err)
	}
	for _, ctr := range ctrs {
		n.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_EXITED)
	}
}

// restartUnderPod restarts containerd: the pod's shim and VM live on, and
// containerd takes its containers back, running in the same VM.
func restartUnderPod(t *testing.T, n *node, p *pod, ctrs []string, vm int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := n.stack.Restart(ctx); err != nil {
		t.Fatalf("restart containerd: %v", err)
	}
	for _, ctr := range ctrs {
		n.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_RUNNING)
	}
	if got := n.podVM(t, p, ctrs...); got != vm {
		t.Fatalf("after containerd's restart the pod's VM is %d, was %d", got, vm)
	}
	if out := n.crictl(t, "exec", "-s", ctrs[0], "echo", "alive"); out != "alive" {
		t.Fatalf("exec in %s after containerd's restart: %q, want alive", ctrs[0], out)
	}
}
