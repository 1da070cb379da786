package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
)

// podVMConfig is restoreConfig with one VM per pod (issue 21): the
// sandbox restores the chain image with the pause image as its root, and
// every container of the pod joins that VM.
const podVMConfig = restoreConfig + `
[shim]
pod_vm = "pod"
`

// What the pod serves on its loopback, and how its memory hog ends.
const (
	podPage   = "cocoon-pod-vm-page"
	podURL    = "http://127.0.0.1:8080/"
	oomLimit  = 32 << 20
	oomExit   = 137 // 128 + SIGKILL
	oomReason = "OOMKilled"
)

var (
	// appWebArgs writes the page and serves it on the pod's loopback.
	appWebArgs = []string{"sh", "-c", "mkdir -p /www && echo " + podPage + " > /www/index.html && exec httpd -f -p 8080 -h /www"}
	// sidecarArgs fetches the page every second, from the same VM.
	sidecarArgs = []string{"sh", "-c", "while true; do wget -q -O- " + podURL + " && echo; sleep 1; done"}
	// oomArgs allocates (and touches: dd reads /dev/zero into it) a 64 MiB
	// buffer; exec makes dd the container's process, so the OOM kill ends it.
	oomArgs = []string{"sh", "-c", "echo filling; exec dd if=/dev/zero of=/dev/null bs=64M count=1"}
)

// TestCocoonPodVM runs a pod in one VM (shim.pod_vm = "pod"): the sandbox
// restores the VM and an init container, an app, a sidecar reaching the app
// on 127.0.0.1, a replaced sidecar and a container killed for memory all
// run in it, each in its own cgroup of the guest.
func TestCocoonPodVM(t *testing.T) {
	n := startChainNode(t, nodeOptions{cocoonConfig: podVMConfig})
	if err := n.stack.Import(context.Background(), images.busyboxTar, devstack.Snapshotter); err != nil {
		t.Fatal(err)
	}
	runPodWorkload(t, n, devstack.CocoonHandler, n.podVM)
}

// TestRuncPodWorkload runs TestCocoonPodVM's workload with the runc
// handler: it proves the workload (the page, the sidecar, the OOM kill, the
// stats) on a runtime that has all of it, so a failure of TestCocoonPodVM
// is the runtime's.
func TestRuncPodWorkload(t *testing.T) {
	n := startNode(t, nodeOptions{sandboxSnapshotters: []string{devstack.Overlayfs}})
	runPodWorkload(t, n, devstack.RuncHandler, nil)
}

// podWorkload is the pod of TestCocoonPodVM, run with handler: an init
// container, an app serving a page, a sidecar fetching it, the sidecar
// replaced, a container killed for memory. podVM, when given, checks that
// the pod with its running containers is one VM and returns its pid.
// runPod, when given, runs the pod instead of node.runPod.
type podWorkload struct {
	n            *node
	handler      string
	podVM        func(*testing.T, *pod, ...string) int
	runPod       func(t *testing.T, name, handler string, edits ...podEdit) *pod
	p            *pod
	app, sidecar string
	vm           int
}

// runPodWorkload runs the workload's steps; with podVM, the pod stays the
// same one VM throughout, and goes with the pod.
func runPodWorkload(t *testing.T, n *node, handler string, podVM func(*testing.T, *pod, ...string) int) {
	runWorkload(t, &podWorkload{n: n, handler: handler, podVM: podVM})
}

// runWorkload runs w's steps.
func runWorkload(t *testing.T, w *podWorkload) {
	n := w.n
	all := []step{{"runp", w.runp}, {"init container", w.initContainer}, {"app and sidecar", w.appAndSidecar},
		{"port-forward", w.checkPortForward}, {"shared volume", w.sharedVolume}, {"memory emptyDir", w.memoryEmptyDir},
		{"live volume", w.liveVolume},
		{"image volume", w.imageVolume}, {"restricted container", w.restricted},
		{"privileged container", w.privileged}}
	all = append(all, w.vmStep("one VM")...)
	all = append(all, step{"resize the pod", w.resize})
	all = append(all, step{"replace the sidecar", w.replaceSidecar})
	all = append(all, w.vmStep("same VM after the sidecar's restart")...)
	all = append(all, step{"OOM", func(t *testing.T) { n.checkPodOOM(t, w.p, w.app) }},
		step{"stats", func(t *testing.T) { n.checkOwnStats(t, w.p, w.app, w.sidecar) }})
	all = append(all, w.vmStep("same VM at the end")...)
	steps(t, append(all, step{"rmp -f", w.remove}))
}

func (w *podWorkload) runp(t *testing.T) {
	w.p = w.startPod(t, "pod-vm")
}

// startPod runs another pod with the workload's handler.
func (w *podWorkload) startPod(t *testing.T, name string, edits ...podEdit) *pod {
	if w.runPod != nil {
		return w.runPod(t, name, w.handler, edits...)
	}
	return w.n.runPod(t, name, w.handler, nil, edits...)
}

func (w *podWorkload) initContainer(t *testing.T) {
	ctr := w.n.startBusybox(t, w.p, "init", []string{"sh", "-c", "echo init done"}, nil)
	if st := w.n.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_EXITED); st.Status.ExitCode != 0 {
		t.Fatalf("init container exited with %d, want 0", st.Status.ExitCode)
	}
	w.n.waitLogs(t, ctr, "init done")
}

func (w *podWorkload) appAndSidecar(t *testing.T) {
	w.app = w.n.startBusybox(t, w.p, "app", appWebArgs, nil)
	w.sidecar = w.n.startBusybox(t, w.p, "sidecar", sidecarArgs, nil)
	w.n.waitState(t, w.app, runtimeapi.ContainerState_CONTAINER_RUNNING)
	w.n.waitLogs(t, w.sidecar, podPage)
}

// sharedVolume runs two containers binding one host directory, as two
// containers of a pod mount one emptyDir: what the first writes in it the
// second reads, and the host sees, and what the host writes the second
// reads.
func (w *podWorkload) sharedVolume(t *testing.T) {
	dir := t.TempDir()
	mount := func(c *runtimeapi.ContainerConfig) {
		c.Mounts = append(c.Mounts, &runtimeapi.Mount{ContainerPath: "/shared", HostPath: dir})
	}
	const msg = "written-by-the-pods-writer"
	writer := w.n.startBusybox(t, w.p, "writer", []string{"sh", "-c", "echo " + msg + " > /shared/msg"}, mount)
	if st := w.n.waitState(t, writer, runtimeapi.ContainerState_CONTAINER_EXITED); st.Status.ExitCode != 0 {
		t.Fatalf("the writer exited with %d, want 0", st.Status.ExitCode)
	}
	// A host directory is the host's, as under runc: the writer's file is
	// there, and what the host writes later shows in the pod.
	if b, err := os.ReadFile(filepath.Join(dir, "msg")); err != nil || strings.TrimSpace(string(b)) != msg {
		t.Errorf("the writer's file on the host: %q, %v", b, err)
	}
	const later = "written-by-the-host-later"
	reader := w.n.startBusybox(t, w.p, "reader", []string{"sh", "-c", "cat /shared/msg; until cat /shared/later; do sleep 0.2; done"}, mount)
	w.n.waitLogs(t, reader, msg)
	if err := os.WriteFile(filepath.Join(dir, "later"), []byte(later+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w.n.waitLogs(t, reader, later)
	for _, id := range []string{writer, reader} {
		w.n.removeExited(t, id)
	}
}

// memoryEmptyDir runs two containers on a memory-backed emptyDir as
// kubelet makes one, a tmpfs of its sizeLimit (1 MiB): what one writes the
// other reads, and a write past the limit fails, as under runc.
func (w *podWorkload) memoryEmptyDir(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	mount := func(c *runtimeapi.ContainerConfig) {
		c.Mounts = append(c.Mounts, &runtimeapi.Mount{ContainerPath: "/cache", HostPath: dir})
	}
	writer := w.n.startBusybox(t, w.p, "mem-writer", []string{"sh", "-c",
		"head -c 524288 /dev/zero > /cache/half && echo half-written; head -c 1048576 /dev/zero > /cache/more || echo over-the-limit"}, mount)
	w.n.waitLogs(t, writer, "half-written")
	w.n.waitLogs(t, writer, "over-the-limit")
	reader := w.n.startBusybox(t, w.p, "mem-reader", []string{"sh", "-c", "echo read $(wc -c < /cache/half)"}, mount)
	w.n.waitLogs(t, reader, "read 524288")
	for _, id := range []string{writer, reader} {
		w.n.removeExited(t, id)
	}
}

// liveVolume runs a container reading a ConfigMap-shaped volume while the
// host updates it as kubelet does (checkLiveVolume).
func (w *podWorkload) liveVolume(t *testing.T) {
	dir, mount := liveVolumeDir(t, true)
	reader := w.n.startBusybox(t, w.p, "cfg-reader", volumeReaderArgs, mount)
	w.n.checkLiveVolume(t, reader, dir)
	w.n.crictl(t, "rm", "-f", reader)
}

// imageVolume runs a container with the busybox image mounted read-only
// at /vol, as Kubernetes' image volumes are: the image's files are there
// and cannot be written.
func (w *podWorkload) imageVolume(t *testing.T) {
	ctr := w.n.startBusybox(t, w.p, "image-volume", []string{"sh", "-c",
		"test -x /vol/bin/sh && echo image-files-there; touch /vol/x || echo image-read-only"},
		func(c *runtimeapi.ContainerConfig) {
			c.Mounts = append(c.Mounts, &runtimeapi.Mount{ContainerPath: "/vol", Readonly: true,
				Image: &runtimeapi.ImageSpec{Image: busyboxRef}})
		})
	w.n.waitLogs(t, ctr, "image-files-there")
	w.n.waitLogs(t, ctr, "image-read-only")
	w.n.removeExited(t, ctr)
}

// removeExited removes ctr once it has exited on its own: crictl rm -f on
// a container in the middle of exiting can find it neither running nor
// stopped.
func (n *node) removeExited(t *testing.T, ctr string) {
	t.Helper()
	n.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_EXITED)
	n.crictl(t, "rm", ctr)
}

// replaceSidecar stops and removes the sidecar and runs it again under the
// same name, as the kubelet restarts it: the next attempt, in a log of its
// own, so the page in it is the new sidecar's.
func (w *podWorkload) replaceSidecar(t *testing.T) {
	w.n.crictl(t, "stop", w.sidecar)
	w.n.waitState(t, w.sidecar, runtimeapi.ContainerState_CONTAINER_EXITED)
	w.n.crictl(t, "rm", w.sidecar)
	w.sidecar = w.n.startBusybox(t, w.p, "sidecar", sidecarArgs, func(c *runtimeapi.ContainerConfig) {
		c.Metadata.Attempt = 1
		c.LogPath = "sidecar-1.log"
	})
	w.n.waitLogs(t, w.sidecar, podPage)
}

// vmStep is a step checking that the pod is one VM, the one it was at the
// first such step; none without podVM.
func (w *podWorkload) vmStep(name string) []step {
	if w.podVM == nil {
		return nil
	}
	return []step{{name, func(t *testing.T) {
		got := w.podVM(t, w.p, w.app, w.sidecar)
		if w.vm != 0 && got != w.vm {
			t.Fatalf("the pod's VM is %d, was %d", got, w.vm)
		}
		w.vm = got
	}}}
}

// remove force-removes the pod: nothing of it may be left, its VM included.
func (w *podWorkload) remove(t *testing.T) {
	w.n.crictl(t, "rmp", "-f", w.p.id)
	w.n.waitIdle(t, "the removed pod")
	if w.vm != 0 && processRuns(w.vm) {
		t.Fatalf("the pod's VM %d survived rmp -f", w.vm)
	}
}

// startBusybox creates and starts a busybox container running args in pod
// p and returns its ID; edit, if given, changes its config.
func (n *node) startBusybox(t *testing.T, p *pod, name string, args []string, edit func(*runtimeapi.ContainerConfig)) string {
	t.Helper()
	ctr := n.crictl(t, "create", p.id, n.ctrConfig(t, name, busyboxRef, args, edit), p.config)
	n.crictl(t, "start", ctr)
	return ctr
}

// checkPodOOM runs a container over its memory limit in pod p: the guest's
// OOM killer ends it (exit 137, reason OOMKilled), and the app container
// app, in the same VM, still serves.
func (n *node) checkPodOOM(t *testing.T, p *pod, app string) {
	t.Helper()
	hog := n.startBusybox(t, p, "hog", oomArgs, func(c *runtimeapi.ContainerConfig) {
		c.Linux.Resources = &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: oomLimit}
	})
	n.waitState(t, hog, runtimeapi.ContainerState_CONTAINER_EXITED)
	var st struct {
		Status struct {
			ExitCode int32  `json:"exitCode"`
			Reason   string `json:"reason"`
		} `json:"status"`
	}
	decode(t, n.crictl(t, "inspect", "-o", "json", hog), &st)
	if st.Status.ExitCode != oomExit || st.Status.Reason != oomReason {
		logs, _ := n.crictlErr("logs", hog)
		t.Fatalf("a container over its %d MiB limit exited with %d, reason %q; want %d, %q (its logs: %q)",
			oomLimit>>20, st.Status.ExitCode, st.Status.Reason, oomExit, oomReason, logs)
	}
	if out := n.crictl(t, "exec", "-s", app, "wget", "-q", "-O-", podURL); !strings.Contains(out, podPage) {
		t.Fatalf("wget %s in the app after the OOM kill: %q, want the page %q", podURL, out, podPage)
	}
}

// ownWorkingSet bounds a busybox container's working set: its own
// cgroup's in the guest is a few MiB, where the VM's (what a runtime that
// reported the pod's figures for each container would show) holds the
// guest's kernel, agent and page cache.
const ownWorkingSet = 16 << 20

// checkOwnStats checks crictl stats of pod p: each of ctrs (its running
// containers) has its own non-zero figures, the memory of its cgroup in the
// guest. Two small containers can have the same working set by chance, so
// each is held under ownWorkingSet rather than told apart.
func (n *node) checkOwnStats(t *testing.T, p *pod, ctrs ...string) {
	t.Helper()
	var out struct {
		Stats []ctrUsage `json:"stats"`
	}
	decode(t, n.crictl(t, "stats", "-o", "json", "-p", p.id), &out)
	for _, id := range ctrs {
		i := slices.IndexFunc(out.Stats, func(u ctrUsage) bool { return u.Attributes.ID == id })
		if i < 0 {
			t.Fatalf("crictl stats -p %s lists no stats for container %s: %+v", p.id, id, out.Stats)
		}
		if err := out.Stats[i].check("container " + id); err != nil {
			t.Fatal(err)
		}
		if ws, _ := strconv.ParseUint(out.Stats[i].Memory.WorkingSetBytes.Value, 10, 64); ws >= ownWorkingSet {
			t.Fatalf("container %s has a working set of %d bytes: want its own cgroup's, under %d", id, ws, ownWorkingSet)
		}
	}
}

// sandboxStatus is what crictl inspectp -o json says of a sandbox's task.
type sandboxStatus struct {
	Info struct {
		Pid         int `json:"pid"`
		RuntimeSpec struct {
			Linux struct {
				Namespaces []struct {
					Type string `json:"type"`
					Path string `json:"path"`
				} `json:"namespaces"`
			} `json:"linux"`
		} `json:"runtimeSpec"`
	} `json:"info"`
}

// podVM checks that exactly one hypervisor process runs for pod p, whose
// running containers are ctrs, and that the sandbox and every one of ctrs
// report it as their pid; it returns its pid. A QEMU process is the pod's
// when a shim serving the pod started it or its command line names the pod
// (vms), when its cgroup is the sandbox's or a container's, or when it is
// in the pod's network namespace.
func (n *node) podVM(t *testing.T, p *pod, ctrs ...string) int {
	t.Helper()
	var sb sandboxStatus
	decode(t, n.crictl(t, "inspectp", "-o", "json", p.id), &sb)
	ids := append([]string{p.id}, ctrs...)
	netns := ""
	for _, ns := range sb.Info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" {
			netns = ns.Path
		}
	}
	pids := vms(ids...)
	for _, pr := range processes() {
		if strings.HasPrefix(filepath.Base(pr.args[0]), "qemu-system") && (inCgroupOf(pr.pid, ids) || inNetNS(pr.pid, netns)) && !slices.Contains(pids, pr.pid) {
			pids = append(pids, pr.pid)
		}
	}
	if len(pids) != 1 {
		t.Fatalf("pod %s with containers %v runs %d hypervisor processes (%v), want exactly 1", p.name, ctrs, len(pids), pids)
	}
	if sb.Info.Pid != pids[0] {
		t.Fatalf("crictl inspectp %s: pid %d, want the pod's VM %d", p.id, sb.Info.Pid, pids[0])
	}
	for _, ctr := range ctrs {
		if pid := n.inspect(t, ctr).Info.Pid; pid != pids[0] {
			t.Fatalf("crictl inspect %s: pid %d, want the pod's VM %d", ctr, pid, pids[0])
		}
	}
	return pids[0]
}

// inCgroupOf reports whether process pid's cgroup, in any hierarchy, is
// named after one of ids (CRI names a task's cgroup after it).
func inCgroupOf(pid int, ids []string) bool {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		path := line[strings.LastIndexByte(line, ':')+1:]
		if slices.ContainsFunc(ids, func(id string) bool { return strings.Contains(path, id) }) {
			return true
		}
	}
	return false
}

// inNetNS reports whether process pid is in the network namespace bound at
// path.
func inNetNS(pid int, path string) bool {
	if path == "" {
		return false
	}
	want, err := os.Stat(path)
	if err != nil {
		return false
	}
	got, err := os.Stat(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return false
	}
	w, g := want.Sys().(*syscall.Stat_t), got.Sys().(*syscall.Stat_t)
	return w.Dev == g.Dev && w.Ino == g.Ino
}
