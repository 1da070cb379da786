package cloudhypervisor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/drivertest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/apifake"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
	"golang.org/x/sys/unix"
)

func TestRestoreFlow(t *testing.T) {
	tests := []struct {
		name string
		spec string
		mode hypervisor.Mode
		want map[string]any // vm.restore body, source_url filled in
	}{
		{"copy", apifake.SpecCH, hypervisor.ModeCopy, map[string]any{}},
		{"ondemand", apifake.SpecCH, hypervisor.ModeOnDemand, map[string]any{"memory_restore_mode": "OnDemand"}},
		{"mmap", apifake.SpecCHFork, hypervisor.ModeMmap, map[string]any{"memory_restore_mode": "CopyOnWrite"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			d, record := newDriver(t, tt.spec, "probe")
			staged, run := stageChain(t), drivertest.RunDir(t)
			phases := map[string]bool{}
			var cg drivertest.Cgroup
			v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: staged, RunDir: run, Mode: tt.mode, Cgroup: &cg,
				OnPhase: func(p string, _ time.Duration) { phases[p] = true }})
			if err != nil {
				t.Fatal(err)
			}
			defer v.Close()
			if cg.Starts.Load() != 1 {
				t.Errorf("%d VMMs started in the VM's cgroup, want 1", cg.Starts.Load())
			}
			if !phases["spawn"] || !phases["load"] {
				t.Errorf("phases reported %v, want spawn and load", phases)
			}
			source := restoreDirs(t, staged)
			if len(source) != 1 {
				t.Fatalf("restore dirs in the staged dir %v, want one", source)
			}
			tt.want["source_url"] = "file://" + source[0]
			got := apifake.Bodies(t, record, "PUT", "vm.restore")
			if len(got) == 0 || !reflect.DeepEqual(got[len(got)-1], tt.want) {
				t.Errorf("vm.restore bodies %v, want last = %v", got, tt.want)
			}
			checkMemory(t, staged, source[0], tt.mode)
			exercise(t, ctx, v, record)
			if err := v.Close(); err != nil {
				t.Fatal(err)
			}
			if left := restoreDirs(t, staged); len(left) != 0 {
				t.Errorf("restore dirs left in the staged dir after Close: %v", left)
			}
		})
	}
}

// restoreDirs lists the snapshot directories restores made in staged.
func restoreDirs(t *testing.T, staged string) []string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(staged, restorePrefix+"*"))
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// checkMemory checks what the restore left of the memory file in the
// restore dir source: a copy lets go of it, mmap and ondemand run on the
// staged inode.
func checkMemory(t *testing.T, staged, source string, mode hypervisor.Mode) {
	t.Helper()
	restored := filepath.Join(source, memoryFile)
	stagedMem := filepath.Join(staged, chain.StagedMemory)
	if mode == hypervisor.ModeCopy {
		if _, err := os.Lstat(restored); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("copy restore kept %s (err %v)", restored, err)
		}
		// The staged memory is the caller's: it unlinks it once the guest
		// is up, and the VM must run on without it.
		if err := os.Remove(stagedMem); err != nil {
			t.Errorf("copy restore left no staged memory for its caller: %v", err)
		}
		return
	}
	a, errA := os.Stat(restored)
	b, errB := os.Stat(stagedMem)
	if errA != nil || errB != nil || !os.SameFile(a, b) {
		t.Errorf("restored memory is not the staged inode: %v %v", errA, errB)
	}
}

// exercise drives a restored VM through its life and checks the requests.
func exercise(t *testing.T, ctx context.Context, v hypervisor.VM, record string) {
	t.Helper()
	if err := v.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	drivertest.CheckAgent(t, ctx, v)
	if err := v.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	linkDir := t.TempDir()
	if err := v.(hypervisor.Checkpointer).Snapshot(ctx, linkDir, hypervisor.SnapshotFull); err != nil {
		t.Fatal(err)
	}
	if l, err := chain.Validate(linkDir, nil); err != nil || l.Kind != chain.KindFull || l.MemoryBytes != drivertest.MemBytes {
		t.Errorf("snapshot link %+v, %v", l, err)
	}
	if err := v.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{"PUT vm.restore", "PUT vm.resume", "PUT vm.pause", "PUT vm.snapshot", "PUT vm.shutdown", "PUT vmm.shutdown"}
	if got := apifake.Ops(t, record); !slices.Equal(got[len(got)-len(want):], want) {
		t.Errorf("requests %v, want them to end with %v", got, want)
	}
	snap := apifake.Bodies(t, record, "PUT", "vm.snapshot")
	if len(snap) != 1 || len(snap[0]) != 1 || !strings.HasPrefix(snap[0]["destination_url"].(string), "file://") {
		t.Errorf("vm.snapshot bodies %v, want one with only destination_url", snap)
	}
}

func TestCapabilities(t *testing.T) {
	tests := []struct {
		name, spec, cow string
		wantMmap        bool
		wantProbe       bool
	}{
		{"probe upstream", apifake.SpecCH, "probe", false, true},
		{"probe fork", apifake.SpecCHFork, "probe", true, true},
		{"pinned yes", apifake.SpecCH, "yes", true, false},
		{"pinned no", apifake.SpecCHFork, "no", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, record := newDriver(t, tt.spec, tt.cow)
			caps, err := d.Capabilities(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if caps.Supports(hypervisor.ModeMmap) != tt.wantMmap || !caps.Supports(hypervisor.ModeCopy) || caps.Build != "cloud-hypervisor v53.0" {
				t.Errorf("caps %+v, want mmap %v", caps, tt.wantMmap)
			}
			if probed := len(apifake.Bodies(t, record, "PUT", "vm.restore")) > 0; probed != tt.wantProbe {
				t.Errorf("probed the API: %v, want %v", probed, tt.wantProbe)
			}
		})
	}
}

func TestRestoreUnsupportedMode(t *testing.T) {
	d, record := newDriver(t, apifake.SpecCH, "no")
	run := drivertest.RunDir(t)
	_, err := d.Restore(context.Background(), hypervisor.RestoreRequest{StagedDir: stageChain(t), RunDir: run, Mode: hypervisor.ModeMmap})
	if err == nil || !strings.Contains(err.Error(), "mmap") {
		t.Fatalf("restore mmap on upstream: err = %v, want one naming the mode", err)
	}
	if _, err := os.Stat(run); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run dir left behind: %v", err)
	}
	if got := apifake.Ops(t, record); len(got) != 0 {
		t.Errorf("requests %v, want none", got)
	}
}

func TestRestoreFailureCleansUp(t *testing.T) {
	d, record := newDriver(t, apifake.SpecCHFork, "yes", "vm.restore")
	staged, run := stageChain(t), drivertest.RunDir(t)
	_, err := d.Restore(context.Background(), hypervisor.RestoreRequest{StagedDir: staged, RunDir: run, Mode: hypervisor.ModeMmap})
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 400 {
		t.Fatalf("err = %v, want the fake's 400", err)
	}
	if _, err := os.Stat(run); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run dir left behind: %v", err)
	}
	if left := restoreDirs(t, staged); len(left) != 0 {
		t.Errorf("restore dirs left in the staged dir: %v", left)
	}
	pids := apifake.PIDs(t, record)
	if len(pids) != 1 || apifake.Alive(pids[0]) {
		t.Errorf("fake pids %v: want one, gone", pids)
	}
}

func TestStateMachineViolations(t *testing.T) {
	ctx := context.Background()
	d, record := newDriver(t, apifake.SpecCHFork, "yes")
	v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: stageChain(t), RunDir: drivertest.RunDir(t), Mode: hypervisor.ModeMmap})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	var apiErr *APIError
	if err := v.Pause(ctx); !errors.As(err, &apiErr) || apiErr.Status != 405 {
		t.Errorf("pause of a paused VM: err = %v, want 405", err)
	}
	if err := v.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.(hypervisor.Checkpointer).Snapshot(ctx, t.TempDir(), hypervisor.SnapshotFull); !errors.As(err, &apiErr) || apiErr.Status != 405 {
		t.Errorf("snapshot of a running VM: err = %v, want 405", err)
	}
	if err := v.(hypervisor.Checkpointer).Snapshot(ctx, t.TempDir(), hypervisor.SnapshotDiff); err == nil {
		t.Error("diff snapshot: want an error")
	}
	pid := v.PID()
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("pid %d after Close: kill 0 = %v, want ESRCH", pid, err)
	}
	if n := len(apifake.Bodies(t, record, "PUT", "vm.restore")); n != 1 {
		t.Errorf("%d restores, want 1", n)
	}
}

func TestShutdownRefusedKills(t *testing.T) {
	ctx := context.Background()
	d, _ := newDriver(t, apifake.SpecCHFork, "yes", "vmm.shutdown")
	v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: stageChain(t), RunDir: drivertest.RunDir(t), Mode: hypervisor.ModeMmap})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if err := v.Shutdown(ctx); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("shutdown refused by the vmm: err = %v, want one saying it was killed", err)
	}
	if err := syscall.Kill(v.PID(), 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("pid %d after Shutdown: kill 0 = %v, want ESRCH", v.PID(), err)
	}
}

// TestRestoreStagedBindMount restores from a staged directory reached
// through a bind mount, as the shim gets it (its rootfs), into a run
// directory on another mount: link(2) refuses to cross mount points, yet
// the VM must still run on the staged inode.
func TestRestoreStagedBindMount(t *testing.T) {
	testenv.RequireRoot(t)
	staged, mnt := stageChain(t), t.TempDir()
	if err := unix.Mount(staged, mnt, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount the staged dir: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	run, err := os.MkdirTemp("/dev/shm", "cocoon-ch-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	d, _ := newDriver(t, apifake.SpecCHFork, "yes")
	v, err := d.Restore(context.Background(), hypervisor.RestoreRequest{StagedDir: mnt, RunDir: filepath.Join(run, "vm"), Mode: hypervisor.ModeMmap})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	source := restoreDirs(t, mnt)
	if len(source) != 1 {
		t.Fatalf("restore dirs %v, want one", source)
	}
	checkMemory(t, mnt, source[0], hypervisor.ModeMmap)
	if fi, err := os.Lstat(filepath.Join(source[0], memoryFile)); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("memory-ranges is not a hard link (%v, %v)", fi, err)
	}
}
