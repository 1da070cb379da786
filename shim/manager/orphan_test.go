package manager

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/shim"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

// naming is a process startNaming started.
type naming struct {
	exited <-chan struct{} // closed once it is reaped
	pidfd  int             // readable from its death on, reaped or not
}

// startNaming starts a sleep whose command line names path (as a
// hypervisor names the sockets in its run dir).
func startNaming(t *testing.T, path string) naming {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	// sleep refuses extra operands, but its argv[0] may name anything.
	cmd := &exec.Cmd{Path: sleep, Args: []string{path, "600"}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	// Opened before anything reaps it, so the pidfd is this process's.
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(pidfd) })
	return naming{exited: exited, pidfd: pidfd}
}

// dead reports, without waiting, whether p has died.
func (p naming) dead(t *testing.T) bool {
	t.Helper()
	fds := []unix.PollFd{{Fd: int32(p.pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
}

// TestStopKillsUnrecordedHypervisor: a record written before the
// hypervisor was spawned has no pid (the shim died in between); `shim
// delete` kills the process that names the record's run dir, and nothing
// that names another.
func TestStopKillsUnrecordedHypervisor(t *testing.T) {
	runDir := filepath.Join(t.TempDir(), "run", "ns", "t1")
	vm := startNaming(t, filepath.Join(runDir, "agent.sock"))
	sibling := startNaming(t, filepath.Join(runDir+"0", "agent.sock"))

	bundle := t.TempDir()
	if err := state.WriteTask(bundle, &state.Task{ID: "t1", Hypervisor: "qemu", RunDir: runDir}); err != nil {
		t.Fatal(err)
	}
	ctx := context.WithValue(context.Background(), shim.OptsKey{}, shim.Opts{BundlePath: bundle})
	if _, err := New(Name).Stop(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-vm.exited:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop left the unrecorded hypervisor naming the run dir running")
	}
	if sibling.dead(t) {
		t.Fatal("Stop killed a process naming another task's run dir")
	}
}
