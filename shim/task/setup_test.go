package task

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

// TestSetupWhileGuestComesUp holds a launch after its spawn, as a guest
// still booting would: the VM must already be recorded in the bundle (so a
// shim crash cannot orphan it) and sit in its cgroup.
func TestSetupWhileGuestComesUp(t *testing.T) {
	cgPath := fmt.Sprintf("/cocoon-setup-test-%d", os.Getpid())
	tests := []struct {
		name   string
		cgroup string
	}{
		{"no cgroup", ""},
		{"cgroup", cgPath},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.cgroup != "" {
				testenv.RequireRoot(t)
			}
			h := newHarness(t)
			h.launcher.upGate = make(chan struct{})
			spec := specFor("sleep")
			if tt.cgroup != "" {
				spec.Linux = &specs.Linux{CgroupsPath: tt.cgroup}
			}
			bundle := h.bundle(spec)
			created := make(chan error, 1)
			go func() {
				_, err := h.svc.Create(h.ctx, &taskAPI.CreateTaskRequest{ID: "t1", Bundle: bundle, Rootfs: h.rootfs()})
				created <- err
			}()
			rec := waitRecord(t, bundle)
			if rec.PID != h.vm.PID() || rec.Cgroup != tt.cgroup || rec.RunDir != "/run/cocoon/fake" || rec.Plan.Mode != "mmap" {
				t.Fatalf("record while the guest comes up %+v, want pid %d, cgroup %q, the fake's run dir and plan", rec, h.vm.PID(), tt.cgroup)
			}
			if tt.cgroup != "" {
				waitInCgroup(t, h.vm.PID(), tt.cgroup)
			}
			select {
			case err := <-created:
				t.Fatalf("Create returned (%v) before the guest came up", err)
			default:
			}
			close(h.launcher.upGate)
			if err := <-created; err != nil {
				t.Fatal(err)
			}
			h.kill("t1")
			h.delete("t1", "")
		})
	}
}

// TestSetupWithoutSpawnHook: a launcher that never reports the spawn
// still gets its VM recorded before Create returns.
func TestSetupWithoutSpawnHook(t *testing.T) {
	h := newHarness(t)
	h.launcher.silent = true
	bundle := h.create("t1", specFor("sleep"), nil)
	rec, err := state.ReadTask(bundle)
	if err != nil {
		t.Fatal(err)
	}
	if rec.PID != h.vm.PID() {
		t.Fatalf("record pid %d, want %d", rec.PID, h.vm.PID())
	}
}

// TestSetupFailureKillsVM: a cgroup the shim cannot make fails the Create
// and takes the VM down with it.
func TestSetupFailureKillsVM(t *testing.T) {
	h := newHarness(t)
	spec := specFor("sleep")
	spec.Linux = &specs.Linux{CgroupsPath: "system.slice:cocoon:t1"}
	_, err := h.svc.Create(h.ctx, &taskAPI.CreateTaskRequest{ID: "t1", Bundle: h.bundle(spec), Rootfs: h.rootfs()})
	if err == nil || !strings.Contains(err.Error(), "systemd slice") {
		t.Fatalf("Create with a systemd cgroups path: %v, want the path rejected", err)
	}
	select {
	case <-h.vm.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the VM of a failed Create still runs")
	}
}

// TestSandboxReleased: the network and base snapshot a launch handed over
// are released with the VM, whether the task is deleted or its Create
// fails after the launch (here its cgroup cannot be made).
func TestSandboxReleased(t *testing.T) {
	tests := []struct {
		name   string
		cgroup string
		create func(h *harness, bundle string) error
	}{
		{"delete", "", func(h *harness, bundle string) error {
			if _, err := h.svc.Create(h.ctx, &taskAPI.CreateTaskRequest{ID: "t1", Bundle: bundle, Rootfs: h.rootfs()}); err != nil {
				return err
			}
			h.delete("t1", "")
			return nil
		}},
		{"failed create", "system.slice:cocoon:t1", func(h *harness, bundle string) error {
			_, err := h.svc.Create(h.ctx, &taskAPI.CreateTaskRequest{ID: "t1", Bundle: bundle, Rootfs: h.rootfs()})
			if err == nil {
				return errors.New("Create with a systemd cgroups path succeeded, want it rejected")
			}
			return nil
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			net, base := &fakeReleaser{}, &fakeReleaser{}
			h.launcher.network, h.launcher.base = net, base
			spec := specFor("sleep")
			if tt.cgroup != "" {
				spec.Linux = &specs.Linux{CgroupsPath: tt.cgroup}
			}
			if err := tt.create(h, h.bundle(spec)); err != nil {
				t.Fatal(err)
			}
			if !net.released() || !base.released() {
				t.Fatalf("network released %t, base released %t: want both", net.released(), base.released())
			}
		})
	}
}

func (h *harness) kill(id string) {
	h.t.Helper()
	if _, err := h.svc.Kill(h.ctx, &taskAPI.KillRequest{ID: id, Signal: 9}); err != nil {
		h.t.Fatal(err)
	}
	h.wait(id, "")
}

func waitRecord(t *testing.T, bundle string) *state.Task {
	t.Helper()
	var rec *state.Task
	testenv.Eventually(t, 10*time.Second, "task record", func() error {
		var err error
		rec, err = state.ReadTask(bundle)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("task record: %v", err)
		}
		return err
	})
	return rec
}

// waitInCgroup waits until pid's cgroup (in any hierarchy) is path.
func waitInCgroup(t *testing.T, pid int, path string) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, fmt.Sprintf("pid %d in cgroup %s", pid, path), func() error {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), ":"+path+"\n") {
			return fmt.Errorf("it is in\n%s", data)
		}
		return nil
	})
}
