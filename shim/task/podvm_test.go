package task

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

// fakeHost is a pod VM's host that takes no containers.
type fakeHost struct{}

func (fakeHost) Join(context.Context, LaunchRequest) (*Sandbox, error) {
	return nil, errors.New("fake host")
}

// TestPodVMLifecycle: a pod VM of the sandbox API is launched bare and
// recorded in its bundle, hosts its pod's containers, keeps the shim up,
// and once stopped and removed leaves no record and lets the shim go.
func TestPodVMLifecycle(t *testing.T) {
	h := newHarness(t)
	network, base := &fakeReleaser{}, &fakeReleaser{}
	h.launcher.host, h.launcher.network, h.launcher.base = fakeHost{}, network, base
	bundle := t.TempDir()
	p, err := h.svc.StartPod(h.ctx, LaunchRequest{ID: "pod1", Bundle: bundle, Spec: &specs.Spec{Linux: &specs.Linux{}}})
	if err != nil {
		t.Fatal(err)
	}
	got := h.launcher.got[0]
	if !got.Bare || got.Namespace != "test" || !IsPodSandbox(got.Spec) {
		t.Fatalf("launch request %+v: want a bare pod sandbox in namespace test", got)
	}
	rec, err := state.ReadTask(bundle)
	if err != nil || rec.PID != p.PID() {
		t.Fatalf("pod record %+v, %v: want the VM's pid %d", rec, err, p.PID())
	}
	member := &specs.Spec{Annotations: map[string]string{sandboxIDAnnotation: "pod1"}}
	if h.svc.podHost(member) == nil {
		t.Fatal("a container of the pod finds no host")
	}
	if _, err := h.svc.Shutdown(h.ctx, &taskAPI.ShutdownRequest{}); err != nil {
		t.Fatal(err)
	}
	if shutDown(h) {
		t.Fatal("the shim shut down while it holds a pod VM")
	}
	if err := h.svc.StopPod(h.ctx, p); err != nil {
		t.Fatal(err)
	}
	if p.ExitedAt().IsZero() || !network.released() || base.released() {
		t.Fatalf("stopped pod: exited at %v, network released %v, base released %v; want exited, network only", p.ExitedAt(), network.released(), base.released())
	}
	if err := h.svc.RemovePod(h.ctx, p); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(bundle, state.TaskFile)); !errors.Is(err, os.ErrNotExist) || !base.released() {
		t.Fatalf("removed pod: record %v, base released %v; want neither left", err, base.released())
	}
	if h.svc.podHost(member) != nil {
		t.Fatal("a removed pod still hosts containers")
	}
	h.svc.ShutdownIfIdle()
	select {
	case <-h.svc.sd.Done():
	case <-time.After(testWait):
		t.Fatal("the shim did not shut down once idle")
	}
}

// TestStartPodWithoutHost: a VM that takes no containers is no pod VM:
// it is killed and nothing is kept.
func TestStartPodWithoutHost(t *testing.T) {
	h := newHarness(t)
	bundle := t.TempDir()
	if _, err := h.svc.StartPod(h.ctx, LaunchRequest{ID: "pod1", Bundle: bundle}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("start pod: %v, want FailedPrecondition", err)
	}
	select {
	case <-h.vm.done:
	case <-time.After(testWait):
		t.Fatal("the VM of a failed pod still runs")
	}
	if len(h.svc.pods) != 0 || len(h.svc.creating) != 0 {
		t.Fatalf("a failed pod is held: pods %v, creating %v", h.svc.pods, h.svc.creating)
	}
}

func shutDown(h *harness) bool {
	select {
	case <-h.svc.sd.Done():
		return true
	default:
		return false
	}
}

// TestPodVMUpdate: a pod's resize puts its limits on the VM's cgroup as a
// task's update does (memory plus the headroom); a memory
// limit below the guest's is refused and changes nothing.
func TestPodVMUpdate(t *testing.T) {
	cg, path := testCgroup(t, "pod-resize")
	p := &PodVM{id: "pod1", sb: &Sandbox{Memory: MemoryBudget{Guest: 256 << 20, Headroom: 32 << 20}}, cg: cg}
	quota, period := int64(150000), uint64(100000)
	for _, tc := range []struct {
		name    string
		memory  int64
		want    int64 // the cgroup's memory limit after
		wantErr func(error) bool
	}{
		{name: "grow", memory: 512 << 20, want: 544 << 20},
		{name: "shrink", memory: 300 << 20, want: 332 << 20},
		{name: "below the guest", memory: 128 << 20, want: 332 << 20, wantErr: errdefs.IsInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			memory := tc.memory
			err := p.Update(&specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &memory}, CPU: &specs.LinuxCPU{Quota: &quota, Period: &period}})
			if (tc.wantErr == nil) != (err == nil) || (err != nil && !tc.wantErr(err)) {
				t.Fatalf("update to %d: %v", tc.memory, err)
			}
			if got := memoryLimit(t, path); got != tc.want {
				t.Fatalf("cgroup memory limit %d, want %d", got, tc.want)
			}
		})
	}
	memory := int64(512 << 20)
	noCgroup := &PodVM{id: "pod2", sb: p.sb}
	if err := noCgroup.Update(&specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &memory}}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("resize of a pod with no cgroup: %v, want FailedPrecondition", err)
	}
}
