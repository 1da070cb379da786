package e2e

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare"
)

// pooledPodVMConfig is podVMConfig with a VM restored ahead for the next
// pod (shim.pooled_vm).
const pooledPodVMConfig = podVMConfig + "pooled_vm = true\n"

// TestCocoonPodVMPooled: with shim.pooled_vm a pod's VM is one a spare
// restored ahead, in a network namespace of its own, under both of
// containerd's sandboxers: after a first pod leaves the order, the next
// pod's sandbox claims it (the pod's one hypervisor is the pooled one) and
// its tap moves into the pod's namespace. The app then has the pod's
// address and serves the node there and through a port-forward, a sidecar
// reaches it on 127.0.0.1, all in the one VM; the pod leaves nothing but
// the next pooled VM, and that goes with the node; so does one whose shim
// was killed.
func TestCocoonPodVMPooled(t *testing.T) {
	n := startChainNode(t, nodeOptions{cocoonConfig: pooledPodVMConfig, handlers: []devstack.Handler{{
		Name: sandboxAPIHandler, RuntimeType: devstack.Runtime, Snapshotter: devstack.Snapshotter, Sandboxer: devstack.SandboxerShim,
		Options: map[string]any{"restore": map[string]any{"base_image": chainRef}, "shim": map[string]any{"pooled_vm": true}},
	}}})
	if err := n.stack.Import(context.Background(), images.busyboxTar, devstack.Snapshotter); err != nil {
		t.Fatal(err)
	}
	for _, w := range []*podWorkload{
		{n: n, handler: devstack.CocoonHandler, podVM: n.podVM},
		{n: n, handler: sandboxAPIHandler, podVM: n.podVM, runPod: n.runImagelessPod},
	} {
		t.Run(w.handler, func(t *testing.T) { runPooledPod(t, w) })
	}
}

// runPooledPod runs TestCocoonPodVMPooled's steps with w's handler.
func runPooledPod(t *testing.T, w *podWorkload) {
	n := w.n
	var pooled int
	all := []step{
		{"a first pod orders the VM", func(t *testing.T) {
			p := w.startPod(t, "first")
			n.crictl(t, "rmp", "-f", p.id)
			n.waitIdleBut(t, "the first pod", n.isPool)
		}},
		// A busy machine (CI's) may never be quiet: a claim waits for a
		// restore under way and for the warm-up's step under way.
		{"a pooled VM waits", func(t *testing.T) { pooled = n.awaitPooledVM(t, 5*time.Second) }},
		{"runp claims it", func(t *testing.T) {
			w.runp(t)
			if vm := n.podVM(t, w.p); vm != pooled {
				t.Fatalf("pod %s runs in hypervisor %d, want the pooled VM's %d", w.p.id, vm, pooled)
			}
		}},
		{"app and sidecar", w.appAndSidecar},
		{"the pod's address", func(t *testing.T) {
			n.checkAddress(t, w.app, w.p)
			// The warm-up's placeholder network (TEST-NET-1) is gone.
			if out := n.crictl(t, "exec", "-s", w.app, "sh", "-c", "ip addr; ip route"); strings.Contains(out, "192.0.2.") {
				t.Fatalf("the pooled VM's warm-up network is left in the pod's:\n%s", out)
			}
		}},
		{"served to the node", func(t *testing.T) { n.checkServed(t, w.p.ip) }},
		{"port-forward", w.checkPortForward},
	}
	all = append(all, w.vmStep("one VM")...)
	all = append(all, step{"rmp -f", func(t *testing.T) {
		n.crictl(t, "rmp", "-f", w.p.id)
		n.waitIdleBut(t, "the removed pod", n.isPool)
		if processRuns(w.vm) {
			t.Fatalf("the pod's VM %d survived rmp -f", w.vm)
		}
	}})
	steps(t, append(all, step{"a claimed VM's shim killed", func(t *testing.T) { crashPooledPod(t, w) }}))
}

// crashPooledPod has the next pod claim the pooled VM the last one
// ordered, kills its shim with a container running, and checks the pod
// then leaves nothing behind once removed but the next pooled VM.
func crashPooledPod(t *testing.T, w *podWorkload) {
	n := w.n
	pooled := n.awaitPooledVM(t, 5*time.Second)
	p := w.startPod(t, "crashed")
	ctr := n.startBusybox(t, p, "app", []string{"sleep", "3600"}, nil)
	if vm := n.podVM(t, p, ctr); vm != pooled {
		t.Fatalf("pod %s runs in hypervisor %d, want the pooled VM's %d", p.id, vm, pooled)
	}
	killPodShim(t, n, p, []string{ctr}, pooled)
	n.crictl(t, "rmp", "-f", p.id)
	n.waitIdleBut(t, "the crashed pod", n.isPool)
	if pids := append(vms(p.id, ctr), shimsOf(p.id, ctr)...); len(pids) > 0 || processRuns(pooled) {
		t.Fatalf("the claimed VM %d or shims/VMs %v survived the pod's removal", pooled, pids)
	}
	// The next pooled VM's base is staged for its spare, which runs.
	left := slices.DeleteFunc(n.activeSnapshots(t), func(name string) bool {
		_, rest, ok := strings.Cut(name, spare.PoolPrefix)
		pid, err := strconv.Atoi(rest)
		return ok && err == nil && processRuns(pid)
	})
	if len(left) > 0 {
		t.Fatalf("cocoon snapshotter still has active snapshots %v", left)
	}
}

// checkServed GETs the pod's page at ip:8080 from the node's network
// namespace, over the pod's network.
func (n *node) checkServed(t *testing.T, ip net.IP) {
	t.Helper()
	page, err := n.fetchFromNode(t, net.JoinHostPort(ip.String(), "8080"), "/")
	if err != nil || !strings.Contains(page, podPage) {
		t.Fatalf("the pod's page at %s: %q (%v), want it to hold %q", ip, page, err, podPage)
	}
}
