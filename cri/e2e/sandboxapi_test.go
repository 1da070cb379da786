package e2e

import (
	"context"
	"net"
	"testing"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/baseimage"
)

// sandboxAPIHandler is a cocoon handler whose pods go through containerd's
// sandbox API (sandboxer = "shim"): the shim restores the pod's VM with no
// pause image, and the pod's containers join it.
const sandboxAPIHandler = "cocoon-sandbox-api"

// TestCocoonSandboxAPI runs TestCocoonPodVM's workload with sandboxer =
// "shim": the same steps, the pod one VM throughout and nothing left after
// rmp -f. The handler's config is inline (its runtime options' config
// body), which the shim reads from containerd's sandbox store.
func TestCocoonSandboxAPI(t *testing.T) {
	n := startSandboxAPINode(t)
	w := &podWorkload{n: n, handler: sandboxAPIHandler, podVM: n.podVM, runPod: n.runImagelessPod}
	runWorkload(t, w)
	n.checkNoBase(t, w.p.id)
}

// TestCocoonSandboxAPICrash: a sandbox API pod with an app and a sidecar,
// its figures in crictl statsp (the sandbox API's metrics, the VM's
// cgroup), leaves nothing once removed after its shim was killed
// (containerd's `shim delete` for the sandbox kills the VM) or containerd
// restarted under it (the pod runs on in the same VM): TestCocoonPodVMCrash's
// crashes.
func TestCocoonSandboxAPICrash(t *testing.T) {
	n := startSandboxAPINode(t)
	for _, tc := range []podCrash{
		{"shim-killed", killPodShim},
		{"containerd-restarted", restartUnderPod},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := n.runImagelessPod(t, tc.name, sandboxAPIHandler)
			ctrs := []string{n.startBusybox(t, p, "app", appWebArgs, nil), n.startBusybox(t, p, "sidecar", sidecarArgs, nil)}
			n.waitLogs(t, ctrs[1], podPage)
			vm := n.podVM(t, p, ctrs...)
			n.checkPodStats(t, p, ctrs...)
			tc.crash(t, n, p, ctrs, vm)
			n.crictl(t, "rmp", "-f", p.id)
			n.waitIdle(t, "the removed pod")
			if processRuns(vm) {
				t.Fatalf("the pod's VM %d survived its removal", vm)
			}
			n.checkNoBase(t, p.id)
		})
	}
}

// startSandboxAPINode starts a node with the sandbox API handler and the
// busybox image in the cocoon snapshotter.
func startSandboxAPINode(t *testing.T) *node {
	t.Helper()
	n := startChainNode(t, nodeOptions{cocoonConfig: cocoonConfig, handlers: []devstack.Handler{{
		Name: sandboxAPIHandler, RuntimeType: devstack.Runtime, Snapshotter: devstack.Snapshotter,
		PodAnnotations: []string{"io.cocoon.*"}, Sandboxer: devstack.SandboxerShim,
		Options: map[string]any{"restore": map[string]any{"allow_annotation": true, "strict": true, "base_image": chainRef}},
	}}})
	if err := n.stack.Import(context.Background(), images.busyboxTar, devstack.Snapshotter); err != nil {
		t.Fatal(err)
	}
	return n
}

// runImagelessPod runs a pod whose sandbox has no image (no pause
// container: the sandbox API's pod VM) and checks it is ready with an
// address of the node's network.
func (n *node) runImagelessPod(t *testing.T, name, handler string, edits ...podEdit) *pod {
	t.Helper()
	p := &pod{name: name, config: n.podConfig(t, name, nil, edits...)}
	p.id = n.crictl(t, "runp", "--runtime", handler, p.config)
	st := n.inspectPod(t, p.id)
	if st.Status.State != runtimeapi.PodSandboxState_SANDBOX_READY.String() || st.Info.Image != "" {
		t.Fatalf("pod %s is %s with image %q, want SANDBOX_READY with none", name, st.Status.State, st.Info.Image)
	}
	if p.ip = net.ParseIP(st.Status.Network.IP); p.ip == nil || !n.net.Subnet.Contains(p.ip) {
		t.Fatalf("pod %s has address %q, want one in the CNI network %s", name, st.Status.Network.IP, n.net.Subnet)
	}
	return p
}

// checkNoBase checks that the base snapshot pod id's VM was restored from,
// and the lease that kept it, are gone.
func (n *node) checkNoBase(t *testing.T, id string) {
	t.Helper()
	cl, err := n.stack.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx := namespaces.WithNamespace(context.Background(), devstack.CRINamespace)
	key := baseimage.Key(id)
	if _, err := cl.SnapshotService(devstack.Snapshotter).Stat(ctx, key); !errdefs.IsNotFound(err) {
		t.Errorf("base snapshot %s of the removed pod: %v, want it gone", key, err)
	}
	ls, err := cl.LeasesService().List(ctx, "id=="+key)
	if err != nil || len(ls) != 0 {
		t.Errorf("leases %v (%v) of the removed pod, want none", ls, err)
	}
}
