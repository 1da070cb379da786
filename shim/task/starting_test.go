package task

import (
	"context"
	"errors"
	"reflect"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

// startingLauncher names what it would create, then fails: a shim killed
// right there leaves only what Starting recorded.
type startingLauncher struct {
	sp Spawn
}

func (l startingLauncher) Launch(_ context.Context, r LaunchRequest) (*Sandbox, error) {
	if r.Starting == nil {
		return nil, errors.New("no Starting hook to name what the launch creates")
	}
	if err := r.Starting(l.sp); err != nil {
		return nil, err
	}
	return nil, errors.New("killed")
}

// TestCreateRecordsBeforeLaunching: the task record names the run dir,
// tap, base snapshot and cgroup before the launcher creates any of them,
// so `shim delete` can clean up after a shim that died mid-launch.
func TestCreateRecordsBeforeLaunching(t *testing.T) {
	h := newHarness(t)
	sp := Spawn{
		Hypervisor: "qemu",
		RunDir:     "/run/cocoon/test/t1",
		Network:    &state.Network{NetNS: "/var/run/netns/pod", Tap: "ctap0"},
		Base:       &state.Base{Namespace: "test", Snapshotter: "cocoon", Key: "cocoon-base-t1"},
	}
	h.svc.launcher = startingLauncher{sp: sp}
	spec := specFor("sleep", "60")
	spec.Linux = &specs.Linux{CgroupsPath: "/test/t1"}
	bundle := h.bundle(spec)
	if _, err := h.svc.Create(h.ctx, &taskAPI.CreateTaskRequest{ID: "t1", Bundle: bundle, Rootfs: h.rootfs()}); err == nil {
		t.Fatal("Create succeeded with a failing launcher")
	}
	got, err := state.ReadTask(bundle)
	if err != nil {
		t.Fatalf("no task record after a launch that named what it creates: %v", err)
	}
	want := &state.Task{ID: "t1", Hypervisor: "qemu", RunDir: sp.RunDir, StagedDir: h.staged, Cgroup: "/test/t1", Network: sp.Network, Base: sp.Base}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("task record %+v, want %+v", got, want)
	}
}
