package manager

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/shim"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare"
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
	// The driver makes the run dir before it spawns the hypervisor.
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		t.Fatal(err)
	}
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

// TestKillNamingWithoutRunDir: a run dir that is gone (the VM's Close
// removed it after the kill) has no hypervisor left behind to scan for, so
// a process naming a path in it is left alone.
func TestKillNamingWithoutRunDir(t *testing.T) {
	runDir := filepath.Join(t.TempDir(), "run", "ns", "t1")
	p := startNaming(t, filepath.Join(runDir, "agent.sock"))
	if err := killNaming(runDir); err != nil {
		t.Fatal(err)
	}
	if p.dead(t) {
		t.Fatal("killNaming scanned for a run dir that does not exist")
	}
}

// TestCleanupKeepsRunDirAfterFailedKill: a hypervisor that may still run
// keeps its run dir, so a retried `shim delete` still finds it by name.
func TestCleanupKeepsRunDirAfterFailedKill(t *testing.T) {
	runDir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(runDir, 0o700); err != nil {
		t.Fatal(err)
	}
	// A recorded pid that is a thread, not a process, cannot be opened to
	// be killed: a kill that fails without anything being signalled.
	tid := threadOf(t, startServer(t))
	start, err := state.StartTime(tid)
	if err != nil {
		t.Fatal(err)
	}
	err = Cleanup(context.Background(), &state.Task{ID: "t1", PID: tid, PIDStart: start, RunDir: runDir})
	if err == nil {
		t.Fatalf("Cleanup with thread %d recorded as the hypervisor succeeded, want its kill to fail", tid)
	}
	if _, err := os.Stat(runDir); err != nil {
		t.Fatalf("Cleanup removed the run dir after a failed kill (stat: %v)", err)
	}
}

// startServer starts the test binary as a fake task server, a process
// with several threads, and returns its pid.
func startServer(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f, err := l.(*net.UnixListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fakeServerEnv+"=1")
	cmd.Dir = t.TempDir()
	cmd.ExtraFiles = []*os.File{f}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd.Process.Pid
}

// threadOf waits for a thread of pid other than its main one.
func threadOf(t *testing.T, pid int) int {
	t.Helper()
	var tid int
	testenv.Eventually(t, 10*time.Second, fmt.Sprintf("a second thread in pid %d", pid), func() error {
		des, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return err
		}
		for _, de := range des {
			if id, err := strconv.Atoi(de.Name()); err == nil && id != pid {
				tid = id
				return nil
			}
		}
		return errors.New("only its main thread")
	})
	return tid
}

// TestCleanupSweepsDeadPools: a task's clean-up also removes the run dir
// of a pooled VM whose spare is gone, beside the task's: a spare killed as
// the last of a run has no later fill to sweep it.
func TestCleanupSweepsDeadPools(t *testing.T) {
	parent := filepath.Join(t.TempDir(), "ns")
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	pool := filepath.Join(parent, spare.PoolPrefix+strconv.Itoa(gone.Process.Pid))
	runDir := filepath.Join(parent, "t1")
	for _, d := range []string{pool, runDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := Cleanup(context.Background(), &state.Task{ID: "t1", RunDir: runDir}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{pool, runDir} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s after the clean-up: %v, want it gone", d, err)
		}
	}
}
