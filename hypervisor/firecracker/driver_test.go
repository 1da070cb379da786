package firecracker

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
	"github.com/opencontainers/go-digest"
)

func TestRestoreFlow(t *testing.T) {
	file := func(path string) map[string]any { return map[string]any{"backend_type": "File", "backend_path": path} }
	tests := []struct {
		name    string
		mode    hypervisor.Mode
		backend func(staged, run string) map[string]any
	}{
		{"mmap", hypervisor.ModeMmap, func(staged, _ string) map[string]any { return file(filepath.Join(staged, chain.StagedMemory)) }},
		{"copy", hypervisor.ModeCopy, func(_, run string) map[string]any { return file(filepath.Join(run, memCopy)) }},
		{"ondemand", hypervisor.ModeOnDemand, func(_, run string) map[string]any {
			return map[string]any{"backend_type": "Uffd", "backend_path": filepath.Join(run, uffdSock)}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.mode == hypervisor.ModeOnDemand {
				testenv.RequireRoot(t) // /dev/userfaultfd
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			d, record := newDriver(t, apifake.Fake{})
			staged, run := stageChain(t), drivertest.RunDir(t)
			var cg drivertest.Cgroup
			v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: staged, RunDir: run, Mode: tt.mode, Cgroup: &cg})
			if err != nil {
				t.Fatal(err)
			}
			defer v.Close()
			// The VMM is born in the VM's cgroup, and a copy's pages are
			// made in it.
			if charges := map[bool]int32{true: 1}[tt.mode == hypervisor.ModeCopy]; cg.Starts.Load() != 1 || cg.Charges.Load() != charges {
				t.Errorf("%d starts and %d fills in the VM's cgroup, want 1 and %d", cg.Starts.Load(), cg.Charges.Load(), charges)
			}
			want := map[string]any{
				"snapshot_path":     filepath.Join(staged, vmstateFile),
				"mem_backend":       tt.backend(staged, run),
				"track_dirty_pages": true,
				"resume_vm":         false,
				"vsock_override":    map[string]any{"uds_path": filepath.Join(run, vsockSock)},
			}
			if got := apifake.Bodies(t, record, "PUT", "snapshot/load"); len(got) != 1 || !reflect.DeepEqual(got[0], want) {
				t.Errorf("snapshot/load bodies %v, want [%v]", got, want)
			}
			memDigest := stagedDigest(t, staged)
			checkMemory(t, staged, run, tt.mode)
			exercise(t, ctx, v, record, memDigest)
		})
	}
}

// checkMemory checks that a restore left the staged memory to its caller
// and that a copy restore let go of its private copy's name. The caller
// unlinks the staged memory of a copy restore once the guest is up, so it
// is unlinked here too: the VM must run on without it.
func checkMemory(t *testing.T, staged, run string, mode hypervisor.Mode) {
	t.Helper()
	stagedMem := filepath.Join(staged, chain.StagedMemory)
	if _, err := os.Stat(stagedMem); err != nil {
		t.Errorf("restore removed the staged memory, which is the caller's: %v", err)
	}
	if _, err := os.Stat(filepath.Join(run, memCopy)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("private memory copy still named in the run dir: %v", err)
	}
	if mode == hypervisor.ModeCopy {
		if err := os.Remove(stagedMem); err != nil {
			t.Error(err)
		}
	}
}

// exercise drives a restored VM through its life and checks the requests.
// memDigest is the staged memory's data digest: the VM's memory must be the
// restored memory, whichever backend served it.
func exercise(t *testing.T, ctx context.Context, v hypervisor.VM, record string, memDigest digest.Digest) {
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
	if l, err := chain.Validate(linkDir, nil); err != nil || l.Kind != chain.KindFull || l.Hypervisor != Name || l.Memory.DataDigest != memDigest {
		t.Errorf("snapshot link %+v, %v; want memory digest %s", l, err, memDigest)
	}
	if err := v.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{"PUT snapshot/load", "GET vm/config", "PATCH vm", "PATCH vm", "PUT snapshot/create", "PATCH vm", "PUT actions"}
	if got := apifake.Ops(t, record); !slices.Equal(got, want) {
		t.Errorf("requests %v, want %v", got, want)
	}
	states := apifake.Bodies(t, record, "PATCH", "vm")
	if len(states) != 3 || states[0]["state"] != "Resumed" || states[1]["state"] != "Paused" {
		t.Errorf("PATCH /vm bodies %v", states)
	}
	create := apifake.Bodies(t, record, "PUT", "snapshot/create")
	if len(create) != 1 || create[0]["snapshot_type"] != "Full" || create[0]["snapshot_path"] != filepath.Join(linkDir, vmstateFile) {
		t.Errorf("snapshot/create bodies %v", create)
	}
	if got := apifake.Bodies(t, record, "PUT", "actions"); len(got) != 1 || got[0]["action_type"] != "SendCtrlAltDel" {
		t.Errorf("actions %v", got)
	}
}

func stagedDigest(t *testing.T, staged string) digest.Digest {
	t.Helper()
	s, err := chain.OpenStaged(staged)
	if err != nil {
		t.Fatal(err)
	}
	return s.Top().Memory.DataDigest
}

func TestCapabilities(t *testing.T) {
	d, _ := newDriver(t, apifake.Fake{})
	caps, err := d.Capabilities(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if caps.Build != "Firecracker v1.16.1" || !caps.Supports(hypervisor.ModeMmap) || !caps.Supports(hypervisor.ModeCopy) {
		t.Errorf("caps %+v", caps)
	}
}

func TestShutdownKillsIgnoringGuest(t *testing.T) {
	d, _ := newDriver(t, apifake.Fake{IgnoreCtrlAltDel: true})
	ctx := context.Background()
	v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: stageChain(t), RunDir: drivertest.RunDir(t), Mode: hypervisor.ModeMmap})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if err := v.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := v.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(v.PID(), 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("pid %d after Shutdown: kill 0 = %v, want ESRCH", v.PID(), err)
	}
}

func TestRestoreFailureCleansUp(t *testing.T) {
	tests := []struct {
		name string
		fake apifake.Fake
		mode hypervisor.Mode
		want string
	}{
		{"load fails", apifake.Fake{Fail: []string{"snapshot/load"}}, hypervisor.ModeCopy, "fake failure"},
		{"ondemand load fails", apifake.Fake{Fail: []string{"snapshot/load"}}, hypervisor.ModeOnDemand, "fake failure"},
		{"bad mode", apifake.Fake{}, hypervisor.Mode("lazy"), `restore mode "lazy"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, record := newDriver(t, tt.fake)
			staged, run := stageChain(t), drivertest.RunDir(t)
			_, err := d.Restore(context.Background(), hypervisor.RestoreRequest{StagedDir: staged, RunDir: run, Mode: tt.mode})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
			if _, err := os.Stat(run); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("run dir left behind: %v", err)
			}
			if _, err := os.Stat(filepath.Join(staged, chain.StagedMemory)); err != nil {
				t.Errorf("failed restore released the staged memory: %v", err)
			}
			for _, pid := range apifake.PIDs(t, record) {
				if apifake.Alive(pid) {
					t.Errorf("pid %d still running", pid)
				}
			}
		})
	}
}

func TestStateMachineViolations(t *testing.T) {
	ctx := context.Background()
	d, _ := newDriver(t, apifake.Fake{})
	v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: stageChain(t), RunDir: drivertest.RunDir(t), Mode: hypervisor.ModeMmap})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	var apiErr *APIError
	if err := v.Pause(ctx); !errors.As(err, &apiErr) || apiErr.Status != 400 || apiErr.Fault == "" {
		t.Errorf("pause of a paused VM: err = %v, want a 400 with a fault message", err)
	}
	if err := v.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	snap := v.(hypervisor.Checkpointer)
	if err := snap.Snapshot(ctx, t.TempDir(), hypervisor.SnapshotFull); !errors.As(err, &apiErr) || apiErr.Status != 400 {
		t.Errorf("snapshot of a running VM: err = %v, want 400", err)
	}
	if err := snap.Snapshot(ctx, t.TempDir(), hypervisor.SnapshotDiff); err == nil {
		t.Error("diff snapshot: want an error")
	}
}
