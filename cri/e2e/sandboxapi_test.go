package e2e

import (
	"context"
	"fmt"
	"net"
	"syscall"
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

// TestCocoonSandboxAPIShimCrash kills the shim of a sandbox API pod with
// two containers: containerd's `shim delete` for the sandbox kills the
// pod's VM, and once the pod is removed nothing of it is left.
func TestCocoonSandboxAPIShimCrash(t *testing.T) {
	n := startSandboxAPINode(t)
	p := n.runImagelessPod(t, "pod-crash", sandboxAPIHandler)
	app := n.startBusybox(t, p, "app", appWebArgs, nil)
	sidecar := n.startBusybox(t, p, "sidecar", sidecarArgs, nil)
	n.waitLogs(t, sidecar, podPage)
	vm := n.podVM(t, p, app, sidecar)
	// The pod's figures are the sandbox API's metrics: its VM's cgroup.
	n.checkPodStats(t, p, app, sidecar)
	shims := shimsOf(p.id)
	if len(shims) != 1 {
		t.Fatalf("pod %s is served by shims %v, want one", p.id, shims)
	}
	if err := syscall.Kill(shims[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pod's VM killed by shim delete", func() error {
		if processRuns(vm) {
			return fmt.Errorf("VM %d of the pod whose shim was killed still runs", vm)
		}
		return nil
	})
	// CRI learns the containers' exits from containerd's clean-up after
	// the dead shim; its first try to delete their tasks may still meet
	// the closed connection, and it retries with a back-off, as kubelet
	// retries the pod's removal.
	eventually(t, "the pod removed", func() error {
		_, err := n.crictlErr("rmp", "-f", p.id)
		return err
	})
	n.waitIdle(t, "the pod whose shim was killed")
	n.checkNoBase(t, p.id)
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
func (n *node) runImagelessPod(t *testing.T, name, handler string) *pod {
	t.Helper()
	p := &pod{name: name, config: n.podConfig(t, name, nil)}
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
