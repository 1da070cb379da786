package e2e

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/restore"
)

// The cocoon handler's tests (issue 10's acceptance). Run them alone with
// go test -run TestCocoon ./cri/e2e/.

// restoreConfig lets a pod choose the restore mode by annotation, makes a
// mode QEMU cannot do an error, not a fallback, and runs ordinary images
// in VMs restored from the chain image.
const restoreConfig = `
[restore]
allow_annotation = true
strict = true
base_image = "` + chainRef + `"
`

// cocoonConfig is restoreConfig with a VM for each container: these tests
// run the chain image itself, a snapshot image, which restores its own.
const cocoonConfig = restoreConfig + `
[shim]
pod_vm = "container"
`

// cocoonImage is what the cocoon handler's containers run: the chain image
// (the project's guest, baked).
const cocoonImage = chainRef

// cocoonMemoryLimit is the containers' memory limit: room for the guest.
const cocoonMemoryLimit = 2 * guestMemory

// badOptHandler is a cocoon handler whose runtime options hold a key the
// shim does not know. containerd drops unknown keys next to ConfigPath, so
// it has none: containerd then sends the whole table as ConfigBody.
const badOptHandler = "cocoon-badopt"

// cocoonArgs is the cocoon container's command.
var cocoonArgs = []string{"sh", "-c", "echo ready; exec sleep 3600"}

// startCocoonNode starts a node whose cocoon snapshotter has the chain
// image and the sandbox image.
func startCocoonNode(t *testing.T, handlers ...devstack.Handler) *node {
	t.Helper()
	return startChainNode(t, nodeOptions{cocoonConfig: cocoonConfig, handlers: handlers})
}

// startChainNode starts a node shaped by opts whose cocoon snapshotter has
// the chain image and the sandbox image.
func startChainNode(t testing.TB, opts nodeOptions) *node {
	t.Helper()
	archive := chainImage(t)
	n := startNode(t, opts)
	if err := n.stack.Import(context.Background(), archive, devstack.Snapshotter); err != nil {
		t.Fatal(err)
	}
	return n
}

// createCocoon creates a container of the cocoon image in pod p; edit, if
// given, changes its config.
func (n *node) createCocoon(t *testing.T, p *pod, name string, edit func(*runtimeapi.ContainerConfig)) string {
	t.Helper()
	cfg := n.ctrConfig(t, name, cocoonImage, cocoonArgs, func(c *runtimeapi.ContainerConfig) {
		c.Linux.Resources = &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: cocoonMemoryLimit}
		if edit != nil {
			edit(c)
		}
	})
	return n.crictl(t, "create", p.id, cfg, p.config)
}

// startCocoon starts container ctr and waits until it runs and logs.
func (n *node) startCocoon(t *testing.T, ctr string) {
	t.Helper()
	n.crictl(t, "start", ctr)
	n.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_RUNNING)
}

// TestCocoonPod runs the whole CRI lifecycle of a cocoon pod: the sandbox
// from the ordinary pause image, one container restored into exactly one VM
// that has the pod's address.
func TestCocoonPod(t *testing.T) {
	n := startCocoonNode(t)
	var p *pod
	var ctr string
	var vm int
	steps(t, []step{
		{"runp", func(t *testing.T) { p = n.runPod(t, "cocoon-pod", devstack.CocoonHandler, nil) }},
		{"create", func(t *testing.T) { ctr = n.createCocoon(t, p, "app", nil) }},
		{"start", func(t *testing.T) { n.startCocoon(t, ctr) }},
		{"one VM", func(t *testing.T) { vm = oneVM(t, p, ctr) }},
		{"logs", func(t *testing.T) { n.waitLogs(t, ctr, "ready") }},
		{"exec -s", func(t *testing.T) { n.checkAddress(t, ctr, p) }},
		{"exec -it", func(t *testing.T) { checkTTY(t, n, ctr) }},
		{"inspect", func(t *testing.T) {
			if st := n.inspect(t, ctr); st.Info.Pid != vm {
				t.Fatalf("crictl inspect: pid %d, want the VM's %d", st.Info.Pid, vm)
			}
		}},
		{"stats", func(t *testing.T) { n.checkStats(t, ctr) }},
		{"statsp", func(t *testing.T) { n.checkPodStats(t, p, ctr) }},
		{"update --cpu-quota", func(t *testing.T) { checkUpdate(t, n, ctr, vm) }},
		{"stop", func(t *testing.T) {
			n.crictl(t, "stop", ctr)
			n.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_EXITED)
		}},
		{"rm", func(t *testing.T) { n.crictl(t, "rm", ctr) }},
		{"stopp", func(t *testing.T) { n.crictl(t, "stopp", p.id) }},
		{"rmp", func(t *testing.T) {
			n.crictl(t, "rmp", p.id)
			n.waitIdle(t, "the removed cocoon pod")
		}},
	})
}

// TestCocoonBesideRunc runs a runc pod and a cocoon pod from the same pause
// image on one node at the same time, each with its own address.
func TestCocoonBesideRunc(t *testing.T) {
	n := startCocoonNode(t)
	type running struct {
		p   *pod
		ctr string
	}
	var runc, cocoon running
	steps(t, []step{
		{"runc pod", func(t *testing.T) {
			runc.p = n.runPod(t, "runc-pod", devstack.RuncHandler, nil)
			runc.ctr = n.crictl(t, "create", runc.p.id, n.ctrConfig(t, "runc-app", busyboxRef, appArgs, nil), runc.p.config)
			n.crictl(t, "start", runc.ctr)
			n.waitState(t, runc.ctr, runtimeapi.ContainerState_CONTAINER_RUNNING)
		}},
		{"cocoon pod", func(t *testing.T) {
			cocoon.p = n.runPod(t, "cocoon-pod", devstack.CocoonHandler, nil)
			cocoon.ctr = n.createCocoon(t, cocoon.p, "cocoon-app", nil)
			n.startCocoon(t, cocoon.ctr)
		}},
		{"both run", func(t *testing.T) {
			if runc.p.ip.Equal(cocoon.p.ip) {
				t.Fatalf("both pods have %s", runc.p.ip)
			}
			for _, r := range []running{runc, cocoon} {
				n.waitState(t, r.ctr, runtimeapi.ContainerState_CONTAINER_RUNNING)
				n.checkAddress(t, r.ctr, r.p)
			}
			oneVM(t, cocoon.p, cocoon.ctr)
		}},
		{"rmp", func(t *testing.T) {
			n.crictl(t, "rmp", "-f", runc.p.id, cocoon.p.id)
			n.waitIdle(t, "the removed pods")
		}},
	})
}

// TestCocoonRestoreModeAnnotation: the pod annotation io.cocoon.restore-mode
// picks the restore mode, as the task's restore report shows.
func TestCocoonRestoreModeAnnotation(t *testing.T) {
	n := startCocoonNode(t)
	for _, mode := range []string{"copy", "mmap"} {
		t.Run(mode, func(t *testing.T) {
			p := n.runPod(t, "mode-"+mode, devstack.CocoonHandler, map[string]string{restore.AnnotationMode: mode})
			ctr := n.createCocoon(t, p, "app-"+mode, nil)
			n.startCocoon(t, ctr)
			if r := n.report(t, ctr); string(r.Plan.Mode) != mode {
				t.Fatalf("%s restored in %q mode (reasons %v), want %s", ctr, r.Plan.Mode, r.Plan.Reasons, mode)
			}
			n.crictl(t, "rmp", "-f", p.id)
			n.waitIdle(t, "the "+mode+" pod")
		})
	}
}

// TestCocoonBadInput: a pod or container the runtime cannot run fails with
// an error that says why, leaves nothing running, and is removable; a pod
// asking for a namespace of the host's fails at RunPodSandbox, naming the
// field.
func TestCocoonBadInput(t *testing.T) {
	n := startCocoonNode(t, devstack.Handler{
		Name: badOptHandler, RuntimeType: devstack.Runtime, Snapshotter: devstack.Snapshotter,
		PodAnnotations: []string{"io.cocoon.*"}, Options: map[string]any{"NoSuchOption": true},
	})
	for _, tc := range []struct {
		name        string
		handler     string
		annotations map[string]string
		memory      int64
		failsAt     []string // the steps that may fail
		want        string   // in that step's error
		// hostNS, when set, asks for a namespace of the host's.
		hostNS func(*runtimeapi.NamespaceOption)
	}{
		{"mode the config forbids", devstack.CocoonHandler, map[string]string{restore.AnnotationMode: "ondemand"}, cocoonMemoryLimit,
			[]string{"create", "start"}, "ondemand", nil},
		{"memory below the guest", devstack.CocoonHandler, nil, guestMemory / 4, []string{"create", "start"}, "memory limit", nil},
		{"unknown runtime option", badOptHandler, nil, cocoonMemoryLimit, []string{"runp", "create", "start"}, "NoSuchOption", nil},
		{"host network", devstack.CocoonHandler, nil, cocoonMemoryLimit, []string{"runp"}, "(hostNetwork: true)",
			func(o *runtimeapi.NamespaceOption) { o.Network = runtimeapi.NamespaceMode_NODE }},
		{"host IPC", devstack.CocoonHandler, nil, cocoonMemoryLimit, []string{"runp"}, "(hostIPC: true)",
			func(o *runtimeapi.NamespaceOption) { o.Ipc = runtimeapi.NamespaceMode_NODE }},
		{"host PID", devstack.CocoonHandler, nil, cocoonMemoryLimit, []string{"runp"}, "(hostPID: true)",
			func(o *runtimeapi.NamespaceOption) { o.Pid = runtimeapi.NamespaceMode_NODE }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := strings.ReplaceAll(tc.name, " ", "-")
			cfg := n.podSandboxConfig(name, tc.annotations)
			if tc.hostNS != nil {
				ns := &runtimeapi.NamespaceOption{}
				tc.hostNS(ns)
				cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: ns}
			}
			p := &pod{name: name, config: n.writeJSON(t, name+"-pod.json", cfg)}
			var ctr string
			step, err := firstError([]namedStep{
				{"runp", func() error { return n.crictlID(&p.id, "runp", "--runtime", tc.handler, p.config) }},
				{"create", func() error {
					cfg := n.ctrConfig(t, name, cocoonImage, cocoonArgs, func(c *runtimeapi.ContainerConfig) {
						c.Linux.Resources = &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: tc.memory}
					})
					return n.crictlID(&ctr, "create", p.id, cfg, p.config)
				}},
				{"start", func() error { _, err := n.crictlErr("start", ctr); return err }},
			})
			if err == nil {
				t.Fatalf("runp, create and start all succeeded; want one of %v to fail naming %q", tc.failsAt, tc.want)
			}
			if !slices.Contains(tc.failsAt, step) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%s failed with %v; want one of %v to fail naming %q", step, err, tc.failsAt, tc.want)
			}
			if pids := vms(p.id, ctr); len(pids) > 0 {
				t.Fatalf("VMs %v run after the failure", pids)
			}
			if p.id != "" {
				n.crictl(t, "rmp", "-f", p.id)
			}
			n.waitIdle(t, "the failed pod")
		})
	}
}

// crictlID runs a crictl command that prints an ID and sets *id to it if
// the command succeeds.
func (n *node) crictlID(id *string, args ...string) error {
	out, err := n.crictlErr(args...)
	if err == nil {
		*id = out
	}
	return err
}

// namedStep is one crictl step that may fail.
type namedStep struct {
	name string
	run  func() error
}

// firstError runs steps until one fails and returns its name and error.
func firstError(steps []namedStep) (string, error) {
	for _, s := range steps {
		if err := s.run(); err != nil {
			return s.name, err
		}
	}
	return "", nil
}

// TestCocoonRemoveRunningPod: rmp -f of a pod whose container runs leaves
// no VM, shim, mount, tap, cgroup, staged dir or CNI state.
func TestCocoonRemoveRunningPod(t *testing.T) {
	n := startCocoonNode(t)
	p := n.runPod(t, "doomed", devstack.CocoonHandler, nil)
	ctr := n.createCocoon(t, p, "app", nil)
	n.startCocoon(t, ctr)
	vm := oneVM(t, p, ctr)
	staged := n.report(t, ctr).StagedDir
	if _, err := os.Stat(staged); err != nil {
		t.Fatalf("the container's staged dir: %v", err)
	}
	n.crictl(t, "rmp", "-f", p.id)
	n.waitIdle(t, "rmp -f of the running pod")
	if pids := append(vms(p.id, ctr), shimsOf(p.id, ctr)...); len(pids) > 0 || processRuns(vm) {
		t.Fatalf("VM %d or shims/VMs %v survived rmp -f", vm, pids)
	}
	if _, err := os.Stat(staged); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("staged dir %s left (stat: %v)", staged, err)
	}
	if active := n.activeSnapshots(t); len(active) > 0 {
		t.Fatalf("cocoon snapshotter still has active snapshots %v", active)
	}
	// A tap lives in the pod's network namespace, gone with it (no mount,
	// no process holds it: waitIdle); none may be in the node's either.
	if taps := n.taps(t); len(taps) > 0 {
		t.Fatalf("taps %v left in the node namespace", taps)
	}
	if files := cniResults(p.id); len(files) > 0 {
		t.Fatalf("CNI state %v left", files)
	}
}

// processRuns reports whether pid is alive and not a zombie.
func processRuns(pid int) bool {
	return slices.ContainsFunc(processes(), func(p proc) bool { return p.pid == pid })
}
