package testimage

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// TestPauseExitsOnSignal: pause keeps running until SIGTERM or SIGINT,
// then exits 0.
func TestPauseExitsOnSignal(t *testing.T) {
	bin, err := BuildPause(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		cmd := exec.Command(bin)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		waitCatching(t, cmd.Process.Pid)
		// SIGCHLD must not end it.
		if err := cmd.Process.Signal(syscall.SIGCHLD); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		if err := <-exited; err != nil {
			t.Fatalf("pause after %v: %v, want exit 0", sig, err)
		}
	}
}

// TestPauseReaps runs pause as PID 1 of a new PID namespace and orphans a
// process there: pause must collect it when it exits.
func TestPauseReaps(t *testing.T) {
	testenv.RequireRoot(t)
	nsenter := testenv.LookPath(t, "nsenter")
	testenv.LookPath(t, DefaultBusybox)
	bin, err := BuildPause(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pause := exec.Command(bin)
	pause.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	if err := pause.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = pause.Process.Kill()
		_ = pause.Wait()
	})
	waitCatching(t, pause.Process.Pid)
	// sh backgrounds a sleep and exits: the sleep is re-parented to pause.
	orphan := exec.Command(nsenter, "--target", strconv.Itoa(pause.Process.Pid), "--pid", "--",
		DefaultBusybox, "sh", "-c", DefaultBusybox+" sleep 0.3 >/dev/null 2>&1 & exit 0")
	if out, err := orphan.CombinedOutput(); err != nil {
		t.Fatalf("orphan a process under pause: %v: %s", err, out)
	}
	if kids := children(t, pause.Process.Pid); kids == "" {
		t.Fatal("the orphaned sleep is not pause's child")
	}
	deadline := time.Now().Add(20 * time.Second)
	for children(t, pause.Process.Pid) != "" {
		if time.Now().After(deadline) {
			t.Fatalf("pause left its exited child %s unreaped", children(t, pause.Process.Pid))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// children lists pid's children, zombies included, across its threads.
func children(t *testing.T, pid int) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "children"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no /proc/%d/task/*/children: %v", pid, err)
	}
	var all []string
	for _, f := range files {
		b, _ := os.ReadFile(f)
		all = append(all, strings.Fields(string(b))...)
	}
	return strings.Join(all, " ")
}

// waitCatching waits until pid has its handlers for SIGINT, SIGTERM and
// SIGCHLD installed (SigCgt in /proc/PID/status): a signal sent earlier
// would get the default action.
func waitCatching(t *testing.T, pid int) {
	t.Helper()
	want := uint64(1)<<(syscall.SIGINT-1) | 1<<(syscall.SIGTERM-1) | 1<<(syscall.SIGCHLD-1)
	deadline := time.Now().Add(20 * time.Second)
	for {
		status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "SigCgt:"); ok {
				if caught, _ := strconv.ParseUint(strings.TrimSpace(v), 16, 64); caught&want == want {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pause %d never installed its signal handlers", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
