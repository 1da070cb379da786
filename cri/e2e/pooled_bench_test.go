package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/bench"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/cpuload"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare"
)

// pooledHandler is the cocoon handler (a VM per container),
// pooledPodVMHandler the one VM per pod and pooledSandboxAPIHandler the
// one VM per pod under containerd's sandbox API, each with a pooled VM
// waiting (shim.pooled_vm): what a pod's start costs when its VM, or its
// container's, was restored ahead.
const (
	pooledHandler           = "cocoon-pooled"
	pooledPodVMHandler      = "cocoon-pod-pooled"
	pooledSandboxAPIHandler = "cocoon-sandbox-api-pooled"
)

// Bounds of the wait for a pooled VM before each pod: its spare's start
// and restore, then a quiet machine (its warm-up at idle priority done).
const (
	poolFillWait  = 90 * time.Second
	poolQuietWait = 30 * time.Second
)

// writePooledConfigs writes the node's cocoon config at base with pooled
// VMs, a VM per container to container and one VM per pod to pod.
func writePooledConfigs(b *testing.B, base, container, pod string) {
	writeShimConfig(b, base, container, func(s *config.Shim) { s.PooledVM = true })
	writePodVMConfig(b, base, pod, func(s *config.Shim) { s.PooledVM, s.WarmRunc, s.OwnInit = true, true, true })
}

// benchPooledPods is benchPods with a pooled VM waiting, warmed, before
// each pod (the wait not timed), and reports the share of pods whose VM
// was the pooled one. A handler's first pod (primed false), which leaves
// the order for the next, finds none: the bench's first run, of one pod,
// is that one.
func benchPooledPods(b *testing.B, n *node, rt runtimeapi.RuntimeServiceClient, handler string, limit int64, primed *bool) {
	if handler != pooledHandler {
		limit = 0
	}
	var runp, start time.Duration
	claimed := 0
	for i := range b.N {
		b.StopTimer()
		pooled := 0
		if *primed {
			pooled = n.awaitPooledVM(b, poolQuietWait)
		}
		*primed = true
		b.StartTimer()
		pod := n.startPod(b, rt, handler+"-"+strconv.Itoa(i), handler, limit, 0)
		b.StopTimer()
		runp, start = runp+pod.runp, start+pod.start
		// A pooled VM the pod did not take is closed at once.
		if pooled != 0 && processRuns(pooled) {
			claimed++
		}
		n.removePodKeepingPool(b, rt, pod)
	}
	reportMs(b, "runp-ms/op", runp)
	reportMs(b, "start-ms/op", start)
	b.ReportMetric(float64(claimed)/float64(b.N), "claimed/op")
}

// awaitPooledVM waits until a spare holds a pooled VM whose hypervisor
// runs and the machine is quiet (its fill and warm-up done), quietWait at
// most for that, and returns the hypervisor's pid.
func (n *node) awaitPooledVM(t testing.TB, quietWait time.Duration) int {
	began := time.Now()
	var pid int
	for pid = n.pooledHypervisor(); pid == 0; pid = n.pooledHypervisor() {
		if time.Since(began) > poolFillWait {
			des, _ := os.ReadDir(n.poolDir())
			names := make([]string, 0, len(des))
			for _, de := range des {
				names = append(names, de.Name())
			}
			t.Fatalf("no pooled VM in %s after %v: it has %v; in use: %v", n.poolDir(), poolFillWait, names, n.stack.InUse())
		}
		time.Sleep(100 * time.Millisecond)
	}
	for quiet := time.Now(); time.Since(quiet) < quietWait; {
		if cpuload.Busy(500*time.Millisecond) < quietBusy {
			break
		}
	}
	return pid
}

// pooledHypervisor is the pid of a pooled VM's hypervisor, 0 if none runs.
func (n *node) pooledHypervisor() int {
	if vms, _ := bench.PooledProcesses(n.poolDir()); len(vms) > 0 {
		return vms[0]
	}
	return 0
}

// quietBusy is the share of the machine's CPU time below which it counts
// as quiet.
const quietBusy = 0.15

// poolDir is where the CRI namespace's pooled VMs have their run dirs.
func (n *node) poolDir() string { return filepath.Join(n.stack.RunDir, devstack.CRINamespace) }

// removePodKeepingPool is removePod for a handler with pooled VMs: what
// is left must be the pool's (the VM a spare restored ahead).
func (n *node) removePodKeepingPool(b *testing.B, rt runtimeapi.RuntimeServiceClient, pod benchPod) {
	n.stopAndRemovePod(b, rt, pod)
	n.waitIdleBut(b, "the bench's pod", n.isPool)
}

// isPool says whether a line of devstack.Stack.InUse is a pooled VM's:
// its command line names a pooled VM's run dir.
func (n *node) isPool(line string) bool {
	return strings.Contains(line, filepath.Join(n.poolDir(), spare.PoolPrefix))
}
