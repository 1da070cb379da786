package container

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// startSleeper creates and starts a container that sleeps.
func startSleeper(t *testing.T, m *Manager, id, rootfs string, opts ...oci.SpecOpts) *Container {
	t.Helper()
	opts = append([]oci.SpecOpts{oci.WithProcessArgs("sleep", "1000")}, opts...)
	c, err := m.Create(context.Background(), id, CreateOptions{Spec: specJSON(t, id, opts...), Rootfs: rootfs})
	if err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
	var names []string
	for _, p := range c.Phases {
		names = append(names, p.GetName())
	}
	// A root that is a directory has no disk to find.
	if want := []string{api.PhaseRoot, api.PhaseBundle, api.PhaseRuncCreate}; !slices.Equal(names, want) {
		t.Errorf("create %s timed %v, want %v", id, names, want)
	}
	if _, err := c.Start(context.Background()); err != nil {
		t.Fatalf("start %s: %v", id, err)
	}
	return c
}

// execProcess is an exec's OCI process as JSON, with c's user and env.
func execProcess(t *testing.T, terminal bool, args ...string) []byte {
	t.Helper()
	p := specs.Process{Args: args, Env: []string{"PATH=/bin"}, Cwd: "/", Terminal: terminal}
	data, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestExec runs processes in a running container: their output, exit
// codes, a terminal, and signals; then the container's own end.
func TestExec(t *testing.T) {
	m := testManager(t)
	c := startSleeper(t, m, "exec", busyboxRoot(t), oci.WithCapabilities(nil))
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		terminal bool
		args     []string
		want     string
		code     int
	}{
		{name: "caps", args: []string{"grep", "CapEff", "/proc/self/status"}, want: "CapEff:\t0000000000000000"},
		{name: "sees-init", args: []string{"sh", "-c", "cat /proc/1/cmdline"}, want: "sleep"},
		{name: "exit-code", args: []string{"sh", "-c", "exit 3"}, code: 3},
		{name: "terminal", terminal: true, args: []string{"tty"}, want: "/dev/pts/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := c.Exec(ctx, tc.name, ExecOptions{Process: execProcess(t, tc.terminal, tc.args...)}); err != nil {
				t.Fatalf("exec: %v", err)
			}
			p, _ := c.process(tc.name)
			out := readAll(t, p.io.stdout)
			if e := waitExit(t, c, tc.name); e.Code != tc.code {
				t.Errorf("exit %+v, want code %d (output %q)", e, tc.code, out)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("output %q lacks %q", out, tc.want)
			}
			if err := c.DeleteExec(tc.name); err != nil {
				t.Errorf("delete exec: %v", err)
			}
		})
	}
	if _, err := c.Exec(ctx, "sleeper", ExecOptions{Process: execProcess(t, false, "sleep", "1000")}); err != nil {
		t.Fatalf("exec: %v", err)
	}
	if err := c.Signal(ctx, "sleeper", unix.SIGTERM, false); err != nil {
		t.Fatalf("signal exec: %v", err)
	}
	if e := waitExit(t, c, "sleeper"); e.Code != 143 || e.Signal != int(unix.SIGTERM) {
		t.Errorf("exec's exit after SIGTERM: %+v, want 143", e)
	}
	if err := c.Signal(ctx, "sleeper", unix.SIGTERM, false); !errdefs.IsNotFound(err) {
		t.Errorf("signal an exited exec: %v, want NotFound", err)
	}
	if err := c.Signal(ctx, "", unix.SIGKILL, false); err != nil {
		t.Fatalf("kill container: %v", err)
	}
	if e := waitExit(t, c, ""); e.Code != 137 || e.OOMKilled {
		t.Errorf("container's exit after SIGKILL: %+v, want 137 without OOM", e)
	}
	if _, err := c.Exec(ctx, "late", ExecOptions{Process: execProcess(t, false, "true")}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("exec in an exited container: %v, want FailedPrecondition", err)
	}
}

// TestOOMKill: a container over its 32 MiB limit is killed alone and
// flagged; a container beside it keeps running and serves an exec.
func TestOOMKill(t *testing.T) {
	m := testManager(t)
	rootfs := busyboxRoot(t)
	other := startSleeper(t, m, "bystander", rootfs)
	const limit = 32 << 20
	_, stderr, e := runContainer(t, m, "hog", rootfs,
		oci.WithProcessArgs("dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"),
		oci.WithMemoryLimit(limit), oci.WithMemorySwap(limit))
	if e.Code != 137 || e.Signal != int(unix.SIGKILL) || !e.OOMKilled {
		t.Errorf("hog's exit %+v (stderr %q), want 137 by SIGKILL, OOM-killed", e, stderr)
	}
	if other.init.exited() {
		t.Fatalf("the bystander exited: %+v", other.init.exit)
	}
	ctx := context.Background()
	if _, err := other.Exec(ctx, "alive", ExecOptions{Process: execProcess(t, false, "echo", "alive")}); err != nil {
		t.Fatalf("exec in the bystander: %v", err)
	}
	p, _ := other.process("alive")
	if out := readAll(t, p.io.stdout); out != "alive\n" {
		t.Errorf("bystander's exec said %q", out)
	}
}

// TestDeleteLeavesNothing: deleting a container, exited or never started,
// leaves no process, cgroup, bundle, runc state or mount.
func TestDeleteLeavesNothing(t *testing.T) {
	m := testManager(t)
	rootfs := busyboxRoot(t)
	ctx := context.Background()
	for _, started := range []bool{true, false} {
		id := "unstarted"
		if started {
			id = "started"
		}
		t.Run(id, func(t *testing.T) {
			var c *Container
			if started {
				c = startSleeper(t, m, id, rootfs)
				if err := m.Delete(ctx, id); !errdefs.IsFailedPrecondition(err) {
					t.Fatalf("delete a running container: %v, want FailedPrecondition", err)
				}
				if err := c.Signal(ctx, "", unix.SIGKILL, false); err != nil {
					t.Fatal(err)
				}
				waitExit(t, c, "")
			} else {
				var err error
				if c, err = m.Create(ctx, id, CreateOptions{Spec: specJSON(t, id, oci.WithProcessArgs("true")), Rootfs: rootfs}); err != nil {
					t.Fatal(err)
				}
			}
			pid := c.init.pid
			if err := m.Delete(ctx, id); err != nil {
				t.Fatalf("delete: %v", err)
			}
			assertGone(t, m, c, pid)
		})
	}
}

func assertGone(t *testing.T, m *Manager, c *Container, pid int) {
	t.Helper()
	if err := unix.Kill(pid, 0); !errors.Is(err, unix.ESRCH) {
		t.Errorf("process %d: %v, want ESRCH", pid, err)
	}
	for _, dir := range append(cgroupDirs(c.cgroup), c.bundle, filepath.Join(m.cfg.RuncRoot, c.ID)) {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v, want it gone", dir, err)
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), c.bundle) {
		t.Errorf("a mount under %s is left", c.bundle)
	}
	if _, err := m.Get(c.ID); !errdefs.IsNotFound(err) {
		t.Errorf("get after delete: %v, want NotFound", err)
	}
}
