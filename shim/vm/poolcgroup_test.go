package vm

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// TestPoolCgroupBound: a fill finds the pool's cgroup, and restores no VM
// once the VMs waiting in it use shim.pool_memory.
func TestPoolCgroupBound(t *testing.T) {
	testenv.RequireRoot(t)
	cfg := config.Default()
	cfg.Shim.PoolCgroup = fmt.Sprintf("/cocoon-test-pool-%d", os.Getpid())
	cg, err := task.NewCgroup(cfg.Shim.PoolCgroup, &specs.LinuxResources{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cg.Delete(); err != nil {
			t.Errorf("delete the pool's cgroup: %v", err)
		}
	})
	// A waiting VM: a process holding 8 MiB.
	// (read: a builtin, so the shell holding it waits, no child of it)
	cmd := exec.Command("sh", "-c", `x=$(head -c 8388608 /dev/zero | tr '\000' a); echo ready; read y`)
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cg.Start(cmd.SysProcAttr, cmd.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if _, err := out.Read(make([]byte, 6)); err != nil {
		t.Fatalf("wait for the allocation: %v", err)
	}
	for _, tc := range []struct {
		bound config.Size
		fills bool
	}{{0, true}, {1 << 30, true}, {4 << 20, false}} {
		cfg.Shim.PoolMemory = tc.bound
		_, err := poolCgroup(cfg)
		if (err == nil) != tc.fills || (err != nil && !strings.Contains(err.Error(), "shim.pool_memory")) {
			t.Errorf("pool_memory %d with 8 MiB waiting: %v, want a fill %v", tc.bound, err, tc.fills)
		}
	}
}
