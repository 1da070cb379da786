package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/ctrdtest"
)

// TestContainerdRestart restarts containerd while a task runs: the new
// containerd must reconnect to the shim, list the task, and kill and
// delete it.
func TestContainerdRestart(t *testing.T) {
	c := stack(t, "")
	if _, err := run(c, []string{"-d"}, "t1", "sleep", "600"); err != nil {
		t.Fatal(err)
	}
	vmPID, _ := taskPID(t, c, "t1")
	restartContainerd(t, c)
	if pid, st := taskPID(t, c, "t1"); pid != vmPID || st != "RUNNING" {
		t.Fatalf("after the restart task t1 is %s with pid %d, want RUNNING with %d", st, pid, vmPID)
	}
	if _, err := c.Ctr("task", "kill", "--signal", "SIGKILL", "t1"); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, c, "t1", "STOPPED")
	if _, err := c.Ctr("task", "delete", "t1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Ctr("container", "rm", "t1"); err != nil {
		t.Fatal(err)
	}
	if processRuns(vmPID) {
		t.Fatalf("hypervisor %d still runs after delete", vmPID)
	}
}

// restartContainerd stops the harness's containerd and starts it again
// with the same command line and environment; the shims keep running.
func restartContainerd(t *testing.T, c *ctrdtest.Containerd) {
	t.Helper()
	pid := daemonPID(t, c, "containerd")
	argv := procStrings(t, pid, "cmdline")
	env := procStrings(t, pid, "environ")
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); processRuns(pid); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("containerd %d did not stop", pid)
		}
	}
	logf, err := os.Create(filepath.Join(c.Dir, "containerd-restarted.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	// This runs before the harness's own cleanup (registered earlier), so it
	// tears the harness down first, while this containerd still serves its
	// containers, and then stops this containerd if the teardown has not.
	t.Cleanup(func() {
		c.Cleanup()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := c.Ctr("version"); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("restarted containerd does not answer")
		}
	}
}

// daemonPID finds the harness's daemon called name by its command line,
// which names the harness's dir.
func daemonPID(t *testing.T, c *ctrdtest.Containerd, name string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(string(cmdline), "\x00")
		if filepath.Base(args[0]) == name && bytes.Contains(cmdline, []byte(c.Dir)) {
			return pid
		}
	}
	t.Fatalf("no %s of this harness runs", name)
	return 0
}

// procStrings reads a NUL-separated /proc file of pid.
func procStrings(t *testing.T, pid int, file string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
}
